"""Lowerings of alias (metadata) aten ops and of their copy forms made by the graph fuser.

alias/view/reshape/flatten/squeeze/unsqueeze/permute/transpose/t/expand/expand_as, and
`prim::view_copy`-style kinds (`prim::<op>_copy`) which take the same arguments. Inside a
Fusion they are index arithmetic or host-side views (the segmenter decides); never a copy
unless eager would make one.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.tensor import TensorView
from .registry import METADATA, lowers


def _kinds(name: str) -> tuple:
    return (f"aten::{name}", f"prim::{name}_copy")


def _ints(values, what: str) -> list[int]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) for v in values):
        raise UnsupportedOpError(f"{what} must be a constant int list, got {values!r}")
    return [int(v) for v in values]


def _sizes(values, what: str) -> list:
    """A size list: constant ints, or symbolic Int Scalars of the fusion (an FX graph's SymInt
    sizes under dynamic shapes, lowered to extents or host-computed scalars)."""
    if isinstance(values, (list, tuple)) and all(
            isinstance(v, Scalar) and v.dtype.is_integral for v in values if not isinstance(v, int)):
        return [v if isinstance(v, Scalar) else int(v) for v in values]
    raise UnsupportedOpError(f"{what} must be a list of ints or symbolic sizes, got {values!r}")


def sizes_of(x: TensorView) -> list:
    """x's sizes as reshape and the gradients' lowerings take them: constant ints, or symbolic
    Int extents (an expanded axis at its expanded size: its `extent` is 1)."""
    return [int(e.value) if e.is_const else e for e in (d.full_extent for d in x.logical)]


def row_major_position(coords: list, sizes: list) -> tuple:
    """(position, count): sum(coords[a] * stride_a) over the axes of a row-major tensor of
    `sizes` (ints or symbolic Scalars), and its element count (an int where every size is
    one). `coords` are Int tensors (or Scalars) that broadcast together."""
    pos, count = None, 1
    for c, n in zip(reversed(coords), reversed(sizes)):
        if isinstance(count, int) and count == 1:
            term, count = c, n
        else:
            term = B.elementwise("mul", c, count)
            known = isinstance(count, int) and isinstance(n, int)
            count = count * n if known else B.elementwise("mul", n, count)
        pos = term if pos is None else B.elementwise("add", term, pos)
    return pos, count


@lowers("aten::alias", op_class=METADATA, n_args=(1,))
def _alias(x):
    """The same values (a view of all of x: autograd's alias of a saved tensor in a backward
    graph); a graph that returns it keeps eager's view (fx/support.py)."""
    return x


@lowers(*_kinds("view"), *_kinds("reshape"), "aten::_unsafe_view", op_class=METADATA,
        n_args=(2,), const_args=(1,))
def _view(x, shape):
    return B.reshape(x, _sizes(shape, "view size"))


@lowers(*_kinds("flatten"), op_class=METADATA, n_args=(1, 2, 3), const_args=(1, 2))
def _flatten(x, start=0, end=-1):
    n = x.ndim
    if n == 0:
        return B.reshape(x, [1])
    s, e = start % n, end % n
    sizes = [d.known_size() for d in x.logical]
    shape = [-1 if k is None else k for k in sizes]       # -1: known only at run time
    known = shape[s:e + 1]
    merged = -1 if -1 in known else _prod(known)
    # axes outside the range keep their size: their own (symbolic) extent where not known
    outer = [d.extent if v == -1 else v for d, v in zip(x.logical, shape)]
    return B.reshape(x, outer[:s] + [merged] + outer[e + 1:])


def _prod(xs):
    p = 1
    for v in xs:
        p *= v
    return p


@lowers(*_kinds("squeeze"), op_class=METADATA, n_args=(1, 2), const_args=(1,))
def _squeeze(x, dims=None):
    candidates = range(x.ndim) if dims is None else \
        [d % max(x.ndim, 1) for d in ([dims] if isinstance(dims, int) else dims)]
    for i in candidates:
        d = x.logical[i]
        if _may_be_one(d) or (d.expanded_extent is not None and
                              _extent_may_be_one(d.expanded_extent)):
            raise UnsupportedOpError(
                f"squeeze: axis {i} has a size known only at run time (a view's -1, an "
                "expand's), which may be 1 (eager would squeeze it)")
    if dims is None:
        dims = list(candidates)
    elif isinstance(dims, int):
        dims = [dims]
    # torch.squeeze ignores listed dims whose size is not 1: an expanded broadcast axis has its
    # expanded size (fuzz seed 729347: `expand(x, [4])` of a [1] input, squeezed, lost its axis)
    keep = [d for d in _ints(dims, "squeeze dims")
            if x.logical[d % max(x.ndim, 1)].known_size() == 1]
    return B.squeeze(x, keep)


def _may_be_one(d) -> bool:
    """A full axis whose extent is neither constant nor a fusion input's: a group's inputs are
    specialised on their size-1 axes (those are broadcast axes), so an input's symbolic extent
    is never 1, but the extent a view infers (-1), or a slice's, pad's or cat's, may be."""
    return not d.is_broadcast and _extent_may_be_one(d.extent)


def _extent_may_be_one(extent) -> bool:
    """An extent neither constant nor a fusion input's axis' (see `_may_be_one`)."""
    if extent.is_const:
        return False
    from ...ir.fusion import Fusion
    inputs = Fusion.current().inputs
    return not any(extent is a.extent for t in inputs if isinstance(t, TensorView)
                   for a in t.logical)


@lowers(*_kinds("unsqueeze"), op_class=METADATA, n_args=(2,), const_args=(1,))
def _unsqueeze(x, dim):
    return B.unsqueeze(x, int(dim))


@lowers(*_kinds("permute"), op_class=METADATA, n_args=(2,), const_args=(1,))
def _permute(x, dims):
    dims = _ints(dims, "permute dims")
    return x if _moves_only_size_one(x, dims) else B.permute(x, dims)


@lowers(*_kinds("transpose"), op_class=METADATA, n_args=(3,), const_args=(1, 2))
def _transpose(x, d0, d1):
    dims = list(range(x.ndim))
    if x.ndim:
        dims[int(d0) % x.ndim], dims[int(d1) % x.ndim] = dims[int(d1) % x.ndim], dims[int(d0) % x.ndim]
    return x if _moves_only_size_one(x, dims) else B.transpose(x, int(d0), int(d1))


@lowers(*_kinds("t"), op_class=METADATA, n_args=(1,))
def _t(x):
    return x if x.ndim < 2 or _moves_only_size_one(x, [1, 0]) else B.transpose(x, 0, 1)


def _moves_only_size_one(x, dims) -> bool:
    """A permutation that moves only size-1 (broadcast) axes gives the same shape and elements:
    no op (a copy of it would otherwise look like a transpose of an all-size-1 tensor)."""
    if len(dims) != x.ndim:
        return False
    return all(i == d % x.ndim or (x.logical[i].is_broadcast and
                                   x.logical[i].expanded_extent is None)
               for i, d in enumerate(dims))


@lowers(*_kinds("expand"), op_class=METADATA, n_args=(2, 3), const_args=(1, 2))
def _expand(x, sizes, implicit=False):
    sizes = _sizes(sizes, "expand size")
    if len(sizes) > x.ndim:
        x = B.broadcast(x, [True] * (len(sizes) - x.ndim) + [False] * x.ndim)
    # a symbolic size of a full axis is that axis' own size (eager checked it when the graph
    # was traced): kept as it is, unless the axis may be 1 at run time (below)
    _refuse_expanding_maybe_one(x, sizes)
    sizes = [-1 if isinstance(s, Scalar) and not d.is_broadcast else s
             for s, d in zip(sizes, x.logical)]
    return B.expand(x, sizes)


def _refuse_expanding_maybe_one(x, sizes) -> None:
    """A symbolic size other than a full axis' own extent, where that extent may be 1 at run
    time (a slice's, pad's or cat's size, a view's -1): eager may have expanded a size-1 axis
    there (the backward of a slice of a [1, 1] sum, `expand(pad(x[:, :0], [0, 1]), [1, n])`),
    which a fusion cannot take as the axis kept (it gave [1, 1] for [1, n]). Left to eager."""
    for i, (s, d) in enumerate(zip(sizes, x.logical)):
        if isinstance(s, Scalar) and not s.is_const and s is not d.extent and _may_be_one(d):
            raise UnsupportedOpError(
                f"expand: axis {i} has a size known only at run time (a slice's, pad's, cat's or "
                "view's), which may be 1 (eager would expand it)")


@lowers(*_kinds("expand_as"), op_class=METADATA, n_args=(2,))
def _expand_as(x, other):
    if not isinstance(other, TensorView):
        raise UnsupportedOpError("aten::expand_as: other must be a tensor")
    if other.ndim > x.ndim:
        x = B.broadcast(x, [True] * (other.ndim - x.ndim) + [False] * x.ndim)
    sizes = [d.full_extent for d in other.logical]
    _refuse_expanding_maybe_one(x, sizes)
    return B.expand(x, [-1 if not xd.is_broadcast else s for xd, s in zip(x.logical, sizes)])
