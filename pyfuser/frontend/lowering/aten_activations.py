"""Lowerings of activations computed as eager's kernels compute them, and of the derivatives
that aten_backward.py does not have: ELU (SELU and CELU call it) and its backward, CELU, leaky
ReLU's, hardsigmoid's, hardswish's and mish's backward, log-sigmoid and its backward
(`log_sigmoid_forward` / `_backward`: a DPO loss's F.logsigmoid), PReLU's kernel and its backward
(`_prelu_kernel`, `_prelu_kernel_backward`), and GLU and its backward (the halves of the axis
as slices, the gradient a cat of the halves' gradients). Before these, each derivative ran
eagerly and cut the training graph's kernels around it (a MobileNetV3's hardswish, a GAN's
leaky ReLU).

Each follows eager's CUDA kernel: half / bfloat16 operands computed in float (opmath) and
rounded once (ELU's forward, three ops, rounded each op's result before: one bfloat16 ulp off
eager's); constants in the computation's precision, a product of two scalar coefficients
(ELU's alpha * scale) rounded in that precision as eager forms it; the same comparisons at the
branches' bounds (hardswish's backward at exactly -3 and 3: 0 and the gradient itself, as
torch 2.11's CUDA kernel and the CPU's give them; older CUDA kernels gave the middle formula).

Invariant: the result has eager's dtype (the input's, or the gradient's); these are pointwise
(GLU's slices and cat are index remappings inside a pointwise kernel), so they fuse with the
ops around them like any other.
"""
from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_backward import _floating, _out
from .aten_reduction import _float_compute
from .device import device_type
from .registry import lowers

ew = B.elementwise


def _coef(v, like) -> float:
    """Scalar v in the precision `like` is computed in (eager's `Scalar.to<opmath_t>()`)."""
    return float(v) if like.dtype is DataType.Double else float(np.float32(v))


def _coef_product(a, b, like) -> float:
    """a * b as eager forms it: each in the computation's precision, the product rounded there."""
    if like.dtype is DataType.Double:
        return float(a) * float(b)
    return float(np.float32(a) * np.float32(b))


@lowers("aten::elu", n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """x * scale where x > 0, else expm1(x * input_scale) * (alpha * scale)."""
    _floating("elu", x)
    xc = _float_compute(x)
    neg = ew("mul", ew("expm1", ew("mul", xc, _coef(input_scale, xc))),
             _coef_product(alpha, scale, xc))
    pos = ew("mul", xc, _coef(scale, xc)) if float(scale) != 1.0 else xc
    return _out(ew("where", ew("gt", xc, 0.0), pos, neg), x)


@lowers("aten::celu", n_args=(1, 2), const_args=(1,))
def _celu(x, alpha=1.0):
    """elu(x, alpha, scale=1, input_scale=1/alpha), as eager's celu calls it."""
    return _elu(x, alpha, 1.0, 1.0 / float(alpha))


@lowers("aten::elu_backward", n_args=(6,), const_args=(1, 2, 3, 4))
def _elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    """grad * scale where the input (or result) is positive; below, from the input:
    grad * input_scale * (alpha * scale) * exp(x * input_scale), or from the result (an
    in-place elu's): grad * input_scale * (y + alpha * scale)."""
    _floating("elu_backward", grad, self_or_result)
    g, v = _float_compute(grad), _float_compute(self_or_result)
    neg_coef = _coef_product(alpha, scale, g)
    pos, ipt = _coef(scale, g), _coef(input_scale, g)
    if is_result:
        below = ew("mul", ew("mul", g, ipt), ew("add", v, neg_coef))
    else:
        below = ew("mul", ew("mul", ew("mul", g, ipt), neg_coef), ew("exp", ew("mul", v, ipt)))
    return _out(ew("where", ew("le", v, 0.0), below, ew("mul", g, pos)), grad)


@lowers("aten::leaky_relu_backward", n_args=(4,), const_args=(2, 3))
def _leaky_relu_backward(grad, x, negative_slope, self_is_result):
    """grad where x > 0, else grad * negative_slope (the same whether x is the input or the
    result: a positive slope keeps the sign)."""
    _floating("leaky_relu_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    slope = _coef(negative_slope, g)
    return _out(ew("where", ew("gt", xc, 0.0), g, ew("mul", g, slope)), grad)


@lowers("aten::hardsigmoid_backward", n_args=(2,))
def _hardsigmoid_backward(grad, x):
    """grad times 1/6 strictly inside (-3, 3), else 0; eager's 1/6 is the float literal
    `1.0f / 6.0f`, in a double computation too."""
    _floating("hardsigmoid_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    inside = ew("logical_and", ew("gt", xc, -3.0), ew("lt", xc, 3.0))
    return _out(ew("where", inside, ew("mul", g, float(np.float32(1.0) / np.float32(6.0))), 0.0),
                grad)


@lowers("aten::hardswish_backward", n_args=(2,))
def _hardswish_backward(grad, x):
    """0 up to -3, grad * (x / 3 + 0.5) below 3, grad from 3 on: eager's bounds on both
    devices (module docstring; measured on CUDA with torch 2.11: 0 at -3, grad at 3)."""
    _floating("hardswish_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    zero = ew("le", xc, -3.0)
    middle = ew("lt", xc, 3.0)
    ramp = ew("mul", g, ew("add", ew("div", xc, 3.0), 0.5))
    return _out(ew("where", zero, 0.0, ew("where", middle, ramp, g)), grad)


def _sigmoid(v: TensorView) -> TensorView:
    """1 / (1 + exp(-v)), as eager's mish and GLU kernels write it."""
    return ew("div", 1.0, ew("add", 1.0, ew("exp", ew("neg", v))))


@lowers("aten::mish_backward", n_args=(2,))
def _mish_backward(grad, x):
    """grad * (t + x * s * (1 - t * t)) with s = 1 / (1 + exp(-x)) and t = tanh(log1p(exp(x)))."""
    _floating("mish_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    s = _sigmoid(xc)
    t = ew("tanh", ew("log1p", ew("exp", xc)))
    inner = ew("mul", ew("mul", xc, s), ew("sub", 1.0, ew("mul", t, t)))
    return _out(ew("mul", g, ew("add", t, inner)), grad)


def _exp_neg_abs(xc: TensorView) -> TensorView:
    """exp(-|x|): log-sigmoid's z (the CPU kernel's buffer)."""
    return ew("exp", ew("neg", ew("abs", xc)))


@lowers("aten::log_sigmoid_forward", n_args=(1,))
def _log_sigmoid_forward(x):
    """(min(x, 0) - log1p(z), buffer) with z = exp(-|x|): F.logsigmoid's op. The buffer is
    what eager's kernel of the graph's device returns: on the CPU z itself (rounded to x's
    dtype, the backward reads it), on CUDA (or an unknown device) an empty tensor [0]."""
    _floating("log_sigmoid_forward", x)
    xc = _float_compute(x)
    z = _exp_neg_abs(xc)
    out = _out(ew("sub", ew("minimum", xc, 0.0), ew("log1p", z)), x)
    buffer = _out(z, x) if device_type() == "cpu" else B.full([0], 0, x.dtype)
    return out, buffer


@lowers("aten::log_sigmoid", n_args=(1,))
def _log_sigmoid(x):
    """F.logsigmoid in a TorchScript graph: log_sigmoid_forward's output."""
    return _log_sigmoid_forward(x)[0]


def _is_empty(t: TensorView) -> bool:
    """Whether t's sizes are constants with a 0 among them (CUDA's log-sigmoid buffer)."""
    sizes = [d.known_size() for d in t.logical]
    return None not in sizes and 0 in sizes


@lowers("aten::log_sigmoid_backward", n_args=(3,))
def _log_sigmoid_backward(grad, x, buffer):
    """grad * (x < 0 ? 1 - z / (1 + z) : z / (1 + z)) (eager's max_deriv - sign * z / (1 + z));
    z = exp(-|x|) computed again for CUDA (whose kernel never reads the buffer: an FX graph's
    buffer is an input of symbolic extent there, not a known [0]) or where the buffer is
    known empty, else the buffer (the CPU's kernel reads it; a graph of unknown device that
    gets an empty one at run time fails the broadcast check and runs eagerly)."""
    _floating("log_sigmoid_backward", grad, x, buffer)
    g, xc = _float_compute(grad), _float_compute(x)
    recompute = device_type() == "cuda" or _is_empty(buffer)
    z = _exp_neg_abs(xc) if recompute else _float_compute(buffer)
    q = ew("div", z, ew("add", 1.0, z))
    return _out(ew("mul", g, ew("where", ew("lt", xc, 0.0), ew("sub", 1.0, q), q)), grad)


@lowers("aten::_prelu_kernel", n_args=(2,))
def _prelu_kernel(x, weight):
    """x where x > 0, else weight * x (weight already shaped to broadcast against x)."""
    _floating("_prelu_kernel", x, weight)
    xc, w = _float_compute(x), _float_compute(weight)
    return _out(ew("where", ew("gt", xc, 0.0), xc, ew("mul", w, xc)), x)


@lowers("aten::_prelu_kernel_backward", n_args=(3,))
def _prelu_kernel_backward(grad, x, weight):
    """(grad where x > 0 else weight * grad, 0 where x > 0 else x * grad), both x's shape (the
    graph sums the second over the weight's broadcast axes)."""
    _floating("_prelu_kernel_backward", grad, x, weight)
    g, xc, w = _float_compute(grad), _float_compute(x), _float_compute(weight)
    pos = ew("gt", xc, 0.0)
    dx = ew("where", pos, g, ew("mul", w, g))
    dw = ew("where", pos, 0.0, ew("mul", xc, g))
    return _out(dx, x), _out(dw, x)


def _halves(x: TensorView, dim: int, what: str):
    """(d, a, b): x's axis `dim` (normalised) and its first and second halves (slices; the
    half a host value where the size is symbolic). An odd constant size is eager's error: left
    to eager."""
    if x.ndim == 0:
        raise UnsupportedOpError(f"{what} of a 0-dim tensor (eager raises)")
    d = dim % x.ndim
    n = x.logical[d].known_size()
    if n is not None:
        if n % 2:
            raise UnsupportedOpError(f"{what}: an axis of odd size {n} (eager raises)")
        h = n // 2
        return d, B.slice_axis(x, d, 0, h), B.slice_axis(x, d, h, n)
    h = ew("div_floor", x.logical[d].full_extent, 2)
    return d, B.slice_axis(x, d, 0, h), B.slice_axis(x, d, h, None)


@lowers("aten::glu", n_args=(1, 2), const_args=(1,))
def _glu(x, dim=-1):
    """a * sigmoid(b) of x's halves a, b along `dim` (in float for half / bfloat16)."""
    _floating("glu", x)
    _, a, b = _halves(x, dim, "glu")
    return _out(ew("mul", _float_compute(a), _sigmoid(_float_compute(b))), x)


@lowers("aten::glu_backward", n_args=(3,), const_args=(2,))
def _glu_backward(grad, x, dim):
    """cat(sigmoid(b) * g, (1 - sigmoid(b)) * sigmoid(b) * g * a) along `dim`, as eager's CUDA
    kernel orders the products."""
    _floating("glu_backward", grad, x)
    d, a, b = _halves(x, dim, "glu_backward")
    g, ac, s = _float_compute(grad), _float_compute(a), _sigmoid(_float_compute(b))
    ga = ew("mul", s, g)
    gb = ew("mul", ew("mul", ew("mul", ew("sub", 1.0, s), s), g), ac)
    return _out(B.cat([ga, gb], d), x)
