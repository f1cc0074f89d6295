"""Lowerings of weight normalization (`torch.nn.utils.weight_norm` /
`parametrizations.weight_norm`: Wav2Vec2's positional convolution, many audio and older
convolutional models): `aten::_weight_norm_interface` and its backward, which AOTAutograd's
graphs call for `torch._weight_norm` along dim 0 or the last dim.

w = v * (g / ||v||), the norm over every axis but `dim` (g and the norms keep size 1 there):
one reduction over those axes and a pointwise scale, in the order eager's kernel rounds (the
per-channel factor g / norm first, then the product). Backward, with s = sum(grad_w * v) over
the same axes: grad_g = s / norm, grad_v = (g / norm) * (grad_w - v * (grad_g / norm)), eager's
formula. float32 / float64 with one dtype for v and g only (eager keeps half / bfloat16 norms in
another dtype: left to eager).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .registry import NORMALIZATION, lowers

ew = B.elementwise


def _other_dims(name: str, v, g, dim) -> list:
    """The axes the norm runs over (every axis of v but `dim`), after checking the operands."""
    for t in (v, g):
        if not isinstance(t, TensorView) or t.dtype not in (DataType.Float, DataType.Double):
            raise UnsupportedOpError(f"{name} of other than float32 / float64 tensors (left to "
                                     "eager)")
    if v.dtype is not g.dtype:
        raise UnsupportedOpError(f"{name}: v and g of different dtypes (left to eager)")
    if v.ndim == 0 or g.ndim != v.ndim:
        raise UnsupportedOpError(f"{name}: g of rank {g.ndim} for a rank-{v.ndim} v")
    d = int(dim)
    d = d + v.ndim if d < 0 else d
    if not 0 <= d < v.ndim:
        raise UnsupportedOpError(f"{name}: dim {dim} of a rank-{v.ndim} tensor")
    return [i for i in range(v.ndim) if i != d]


def _norms(v, dims):
    return ew("sqrt", B.reduction("sum", ew("mul", v, v), dims, keepdim=True))


@lowers("aten::_weight_norm_interface", op_class=NORMALIZATION, n_args=(2, 3), const_args=(2,))
def _weight_norm(v, g, dim=0):
    """(w, norms): module docstring."""
    dims = _other_dims("_weight_norm_interface", v, g, dim)
    norms = _norms(v, dims)
    return ew("mul", v, ew("div", g, norms)), norms


@lowers("aten::_weight_norm_interface_backward", op_class=NORMALIZATION, n_args=(5,),
        const_args=(4,))
def _weight_norm_backward(grad_w, v, g, norms, dim):
    """(grad_v, grad_g): module docstring."""
    dims = _other_dims("_weight_norm_interface_backward", v, g, dim)
    if not isinstance(grad_w, TensorView) or grad_w.dtype is not v.dtype or \
            not isinstance(norms, TensorView) or norms.dtype is not v.dtype:
        raise UnsupportedOpError("_weight_norm_interface_backward of mixed dtypes (left to eager)")
    s = B.reduction("sum", ew("mul", grad_w, v), dims, keepdim=True)
    grad_g = ew("div", s, norms)
    grad_v = ew("mul", ew("div", g, norms), ew("sub", grad_w, ew("mul", v, ew("div", grad_g, norms))))
    return grad_v, grad_g
