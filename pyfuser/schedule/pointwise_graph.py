"""The compute graph of a pointwise Fusion, seen from the reference output's logical index.

A pointwise kernel computes every output element at one logical index `r = (r0, ..., rn-1)` of
the reference output. Walking the Fusion from the outputs back to the inputs, each tensor a value
is needed from gets an *index key*: one entry per logical axis of that tensor, each
  ("r", k)            the reference index r_k,
  0                   the constant 0 (a broadcast axis, a squeezed axis, a size-1 axis),
  ("vd", view, key, j) axis j of a view's input at the view output's index `key` (a row-major
                      re-linearisation; evaluated with div/mod at run time),
  ("ix", node)         the value of graph Node `node` (an integer index tensor read at the
                      consumer's index: an input's load or an iota, through metadata, or a
                      value computed from those; see index_leaves): an index_select /
                      embedding / gather operand's gathered axis
                      (pointwise_access.Access.gather; an index outside the axis stops the kernel),
  ("sh", c, off, minus, hi)  entry c plus the constant `off` (a slice's start, minus a pad's
                      leading size) minus the sizes of the axes (IterDomains) in `minus` (the
                      operands before a cat operand) plus the value of each `Plus` term in
                      `minus` (a slice's symbolic start) minus the value of each `Minus` term
                      (a pad's symbolic leading size), clamped to [0, size of axis hi - 1] when
                      hi is an axis: the index a pad or cat operand is read at, kept in bounds
                      where the consumer's index falls outside the operand (a load there is
                      skipped and its value discarded).
  ("st", c, s)        entry c times the constant step s > 1: a stepped slice's operand is read at
                      ("sh", ("st", c, s), start, ...), start + s * index.
  ("dv", c, s)        entry c, taken as 0 where negative, divided by the constant step s > 1: a
                      stepped pad's operand is read at ("sh", ("dv", ("sh", c, -lo, ...), s), 0,
                      (), d), (index - lo) / s clamped into its axis d (the pad node keeps only
                      the indices lo + s * i).
A key with an "st" or "dv" entry is not affine, nor shifted (shift_levels: None): its loads are
"general" accesses, addressed element by element (no vectors).
A Node is a (TensorView, key) pair, so a tensor read at two different indices (x + x.T) is loaded
twice and a tensor read at one index is computed once, whatever the number of its uses.

Invariants:
- `nodes` is in topological order (arguments before users).
- Every index a key names is within its tensor's bounds whenever the reference index is: slices
  shift into their input's range, pad and cat operands are clamped; their "pad" / "cat" nodes
  select the operand's value or the pad value by the consumer's index.
- A key made only of ("r", k) and 0 entries is *affine*: the access's offset is a sum over
  reference axes of index * stride, which is what lets the scheduler collapse and vectorize.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..ir import exprs as E
from ..ir.tensor import TensorView

METADATA_EXPRS = (E.BroadcastOp, E.ExpandOp, E.SqueezeOp, E.ViewOp, E.PermuteOp)
COMPUTE_EXPRS = (E.ElementwiseOp, E.CastOp, E.SetOp, E.FullOp, E.PhiloxUniformOp, E.IotaOp)
# reads of an input at positions another input holds (an "ix" key entry)
GATHER_EXPRS = (E.IndexSelectOp, E.GatherOp)
# index-remapping exprs (nvFuser's "resize"): each output element reads its input at a shifted index
RESIZE_EXPRS = (E.SliceOp, E.PadOp, E.CatOp)
ALLOWED_EXPRS = METADATA_EXPRS + COMPUTE_EXPRS + RESIZE_EXPRS + GATHER_EXPRS + (E.ScalarCast,)
# node kinds whose value depends on the element's own index (not only on their arguments): the
# kernel needs per-axis indices, and vectors only where each vector lies on one side of their
# bounds (pointwise_resize.index_vec_ok)
INDEX_KINDS = ("pad", "cat", "iota")


@dataclass(eq=False)
class Node:
    kind: str                 # "load", "op", "cast", "set", "full", "rng" (random numbers drawn
                              # at the node's index), "alias" (metadata: same value), "pad" (the
                              # operand or the pad value, by index), "cat" (one operand, by index),
                              # "iota" (start + index * step)
    tv: TensorView
    key: tuple
    expr: object = None
    args: list = field(default_factory=list)   # Node or Scalar, in the expr's operand order

    @property
    def affine(self) -> bool:
        return is_affine(self.key)


def is_affine(key) -> bool:
    return all(c == 0 or (isinstance(c, tuple) and c[0] == "r") for c in key)


def key_axes(c) -> set:
    """The reference axes a key entry's index varies along (through shifts and views)."""
    if not isinstance(c, tuple):
        return set()
    if c[0] == "r":
        return {c[1]}
    if c[0] in ("sh", "st", "dv"):
        return key_axes(c[1])
    if c[0] == "ix":                                     # the index's own key
        return set().union(*(key_axes(x) for x in c[1].key))
    return set().union(*(key_axes(x) for x in c[2]))    # "vd": the view output's key


# node kinds an index's value may be computed through (index_leaves)
INDEX_CHAIN_KINDS = ("alias", "op", "cast", "set", "full")


def index_leaves(node):
    """The nodes an index's value is computed from: the "load"s (an input's, or a table's at
    another index: a lookup's index may itself be looked up, BERT's token types) and "iota"s
    (positions computed from the element's index) it reaches through "alias" nodes (metadata,
    and lookups, whose value is their table's load) and "op" / "cast" / "set" / "full" nodes
    (a value computed from those: GPT-2's positions `arange(seq) + past`, a pooling window's
    flat position `where(in_bounds, h * W + w, 0)`); None when the chain holds any other node
    (random numbers, pads, cats), which a kernel cannot compute before its loads. Every node
    of the chain is a function of the element's index and of values loaded before the
    gathered load (the graph visits an index before the input it indexes)."""
    leaves, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.kind in ("load", "iota"):
            leaves.append(n)
        elif n.kind in INDEX_CHAIN_KINDS:
            stack.extend(a for a in n.args if isinstance(a, Node))
        else:
            return None
    return leaves


def index_value_node(node):
    """The node whose value index chain node `node` has: through "alias" nodes (metadata, and
    lookups, whose value is their table's load) and "set" nodes (copies)."""
    while node.kind in ("alias", "set"):
        node = node.args[0]
    return node


def index_axes_of(inode) -> set:
    """The reference axes the value of index node `inode` changes along: those its leaves' keys
    read (index_leaves: the inputs' loads, the iotas, the looked-up tables' loads)."""
    return set().union(*(key_axes(c) for n in index_leaves(inode) for c in n.key))


def gathered(key):
    """(j, index node) when entry j of `key` is the one "ix" entry and every other entry is 0 or
    a distinct ("r", k): the access's offset is an affine one plus the index's value times the
    stride of axis j; else None."""
    ix = [j for j, c in enumerate(key) if isinstance(c, tuple) and c[0] == "ix"]
    if len(ix) != 1:
        return None
    rest = [c for j, c in enumerate(key) if j != ix[0] and c != 0]
    if not all(isinstance(c, tuple) and c[0] == "r" for c in rest) or \
            len({c[1] for c in rest}) != len(rest):
        return None
    return ix[0], key[ix[0]][1]


def shift_levels(c):
    """(k, levels) when key entry c reads reference axis k through "sh" entries only: per level,
    innermost first, (off, minus, hi): that level's index is r_k + off - the sizes of the axes
    in `minus` (the shifts so far, summed), clamped into axis `hi`'s size when hi is not None.
    ("r", k) is (k, []); any other entry (a view's "vd") is None."""
    if isinstance(c, tuple) and c[0] == "r":
        return c[1], []
    if not (isinstance(c, tuple) and c[0] == "sh"):
        return None
    inner = shift_levels(c[1])
    if inner is None:
        return None
    _, _, off, minus, hi = c
    k, levels = inner
    before_off, before_minus = (levels[-1][0], levels[-1][1]) if levels else (0, ())
    return k, levels + [(before_off + int(off), tuple(before_minus) + tuple(minus), hi)]


def constant_shift(c):
    """(k, off, minus) when key entry c reads reference axis k at r_k + off - sum(sizes of
    minus) (shift_levels' outermost level), else None."""
    lv = shift_levels(c)
    if lv is None:
        return None
    k, levels = lv
    return (k, levels[-1][0], levels[-1][1]) if levels else (k, 0, ())


def shift_affine(key):
    """{axis j: (k, off, minus)} when every entry of `key` is 0 or reads a distinct reference
    axis k at a shift (constant_shift), else None: such an access's offset is an affine one's
    plus off - sum(minus sizes) times the axis' stride."""
    out, seen = {}, set()
    for j, c in enumerate(key):
        if c == 0:
            continue
        ks = constant_shift(c)
        if ks is None or ks[0] in seen:
            return None
        seen.add(ks[0])
        out[j] = ks
    return out


@dataclass(frozen=True)
class Plus:
    """A term of an "sh" entry's `minus` that is added, not subtracted: the value of an Int
    Scalar the host computes (a slice's start under dynamic shapes), a kernel parameter."""
    scalar: object


@dataclass(frozen=True)
class Minus:
    """A term of an "sh" entry's `minus` subtracted as the value of an Int Scalar the host
    computes (a pad's symbolic leading size under dynamic shapes), a kernel parameter."""
    scalar: object


def is_padded(pair, step: int = 1) -> bool:
    """Whether a pad's (lo, hi) with its step pads at all: a symbolic size (a Scalar) counts as
    padding, so does a step > 1 (the elements between the operand's)."""
    return step != 1 or any(not isinstance(p, int) or p != 0 for p in pair)


def pad_shift(c, lo, d, step: int = 1):
    """The key entry of a pad's operand read at the pad's index entry c, lo (an int or a
    symbolic Int Scalar) before it along an axis whose operand axis is d (clamped into it);
    with a step > 1, at (index - lo) / step."""
    if step != 1:
        base = shifted(c, -lo) if isinstance(lo, int) else shifted(c, 0, (Minus(lo),))
        return ("sh", ("dv", base, step), 0, (), d)
    if isinstance(lo, int):
        return shifted(c, -lo, (), d)
    return shifted(c, 0, (Minus(lo),), d)


def stepped(c, step: int):
    """The key entry of index entry c times a constant step (a stepped slice's operand)."""
    return c if step == 1 or c == 0 else ("st", c, step)


def shifted(c, off: int, minus=(), hi=None):
    """The key entry of index entry c moved as the module docstring's "sh" entry says."""
    return c if off == 0 and not minus and hi is None else ("sh", c, int(off), tuple(minus), hi)


def _sliced(c):
    """Key entry c read through a slice starting at 0: the same index, except that a view's
    "vd" entry becomes a shift by 0. A load keyed by "vd" entries alone is read as laid out like
    the view's input (pointwise_access._linear_view: its row-major linear index), which a
    sliced tensor is not: its rows are longer (`(x * 2)[:, :-1].reshape(-1)` read x's first
    elements as if contiguous, a wrong result; the same through a `_ones_as_broadcasts` view)."""
    return ("sh", c, 0, (), None) if isinstance(c, tuple) and c[0] == "vd" else c


def _zero_broadcasts(tv: TensorView, key: list) -> tuple:
    out = []
    for d, c in zip(tv.logical, key):
        out.append(0 if d.is_size_one_broadcast else c)
    return tuple(out)


def producer_key(e, key: tuple, inp: TensorView) -> tuple:
    """The index key of `inp` (an input of expr e) when e's output is read at `key`."""
    if isinstance(e, (E.ElementwiseOp, E.CastOp, E.SetOp, E.ExpandOp)):
        pk = list(key)
    elif isinstance(e, E.BroadcastOp):
        pk = [c for c, f in zip(key, e.flags) if not f]
    elif isinstance(e, E.SqueezeOp):
        pk, src = [], iter(key)
        for i in range(inp.ndim):
            pk.append(0 if i in e.dims else next(src))
    elif isinstance(e, E.PermuteOp):
        pk = [None] * len(key)
        for i, d in enumerate(e.dims):
            pk[d] = key[i]
    elif isinstance(e, E.SliceOp):
        pk = [_sliced(c) if isinstance(s, int) and s == 0 and st == 1 else
              shifted(stepped(c, st), s) if isinstance(s, int) else
              shifted(stepped(c, st), 0, (Plus(s),)) for c, s, st in zip(key, e.starts, e.steps)]
    elif isinstance(e, E.ViewOp):
        if all(c == 0 for c in key):
            pk = [0] * inp.ndim
        else:
            pk = [("vd", e, key, j) for j in range(inp.ndim)]
    else:
        raise AssertionError(f"no index mapping through {type(e).__name__}")
    return _zero_broadcasts(inp, pk)


def resize_operands(e, key: tuple) -> tuple:
    """(node kind, [(operand, its key)], extra args) of a slice, pad or cat read at `key`: a
    slice is an "alias" of its input read at the shifted key (its bound scalars are the
    host's), a pad a "pad" node of its operand (clamped into it) and its value, a cat a "cat"
    node of its non-empty operands, each read at the key shifted by the operands before it and
    clamped into its own range. The pointwise and reduction graphs both build them so."""
    if isinstance(e, E.SliceOp):
        x = e.inputs[0]
        return "alias", [(x, producer_key(e, key, x))], []
    if isinstance(e, E.PadOp):
        x = e.inputs[0]
        pk = [pad_shift(c, pair[0], d, st) if is_padded(pair, st) else c
              for c, pair, d, st in zip(key, e.pads, x.logical, e.steps)]
        return "pad", [(x, _zero_broadcasts(x, pk))], [e.inputs[1]]
    operands, before = [], []
    for x in e.inputs:
        d = x.logical[e.dim]
        # an empty operand adds nothing; when all are (a cat of sizes 0, no element to
        # compute), the last stands for them, its loads never reached
        if d.known_size() != 0 or (x is e.inputs[-1] and not operands):
            pk = list(key)
            pk[e.dim] = shifted(key[e.dim], 0, before, d)
            operands.append((x, _zero_broadcasts(x, pk)))
            before = before + [d]
    return "cat", operands, []


class Graph:
    def __init__(self, fusion, ref_key: tuple):
        self.fusion = fusion
        self.nodes: list[Node] = []
        self.loads: list[Node] = []
        self.rngs: list[Node] = []
        self._memo: dict = {}
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 20000))
        try:
            self.outputs = [self._visit(o, _zero_broadcasts(o, list(ref_key))) for o in fusion.outputs]
        finally:
            sys.setrecursionlimit(old)

    def _visit(self, tv: TensorView, key: tuple) -> Node:
        mk = (id(tv), key)
        hit = self._memo.get(mk)
        if hit is not None:
            return hit
        e = tv.definition
        if e is None:
            node = Node("load", tv, key)
            self.loads.append(node)
        elif isinstance(e, E.FullOp):
            node = Node("full", tv, key, e, [e.inputs[0]])
        elif isinstance(e, E.PhiloxUniformOp):
            node = Node("rng", tv, key, e, [])
            self.rngs.append(node)
        elif isinstance(e, E.IotaOp):
            node = Node("iota", tv, key, e, list(e.inputs[1:]))
        elif isinstance(e, RESIZE_EXPRS):
            kind, operands, extra = resize_operands(e, key)
            node = Node(kind, tv, key, e, [self._visit(x, k) for x, k in operands] + extra)
        elif isinstance(e, E.IndexSelectOp):
            # out's axes dim .. dim + r - 1 are the index's (one size-1 axis for a 0-dim index)
            x, index, d = e.inputs[0], e.inputs[1], e.dim
            r = max(index.ndim, 1)
            inode = self._visit(index, _zero_broadcasts(index, list(key[d:d + index.ndim])))
            xk = list(key[:d]) + [("ix", inode)] + list(key[d + r:])
            node = Node("alias", tv, key, e, [self._visit(x, _zero_broadcasts(x, xk))])
        elif isinstance(e, E.GatherOp):
            # torch.gather: out's index is the index tensor's; axis dim of the input at its value
            x, index = e.inputs[0], e.inputs[1]
            inode = self._visit(index, _zero_broadcasts(index, list(key)))
            xk = list(key)
            xk[e.dim] = ("ix", inode)
            node = Node("alias", tv, key, e, [self._visit(x, _zero_broadcasts(x, xk))])
        else:
            args = []
            for v in e.inputs:
                if isinstance(v, TensorView):
                    args.append(self._visit(v, producer_key(e, key, v)))
                else:
                    args.append(v)
            kind = ("op" if isinstance(e, E.ElementwiseOp) else "cast" if isinstance(e, E.CastOp)
                    else "set" if isinstance(e, E.SetOp) else "alias")
            node = Node(kind, tv, key, e, args)
        self._memo[mk] = node
        self.nodes.append(node)
        return node


def is_alias_of_input(tv: TensorView) -> bool:
    """True when `tv` is a fusion input or reached from one through metadata exprs only."""
    while tv.definition is not None:
        if not isinstance(tv.definition, METADATA_EXPRS):
            return False
        tv = tv.definition.inputs[0]
    return True
