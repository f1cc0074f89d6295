"""Lowerings of the element-wise losses of an input and a target and their gradients: the
regression losses `mse_loss`, `smooth_l1_loss` and `huber_loss`, and `soft_margin_loss` (the
logistic loss of +1 / -1 labels) (reduction none / mean / sum), and their `*_backward` ops. A
diffusion model's `F.mse_loss`, a detector's smooth L1 ran eagerly before, forward and backward.

Each is eager's CUDA kernel op by op, in the same order (mse: (x - y) * (x - y); smooth L1:
|x - y| < beta ? 0.5 * z * z / beta : z - 0.5 * beta; huber: z < delta ? 0.5 * z * z :
delta * (z - 0.5 * delta); soft margin: log1p(exp(-x * y)); the gradients norm * ... * grad
with norm = 2 / numel, 1 / numel for a mean, 2 or 1 for a sum or none; soft margin's
y * z * -norm / (z + 1) * grad with z = exp(-y * x)), then eager's mean or sum over every
element. Those kernels compute half / bfloat16 in their own dtype, rounding each step: such
losses, and operands of two dtypes, are left to eager, as is smooth L1 with beta 0 (eager's
L1 loss), and a soft margin target that would broadcast the input (eager raises).

Invariant: the result has eager's dtype and shape (a 0-dim tensor for mean and sum).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_loss import check_float_loss, reduce_loss
from .registry import NORMALIZATION, lowers

ew = B.elementwise


def _norm(x: TensorView, reduction, scale: float):
    """eager's norm: scale / numel for a mean, else scale. eager divides in double and rounds
    the quotient to the computation's dtype (`norm.to<scalar_t>()`): a number where the sizes
    are constants, else a host scalar computed so."""
    if reduction != 1:
        return scale
    n = B.num_elements(x, list(range(x.ndim)))
    if n.is_const:
        return scale / n.value if n.value else float("inf")   # (empty: the gradient is empty)
    q = ew("div", B.constant(float(scale), DataType.Double), B.cast(n, DataType.Double))
    return B.cast(q, x.dtype)


def _neg(norm):
    return -norm if isinstance(norm, float) else ew("neg", norm)


def _check_beta(name, beta):
    if not isinstance(beta, (int, float)) or float(beta) < 0:
        raise UnsupportedOpError(f"{name}: beta / delta must be a constant >= 0")


@lowers("aten::mse_loss", op_class=NORMALIZATION, n_args=(2, 3), const_args=(2,))
def _mse_loss(x, y, reduction=1):
    check_float_loss("mse_loss", reduction, x, y)
    diff = ew("sub", x, y)
    return reduce_loss(ew("mul", diff, diff), reduction)


@lowers("aten::mse_loss_backward", n_args=(4,), const_args=(3,))
def _mse_loss_backward(grad, x, y, reduction):
    check_float_loss("mse_loss_backward", reduction, grad, x, y)
    return ew("mul", ew("mul", _norm(x, reduction, 2.0), ew("sub", x, y)), grad)


@lowers("aten::smooth_l1_loss", op_class=NORMALIZATION, n_args=(2, 3, 4), const_args=(2, 3))
def _smooth_l1_loss(x, y, reduction=1, beta=1.0):
    check_float_loss("smooth_l1_loss", reduction, x, y)
    _check_beta("smooth_l1_loss", beta)
    if float(beta) == 0.0:
        raise UnsupportedOpError("smooth_l1_loss with beta 0 (eager's l1_loss; left to eager)")
    z = ew("abs", ew("sub", x, y))
    small = ew("div", ew("mul", ew("mul", z, 0.5), z), float(beta))
    loss = ew("where", ew("lt", z, float(beta)), small, ew("sub", z, 0.5 * float(beta)))
    return reduce_loss(loss, reduction)


@lowers("aten::smooth_l1_loss_backward", n_args=(5,), const_args=(3, 4))
def _smooth_l1_loss_backward(grad, x, y, reduction, beta):
    check_float_loss("smooth_l1_loss_backward", reduction, grad, x, y)
    _check_beta("smooth_l1_loss_backward", beta)
    if float(beta) == 0.0:
        raise UnsupportedOpError("smooth_l1_loss_backward with beta 0 (left to eager)")
    norm, b = _norm(x, reduction, 1.0), float(beta)
    d = ew("sub", x, y)
    inside = ew("div", ew("mul", ew("mul", d, norm), grad), b)
    return ew("where", ew("lt", d, -b), ew("mul", grad, _neg(norm)),
              ew("where", ew("gt", d, b), ew("mul", grad, norm), inside))


@lowers("aten::huber_loss", op_class=NORMALIZATION, n_args=(2, 3, 4), const_args=(2, 3))
def _huber_loss(x, y, reduction=1, delta=1.0):
    check_float_loss("huber_loss", reduction, x, y)
    _check_beta("huber_loss", delta)
    dl = float(delta)
    z = ew("abs", ew("sub", x, y))
    loss = ew("where", ew("lt", z, dl), ew("mul", ew("mul", z, 0.5), z),
              ew("mul", ew("sub", z, 0.5 * dl), dl))
    return reduce_loss(loss, reduction)


@lowers("aten::huber_loss_backward", n_args=(5,), const_args=(3, 4))
def _huber_loss_backward(grad, x, y, reduction, delta):
    check_float_loss("huber_loss_backward", reduction, grad, x, y)
    _check_beta("huber_loss_backward", delta)
    norm, dl = _norm(x, reduction, 1.0), float(delta)
    d = ew("sub", x, y)
    return ew("where", ew("lt", d, -dl), ew("mul", ew("mul", grad, _neg(norm)), dl),
              ew("where", ew("gt", d, dl), ew("mul", ew("mul", grad, norm), dl),
                 ew("mul", ew("mul", d, norm), grad)))


def _check_target_fits(what: str, x: TensorView, y: TensorView) -> None:
    """eager writes the loss into a tensor of the input's shape (`mul_` by the target): a target
    that broadcasts the input to a larger shape raises there; left to eager here."""
    if y.ndim > x.ndim or any(dx.is_broadcast and not dy.is_broadcast
                              for dx, dy in zip(x.logical[x.ndim - y.ndim:], y.logical)):
        raise UnsupportedOpError(f"{what}: a target that broadcasts the input (left to eager)")


@lowers("aten::soft_margin_loss", op_class=NORMALIZATION, n_args=(2, 3), const_args=(2,))
def _soft_margin_loss(x, y, reduction=1):
    check_float_loss("soft_margin_loss", reduction, x, y)
    _check_target_fits("soft_margin_loss", x, y)
    return reduce_loss(ew("log1p", ew("exp", ew("mul", ew("neg", x), y))), reduction)


@lowers("aten::soft_margin_loss_backward", n_args=(4,), const_args=(3,))
def _soft_margin_loss_backward(grad, x, y, reduction):
    check_float_loss("soft_margin_loss_backward", reduction, grad, x, y)
    _check_target_fits("soft_margin_loss_backward", x, y)
    z = ew("exp", ew("mul", ew("neg", y), x))
    scaled = ew("mul", ew("mul", y, z), _neg(_norm(x, reduction, 1.0)))
    return ew("mul", ew("div", scaled, ew("add", z, 1.0)), grad)
