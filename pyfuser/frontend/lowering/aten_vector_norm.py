"""Lowerings of vector norms: `linalg_vector_norm` (F.normalize, cosine similarity, an L2
norm written `x.norm(dim=-1)`) and `norm` over given dims (`norm.ScalarOpt_dim`, and its
`dtype` form; F.pairwise_distance's). They ran eagerly before, each cutting the kernels around
it (a CLIP's normalized embeddings).

As eager's reduction kernels: the input cast to `dtype` first where one is given; half /
bfloat16 accumulated in float and the result rounded once; ord 2: sqrt(sum(x * x)), 1:
sum(|x|), inf / -inf: max / min of |x|, 0: the count of nonzero elements, any other p:
sum(|x| ** p) ** (1 / p). Integer and complex inputs are left to eager (which refuses the
integers).

Invariant: the result has eager's dtype (the input's, or `dtype`) and shape (the reduced dims
dropped, or kept as 1 with keepdim).
"""
from __future__ import annotations

import math

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.tensor import TensorView
from .aten_reduction import _dims, _float_compute, _opt_dtype
from .registry import REDUCTION, lowers

ew = B.elementwise


def vector_norm(x, ord, dim, keepdim, dtype, what: str) -> TensorView:
    if not isinstance(x, TensorView):
        raise UnsupportedOpError(f"{what} of a non-tensor (left to eager)")
    if dtype is not None:
        x = B.cast(x, _opt_dtype(dtype))
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"{what} of a {x.dtype.name} tensor (left to eager)")
    if not isinstance(ord, (int, float)) or isinstance(ord, bool):
        raise UnsupportedOpError(f"{what}: ord must be a constant number, got {ord!r}")
    p = float(ord)
    dims, keep = _dims(dim, x), bool(keepdim)
    xc = _float_compute(x)
    a = ew("abs", xc)
    if p == 2.0:
        out = ew("sqrt", B.reduction("sum", ew("mul", xc, xc), dims, keep))
    elif p == 1.0:
        out = B.reduction("sum", a, dims, keep)
    elif p == math.inf:
        out = B.reduction("max", a, dims, keep)
    elif p == -math.inf:
        out = B.reduction("min", a, dims, keep)
    elif p == 0.0:
        out = B.reduction("sum", B.cast(ew("ne", xc, 0.0), xc.dtype), dims, keep)
    elif math.isfinite(p):
        out = ew("pow", B.reduction("sum", ew("pow", a, p), dims, keep), 1.0 / p)
    else:
        raise UnsupportedOpError(f"{what}: ord {ord!r}")
    return B.cast(out, x.dtype) if out.dtype is not x.dtype else out


@lowers("aten::linalg_vector_norm", op_class=REDUCTION, n_args=(1, 2, 3, 4, 5),
        const_args=(1, 2, 3, 4))
def _linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    return vector_norm(x, ord, dim, keepdim, dtype, "linalg_vector_norm")


@lowers("aten::norm", op_class=REDUCTION, n_args=(1, 2, 3, 4, 5), const_args=(1, 2, 3, 4))
def _norm(x, p=2, *rest):
    """norm.Scalar (x, p), norm.ScalarOpt_dim (x, p, dim, keepdim) and its dtype form; the
    overload of (x, p, dtype) is told from (x, p, dim) by its third argument, a list of dims
    only for the latter."""
    if p is None:
        p = 2
    if not rest:
        return vector_norm(x, p, None, False, None, "norm")
    dim = rest[0]
    if not isinstance(dim, (list, tuple)):
        raise UnsupportedOpError("norm: a third argument that is not a list of dims (left to eager)")
    keepdim = rest[1] if len(rest) > 1 else False
    dtype = rest[2] if len(rest) > 2 else None
    return vector_norm(x, p, list(dim), keepdim, dtype, "norm")

