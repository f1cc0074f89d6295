"""Slices, pads and cats inside reduction-family kernels: what the reduction graph takes, and
where vectors and staged loads may go.

reduction_graph builds pad / cat nodes and shifted keys as pointwise_graph does
(`resize_operands`, "sh" key entries), so a GPT-2 backward's `cat([dq, dk, dv], -1)` that the
bias gradient sums over the tokens, and that the kernel also writes, is one reduction kernel
reading dq, dk and dv. The reduction lowering tests a pad's or cat's bound, and guards a load
clamped into its operand, with the indices of the position's first lane (ax<k> Lets): along
kept axes once a row (inner kernels) or column vector (outer kernels), along reduced axes in
every step. What it cannot address (`unsupported` says why, and the segmenter cuts as before):
- a stepped slice or pad ("st" / "dv" keys: element by element addressing);
- a load through a shift at no affine offset (pointwise_graph.shift_affine: each axis read
  at a distinct reference axis, no lookup index beside a shift);
- random numbers read at a shifted index (an iota is read there: start + shifted index *
  step, the shift over one reference axis), a lookup index read through a pad or cat.
Vectors go along the innermost group only where every lane of a vector lies on one side of
each bound and the shifts move whole vectors (`vector_ok`); loads under a bounds test are never
staged in shared memory (reduction_heuristics.stageable: every async copy a thread issues
lands before any is read). `slice_key` marks the sliced axes of a slice's operand with a zero
shift, so that the graph's extent checks (which a sliced axis fails: the operand is longer)
skip exactly those entries and the axis' level (full or per row) still sees it.

Invariants: everything here is a function of the Fusion's structure (compile time, no sizes)
except `vector_ok`, which reads sizes only through `size_of` (signature facts), as
pointwise_resize.index_vec_ok does. Nothing here imports codegen/.
"""
from __future__ import annotations

from .pointwise_graph import shift_affine
from .pointwise_resize import bounded_axes, index_vec_ok

SHIFT_KINDS = ("sh", "st", "dv")


def slice_key(e, pk: tuple, same_extent) -> tuple:
    """The key `pk` of slice e's operand (pointwise_graph.producer_key's) with every sliced
    axis that it reads unshifted (one starting at 0 whose extent may differ from the
    operand's: `same_extent(out_axis, in_axis)` False) read through a zero shift."""
    x, out = e.inputs[0], e.outputs[0]
    out_key = list(pk)
    for j, c in enumerate(pk):
        if c == 0 or (isinstance(c, tuple) and c[0] in SHIFT_KINDS):
            continue
        whole = isinstance(e.starts[j], int) and e.starts[j] == 0 and e.steps[j] == 1 and \
            same_extent(out.logical[j], x.logical[j])
        if not whole:
            out_key[j] = ("sh", c, 0, (), None)
    return tuple(out_key)


def guarded(key) -> bool:
    """Whether a key reads through a clamped shift (a pad's or cat's operand): its load runs
    under a bounds test."""
    def walk(c):
        if not isinstance(c, tuple):
            return False
        if c[0] == "sh":
            return c[4] is not None or walk(c[1])
        if c[0] in ("st", "dv"):
            return walk(c[1])
        if c[0] == "ix":
            return any(walk(x) for x in c[1].key)
        return False
    return any(walk(c) for c in key)


def _clamped(c) -> bool:
    """Whether key entry c is a shift clamped into an operand's range (a pad's or cat's operand
    along that axis: its load runs under the range's bounds test)."""
    return isinstance(c, tuple) and c[0] == "sh" and c[4] is not None


def shift_axis(c):
    """The reference axis k of a key entry that is a chain of "sh" shifts over ("r", k), else
    None (an iota read there is `start + (shifted index) * step`)."""
    while isinstance(c, tuple) and c[0] == "sh":
        c = c[1]
    return c[1] if isinstance(c, tuple) and c[0] == "r" else None


def _shifted(key) -> bool:
    return any(isinstance(c, tuple) and c[0] in SHIFT_KINDS for c in key)


def _stepped(c) -> bool:
    if not isinstance(c, tuple):
        return False
    return c[0] in ("st", "dv") or (c[0] == "sh" and _stepped(c[1]))


def unsupported(g) -> str | None:
    """Why the reduction kernels cannot address the resize ops of ReductionGraph g (the module
    docstring's rules), or None."""
    if not resized(g):
        return None
    for n in g.nodes:
        if any(_stepped(c) for c in n.key):
            return f"{n.tv.name} is read through a stepped slice or pad"
        if n.kind == "rng" and _shifted(n.key) or \
                n.kind == "iota" and _shifted(n.key) and shift_axis(n.key[0]) is None:
            return f"{n.tv.name} ({n.kind}) is read at a shifted index (a slice, pad or cat)"
        if n.kind == "load" and _shifted(n.key) and shift_affine(n.key) is None:
            return f"{n.tv.name} is read through a slice, pad or cat at no affine offset"
        for c in n.key:
            if isinstance(c, tuple) and c[0] == "ix" and guarded(c[1].key):
                return f"the lookup index {c[1].tv.name} is read through a pad or cat"
    return None


def apart(g) -> set:
    """Reference axes a pad, cat or shifted load bounds or shifts along: each stays a group of
    its own (reduction._collapse), as in the pointwise scheduler."""
    return bounded_axes(g)


def resized(g) -> bool:
    return any(n.kind in ("pad", "cat") or _shifted(n.key) for n in g.nodes)


def vector_ok(g, accesses, groups, vec: int, size_of) -> bool:
    """Whether vectors of `vec` lanes along the innermost group keep every lane on one side of
    each bound of a pad, cat or shifted load, and every shifted vector load aligned: where a
    bound or shift lies along the innermost group, pointwise_resize.index_vec_ok (that group
    one axis, every shift and bounding size along it a multiple of vec); along any other axis,
    the access's stride there a multiple of vec (a shift moves it by whole vectors)."""
    if not resized(g) or not groups:
        return True
    inner = set(groups[-1])
    if apart(g) & inner and not index_vec_ok(g, accesses, groups, vec, size_of):
        return False
    for a in accesses:
        for k, (off, minus) in a.shifts.items():
            if k not in inner and (off or minus) and a.eff.get(k, (0, 0))[0] % vec:
                return False
    return True


def shared_buffers(g, accesses) -> dict:
    """{id(load node): id(the load node whose register buffer it shares)}: the operands of a
    cat that are full-size loads of one dtype and access mode, read by nothing but the cat,
    each under the bounds test of its range along the cat's axis (not an operand whose cat
    axis is a size-1 broadcast: that one is loaded everywhere; and so none is staged in
    shared memory, `stageable`).
    Their loads are guarded by disjoint ranges of the cat's axis and the cat covers its axis,
    so exactly one of them fills the buffer at every position the cat is computed at, and the
    cat's value is the buffer's (GPT-2's cat of three operands: one buffer where three had
    taken 134 registers a thread against a plain sum's 64, sm_90, ptxas)."""
    users: dict = {}
    for n in g.nodes:
        for a in n.args:
            users.setdefault(id(a), []).append(n)
    mode = {id(a.node): (a.mode, a.tv.dtype) for a in accesses if not a.is_store}
    out = {}
    for n in g.nodes:
        if n.kind != "cat" or len(n.args) < 2:
            continue
        ops, d = n.args, n.expr.dim
        if all(a.kind == "load" and g.level[id(a)] == "full" and _clamped(a.key[d]) and
               id(a) in mode and
               mode[id(a)] == mode[id(ops[0])] and users.get(id(a)) == [n] and
               id(a) not in out for a in ops):
            out.update({id(a): id(ops[0]) for a in ops[1:]})
    return out

