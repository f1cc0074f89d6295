"""Lowerings of alias (metadata) aten ops and of their copy forms made by the graph fuser.

view/reshape/flatten/squeeze/unsqueeze/permute/transpose/t/expand/expand_as, and
`prim::view_copy`-style kinds (`prim::<op>_copy`) which take the same arguments. Inside a
Fusion they are index arithmetic or host-side views (the segmenter decides); never a copy
unless eager would make one.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.tensor import TensorView
from .registry import METADATA, lowers


def _kinds(name: str) -> tuple:
    return (f"aten::{name}", f"prim::{name}_copy")


def _ints(values, what: str) -> list[int]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) for v in values):
        raise UnsupportedOpError(f"{what} must be a constant int list, got {values!r}")
    return [int(v) for v in values]


@lowers(*_kinds("view"), *_kinds("reshape"), op_class=METADATA, n_args=(2,), const_args=(1,))
def _view(x, shape):
    return B.reshape(x, _ints(shape, "view size"))


@lowers(*_kinds("flatten"), op_class=METADATA, n_args=(1, 2, 3), const_args=(1, 2))
def _flatten(x, start=0, end=-1):
    n = x.ndim
    if n == 0:
        return B.reshape(x, [1])
    s, e = start % n, end % n
    shape = [_extent_or_minus_one(d) for d in x.logical]
    known = shape[s:e + 1]
    merged = -1 if -1 in known else _prod(known)
    # axes outside the range keep their size: their own (symbolic) extent where not known
    outer = [d.extent if v == -1 else v for d, v in zip(x.logical, shape)]
    return B.reshape(x, outer[:s] + [merged] + outer[e + 1:])


def _extent_or_minus_one(d) -> int:
    """A logical axis' size when known (an expanded axis counts its expanded size), else -1."""
    ext = d.expanded_extent if d.expanded_extent is not None else d.extent
    return ext.value if ext.is_const else -1


def _prod(xs):
    p = 1
    for v in xs:
        p *= v
    return p


@lowers(*_kinds("squeeze"), op_class=METADATA, n_args=(1, 2), const_args=(1,))
def _squeeze(x, dims=None):
    if dims is None:
        dims = [i for i, d in enumerate(x.logical) if d.is_broadcast and d.expanded_extent is None]
    elif isinstance(dims, int):
        dims = [dims]
    # torch.squeeze ignores listed dims whose size is not 1.
    keep = [d for d in _ints(dims, "squeeze dims")
            if x.logical[d % max(x.ndim, 1)].is_broadcast]
    return B.squeeze(x, keep)


@lowers(*_kinds("unsqueeze"), op_class=METADATA, n_args=(2,), const_args=(1,))
def _unsqueeze(x, dim):
    return B.unsqueeze(x, int(dim))


@lowers(*_kinds("permute"), op_class=METADATA, n_args=(2,), const_args=(1,))
def _permute(x, dims):
    return B.permute(x, _ints(dims, "permute dims"))


@lowers(*_kinds("transpose"), op_class=METADATA, n_args=(3,), const_args=(1, 2))
def _transpose(x, d0, d1):
    return B.transpose(x, int(d0), int(d1))


@lowers(*_kinds("t"), op_class=METADATA, n_args=(1,))
def _t(x):
    return x if x.ndim < 2 else B.transpose(x, 0, 1)


@lowers(*_kinds("expand"), op_class=METADATA, n_args=(2, 3), const_args=(1, 2))
def _expand(x, sizes, implicit=False):
    sizes = _ints(sizes, "expand size")
    if len(sizes) > x.ndim:
        x = B.broadcast(x, [True] * (len(sizes) - x.ndim) + [False] * x.ndim)
    return B.expand(x, sizes)


@lowers(*_kinds("expand_as"), op_class=METADATA, n_args=(2,))
def _expand_as(x, other):
    if not isinstance(other, TensorView):
        raise UnsupportedOpError("aten::expand_as: other must be a tensor")
    if other.ndim > x.ndim:
        x = B.broadcast(x, [True] * (other.ndim - x.ndim) + [False] * x.ndim)
    sizes = [d.expanded_extent if d.expanded_extent is not None else d.extent for d in other.logical]
    return B.expand(x, [-1 if not xd.is_broadcast else s for xd, s in zip(x.logical, sizes)])
