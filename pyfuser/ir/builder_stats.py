"""Building Fusion IR, continued: statistics over reduced axes (`num_elements`, `mean`,
`var_mean` from one Welford pass, `welford` itself), with builder.py's invariants. Half and
bfloat16 inputs are computed in float (eager's accumulation type) and rounded once; rank-0
inputs reduce no axis, as eager reads them. Reached through `builder` too (its module
`__getattr__`), so callers write `B.mean(...)` as before.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import FusionDefinitionError
from . import exprs as E
from .base import Val
from .builder import (_check_tv, _copy_id, _norm_dim, broadcast, cast, constant, elementwise,
                      reduction, set_)
from .dtypes import DataType
from .fusion import Fusion
from .iterdomain import IterDomain, IterType
from .tensor import TensorView


def num_elements(x: TensorView, axes: Sequence[int]) -> Val:
    """The product of the extents of `axes` of x, as a Scalar (folded when constant); an
    expanded axis counts its expanded size."""
    const, symbolic = 1, []
    for a in axes:
        ext = x.logical[a].full_extent
        if ext.is_const:
            const *= ext.value
        else:
            symbolic.append(ext)
    n: Val = constant(const) if not symbolic or const != 1 else symbolic.pop(0)
    for ext in symbolic:
        n = elementwise("mul", n, ext)
    return n


def mean(x: TensorView, axes, keepdim: bool = False, dtype: DataType | None = None):
    """sum / count. Half and bfloat16 are summed and divided in float and rounded once, as
    eager's mean does (its accumulation type)."""
    x = _check_tv(x, "mean")
    if dtype is None and not (x.dtype.is_floating or x.dtype.is_complex):
        raise FusionDefinitionError(f"mean: needs a floating input or dtype=, got {x.dtype.name}")
    axes = list(range(x.ndim)) if not axes else sorted({_norm_dim(a, x.ndim, "mean") for a in axes})
    axes = axes if x.ndim else []            # rank 0: one element, no axis (see reduction)
    if dtype is not None:
        x = cast(x, dtype)
    out_dtype = x.dtype
    if out_dtype.is_reduced_float:
        x = cast(x, out_dtype.compute)
    s = reduction("sum", x, axes, keepdim)
    return cast(elementwise("div", s, num_elements(x, axes)), out_dtype)


def var_mean(x: TensorView, axes, correction: float = 1, keepdim: bool = False):
    """(var, mean) from one Welford pass over x (half / bfloat16 in float, rounded once);
    var = m2 / max(n - correction, 0) as eager divides."""
    x = _check_tv(x, "var_mean")
    if not x.dtype.is_floating:
        raise FusionDefinitionError(f"var_mean: needs a floating input, got {x.dtype.name}")
    axes = list(range(x.ndim)) if not axes else sorted({_norm_dim(a, x.ndim, "var") for a in axes})
    out_dtype = x.dtype
    xc = cast(x, out_dtype.compute) if out_dtype.is_reduced_float else x
    if x.ndim == 0:                          # one element, no axis (see reduction)
        axes = []
        dev = elementwise("sub", xc, xc)     # 0, or NaN for a NaN / infinite element, as eager
        avg, m2 = set_(xc), elementwise("mul", dev, dev)
    else:
        avg, m2, _ = welford(xc, axes)
    n = num_elements(x, axes)
    denom = elementwise("sub", n, constant(correction)) if correction else n
    denom = elementwise("maximum", denom, constant(0)) if correction else denom
    var, avg = cast(elementwise("div", m2, denom), out_dtype), cast(avg, out_dtype)
    if keepdim:
        flags = [i in axes for i in range(x.ndim)]
        var, avg = broadcast(var, flags), broadcast(avg, flags)
    return var, avg


def welford(x: TensorView, axes: Sequence[int]) -> tuple:
    """One-pass (avg, m2, n) over `axes`: m2 is the sum of squared deviations, n the count."""
    x = _check_tv(x, "welford")
    if not x.dtype.is_floating:
        raise FusionDefinitionError(f"welford: needs a floating input, got {x.dtype.name}")
    axes = list(range(x.ndim)) if not axes else sorted({_norm_dim(a, x.ndim, "welford") for a in axes})
    fusion = Fusion.current()

    def reduced(dtype):
        root = [IterDomain(a.extent, IterType.Reduction) if i in axes else _copy_id(a)
                for i, a in enumerate(x.logical)]
        return TensorView(root, dtype, fusion)

    avg, m2, n = reduced(x.dtype), reduced(x.dtype), reduced(DataType.Int)
    E.WelfordOp(avg, m2, n, x, axes)
    return avg, m2, n
