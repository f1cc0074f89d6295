"""Lowerings of argmax and argmin, and the positions max.dim / min.dim return with their
values (aten_reduction.py): two reductions of one kernel, the extreme m over the reduced axes
(NaN-propagating), then the least row-major position where x equals m or is NaN.

Eager's rules, kept exactly: the first of equal extremes wins, -0.0 equals 0.0, a row holding
a NaN gives its first NaN (m is NaN there and nothing else equals it); dim=None counts
positions row-major over every axis; an expanded axis at its expanded size. A bool or 0-dim
input stays eager's.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.tensor import TensorView
from .aten_shape import row_major_position, sizes_of
from .registry import REDUCTION, lowers

ew = B.elementwise


def _arg_extreme(op: str, x, dim=None, keepdim=False):
    """argmax / argmin as two reductions: the row's extreme m (NaN-propagating), then the least
    position where x equals m or is NaN (a row holding a NaN has m NaN and no other element
    equal to it, so its first NaN wins, as in eager; elsewhere the first of equal extremes,
    -0.0 equal to 0.0). The second reads the first's result broadcast back over the row: one
    persistent kernel. dim None: over every axis, positions counted row-major."""
    if not isinstance(x, TensorView) or x.ndim == 0 or \
            not (x.dtype.is_floating or x.dtype.is_integral):
        raise UnsupportedOpError(f"arg{op}: the input must be a real, non-bool tensor of rank >= 1")
    if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)):
        raise UnsupportedOpError(f"arg{op}: dim must be a constant, got {dim!r}")
    if dim is None:                          # every axis: positions counted row-major
        dims = list(range(x.ndim))
    elif not -x.ndim <= dim < x.ndim:
        raise UnsupportedOpError(f"arg{op}: dim {dim} out of range")
    else:
        dims = [dim % x.ndim]
    return arg_positions(x, dims, B.reduction(op, x, dims, True), bool(keepdim))


def arg_positions(x, dims, m, keepdim: bool):
    """The least row-major position over `dims` where x equals m (x's extreme over them, kept
    as size-1 axes) or is NaN (_arg_extreme)."""
    coords = []
    for d in dims:
        p = B.iota(x.logical[d].full_extent)   # an expanded axis at its expanded size
        coords.append(B.broadcast(p, [i != d for i in range(x.ndim)]) if x.ndim > 1 else p)
    sizes = sizes_of(x)
    pos, count = row_major_position(coords, [sizes[d] for d in dims])
    hit = ew("eq", x, m)
    if x.dtype.is_floating:
        hit = ew("logical_or", hit, ew("isnan", x))
    return B.reduction("min", ew("where", hit, pos, count), dims, keepdim)


@lowers("aten::argmax", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(1, 2))
def _argmax(x, dim=None, keepdim=False):
    return _arg_extreme("max", x, dim, keepdim)


@lowers("aten::argmin", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(1, 2))
def _argmin(x, dim=None, keepdim=False):
    return _arg_extreme("min", x, dim, keepdim)
