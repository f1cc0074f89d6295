"""Lowerings of `aten::all` and `aten::any` (every overload of a tensor: all elements, one dim,
a list of dims; keepdim): whether every element (all) or some element (any) is nonzero.

Each is a count: all(x) is `sum(x == 0) == 0`, any(x) is `sum(x != 0) != 0`, the count an
int64 sum (exact in any order), so an empty reduction gives eager's True (all) and False (any)
with no special case, and NaN, which is not 0, counts as true, as in eager. The result is bool,
or uint8 for a uint8 input (eager keeps that dtype). A dims list that is empty reduces nothing
(all.dims / any.dims: each element tested alone, as eager does), unlike sum's empty list; dims
None reduces every axis.

Invariant: only tensors of a real dtype are lowered (complex ones and the list overloads,
`all.bool` of a list of bools, raise UnsupportedOpError and stay eager's).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .registry import REDUCTION, lowers

ew = B.elementwise


def _axes(dims, op: str) -> list[int] | None:
    """The axes to reduce: None for every axis, [] for none."""
    if dims is None:
        return None
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or \
            any(not isinstance(d, int) or isinstance(d, bool) for d in dims):
        raise UnsupportedOpError(f"{op}: dims must be constants, got {dims!r}")
    return list(dims)


def _all_any(op: str):
    # all: no element equal to 0; any: some element not equal to 0 (a count compared with 0)
    cmp = "eq" if op == "all" else "ne"

    def lower(x, dims=None, keepdim=False):
        if not isinstance(x, TensorView):
            raise UnsupportedOpError(f"{op}: only of a tensor (not a list) is lowered")
        if x.dtype.is_complex:
            raise UnsupportedOpError(f"{op} of a complex tensor is left to eager")
        axes = _axes(dims, op)
        if axes == [] or x.ndim == 0:        # nothing reduced: each element tested alone
            out = ew("ne", x, 0)
        else:
            count = B.reduction("sum", ew(cmp, x, 0), axes, bool(keepdim), DataType.Int)
            out = ew(cmp, count, 0)
        return B.cast(out, DataType.Byte) if x.dtype is DataType.Byte else out
    return lower


_lowers_all = lowers("aten::all", op_class=REDUCTION, n_args=(1, 2, 3),
                     const_args=(1, 2))(_all_any("all"))
_lowers_any = lowers("aten::any", op_class=REDUCTION, n_args=(1, 2, 3),
                     const_args=(1, 2))(_all_any("any"))
