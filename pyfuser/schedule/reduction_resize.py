"""Slices, pads and cats inside reduction-family kernels: what the reduction graph takes, and
where vectors and staged loads may go.

reduction_graph builds pad / cat nodes and shifted keys as pointwise_graph does
(`resize_operands`, "sh" key entries), so a GPT-2 backward's `cat([dq, dk, dv], -1)` that the
bias gradient sums over the tokens, and that the kernel also writes, is one reduction kernel
reading dq, dk and dv. What the reduction lowering addresses (`unsupported` says why not):
- a pad's or cat's bound, and a load clamped into its operand, along KEPT axes only: the
  choice of operand and the load's guard are then one test a row (inner kernels) or column
  vector (outer kernels) made with indices the kernel has before its passes; a bound along the
  reduced axes would put a guard on every step of a pass (held, staged and unguarded `full`
  rows assume none);
- slices along any axis (a shift without a bound: an offset, no guard);
- every load through a shift read at distinct reference axes (pointwise_graph.shift_affine:
  an affine offset plus the shifts), no stepped slice or pad ("st" / "dv": element by element
  addressing), no iota or random numbers read at a shifted index, no lookup index read
  through a pad or cat.
`slice_key` marks the sliced axes of a slice's operand with a zero shift, so that the graph's
extent checks (which a sliced axis fails: the operand is longer) skip exactly those entries.

Invariants: everything here is a function of the Fusion's structure (compile time, no sizes)
except `vector_ok`, which reads sizes only through `size_of` (signature facts), as
pointwise_resize.index_vec_ok does. Nothing here imports codegen/.
"""
from __future__ import annotations

from .pointwise_graph import key_axes, shift_affine
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


def _shifted(key) -> bool:
    return any(isinstance(c, tuple) and c[0] in SHIFT_KINDS for c in key)


def _stepped(c) -> bool:
    if not isinstance(c, tuple):
        return False
    return c[0] in ("st", "dv") or (c[0] == "sh" and _stepped(c[1]))


def unsupported(g) -> str | None:
    """Why the reduction kernels cannot address the resize ops of ReductionGraph g (the module
    docstring's rules), or None."""
    R = set(g.R)
    if not any(n.kind in ("pad", "cat") or _shifted(n.key) for n in g.nodes):
        return None
    bounded = set()
    for n in g.nodes:
        if n.kind == "pad":
            bounded |= {k for c, (lo, hi), st in zip(n.key, n.expr.pads, n.expr.steps)
                        if st != 1 or not (isinstance(lo, int) and lo == 0 and
                                           isinstance(hi, int) and hi == 0)
                        for k in key_axes(c)}
        elif n.kind == "cat":
            bounded |= key_axes(n.key[n.expr.dim])
    for n in g.nodes:
        for c in n.key:
            if _stepped(c):
                return f"{n.tv.name} is read through a stepped slice or pad"
            if isinstance(c, tuple) and c[0] == "sh" and c[4] is not None:
                bounded |= key_axes(c)
        if n.kind in ("iota", "rng") and _shifted(n.key):
            return f"{n.tv.name} ({n.kind}) is read at a shifted index (a slice, pad or cat)"
        if n.kind == "load" and _shifted(n.key) and shift_affine(n.key) is None:
            return f"{n.tv.name} is read through a slice, pad or cat at no affine offset"
        for c in n.key:
            if isinstance(c, tuple) and c[0] == "ix" and guarded(c[1].key):
                return f"the lookup index {c[1].tv.name} is read through a pad or cat"
    along = sorted(bounded & R)
    if along:
        return (f"a pad or cat along the reduced axes {along} (the reduction kernels take "
                f"pads and cats along kept axes, slices along any)")
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
