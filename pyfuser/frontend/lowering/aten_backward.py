"""Lowerings of the aten ops backward graphs call (AOTAutograd's derivatives of the forward ops):
gelu / tanh / sigmoid / silu / threshold / hardtanh (relu6) / softplus / dropout backward, softmax and log_softmax backward,
layer_norm, group_norm and batch_norm backward, and `_safe_softmax` (softmax whose all -inf rows are 0).
(Batch norm in training mode, its running statistics in place or as new tensors, is
aten_reduction.py's `_batch_norm_training`.)

Each is written with the builder's elementwise ops and reductions in the order of operations of
eager's kernels where that order matters for rounding (half / bfloat16 computed in float and
rounded once at the end, as eager's opmath does); the formulas are the standard derivatives.
Reductions over one domain share a kernel (a layer norm's dx needs two row sums, one kernel);
dweight / dbias sum over the other axes (the rows), another reduction domain, so the segmenter
puts them in a kernel of their own.

Outputs an `output_mask` leaves out are None; a graph never reads them.
"""
from __future__ import annotations

import math

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.tensor import TensorView
from .aten_pointwise import _dtype
from .aten_loss import _target_masks, check_weight, one_hot, target_weights
from .aten_reduction import _channel_param, _float_compute, group_count
from .registry import NORMALIZATION, lowers

ew = B.elementwise


def _out(x, like: TensorView):
    """x rounded back to `like`'s dtype (half / bfloat16 computed in float)."""
    return B.cast(x, like.dtype) if x.dtype is not like.dtype else x


def _floating(name, *xs):
    for x in xs:
        if not isinstance(x, TensorView) or not x.dtype.is_floating:
            raise UnsupportedOpError(f"{name} of a non-floating tensor (left to eager)")


# ---- activations --------------------------------------------------------------------------------
@lowers("aten::gelu_backward", n_args=(2, 3), const_args=(2,))
def _gelu_backward(grad, x, approximate="none"):
    _floating("gelu_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    if approximate == "tanh":
        beta = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
        kappa = 0.044715
        x_sq = ew("mul", xc, xc)
        x_cube = ew("mul", x_sq, xc)
        inner = ew("mul", ew("add", xc, ew("mul", x_cube, kappa)), beta)
        t = ew("tanh", inner)
        left = ew("mul", xc, 0.5)
        right = ew("add", t, 1.0)
        left_d = ew("mul", right, 0.5)
        right_d = ew("mul", left, ew("sub", 1.0, ew("mul", t, t)))
        inner_d = ew("mul", ew("add", ew("mul", x_sq, 3.0 * kappa), 1.0), beta)
        dx = ew("mul", g, ew("add", left_d, ew("mul", right_d, inner_d)))
    elif approximate == "none":
        alpha = (2.0 / math.sqrt(math.pi)) * math.sqrt(0.5) * 0.5
        cdf = ew("mul", ew("add", ew("erf", ew("mul", xc, math.sqrt(0.5))), 1.0), 0.5)
        pdf = ew("mul", ew("exp", ew("mul", ew("mul", xc, xc), -0.5)), alpha)
        dx = ew("mul", g, ew("add", cdf, ew("mul", xc, pdf)))
    else:
        raise UnsupportedOpError(f"gelu_backward: approximate={approximate!r}")
    return _out(dx, grad)


@lowers("aten::tanh_backward", n_args=(2,))
def _tanh_backward(grad, y):
    _floating("tanh_backward", grad, y)
    g, yc = _float_compute(grad), _float_compute(y)
    return _out(ew("mul", g, ew("sub", 1.0, ew("mul", yc, yc))), grad)


@lowers("aten::sigmoid_backward", n_args=(2,))
def _sigmoid_backward(grad, y):
    _floating("sigmoid_backward", grad, y)
    g, yc = _float_compute(grad), _float_compute(y)
    return _out(ew("mul", ew("mul", g, ew("sub", 1.0, yc)), yc), grad)


@lowers("aten::silu_backward", n_args=(2,))
def _silu_backward(grad, x):
    _floating("silu_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    s = ew("sigmoid", xc)
    return _out(ew("mul", ew("mul", g, s), ew("add", ew("mul", xc, ew("sub", 1.0, s)), 1.0)), grad)


@lowers("aten::threshold_backward", n_args=(3,))
def _threshold_backward(grad, x, threshold):
    return ew("where", ew("le", x, threshold), B.cast(0, grad.dtype), grad)


@lowers("aten::hardtanh_backward", n_args=(4,), const_args=(2, 3))
def _hardtanh_backward(grad, x, min_val, max_val):
    """0 where x <= min_val or x >= max_val, grad elsewhere, as eager's CUDA kernel: half /
    bfloat16 x compared in float with the bounds in float (not rounded to x's dtype), and a NaN
    x passes grad (CPU eager's vectorized loop gives 0 there)."""
    _floating("hardtanh_backward", grad, x)
    xc = _float_compute(x)
    out = ew("logical_or", ew("le", xc, float(min_val)), ew("ge", xc, float(max_val)))
    return ew("where", out, B.cast(0, grad.dtype), grad)


@lowers("aten::softplus_backward", n_args=(4,), const_args=(2, 3))
def _softplus_backward(grad, x, beta, threshold):
    """grad where x * beta > threshold, else grad * z / (z + 1) with z = exp(x * beta), in
    float for half / bfloat16 (eager's opmath), rounded once."""
    _floating("softplus_backward", grad, x)
    g, xc = _float_compute(grad), _float_compute(x)
    xb = ew("mul", xc, float(beta))
    z = ew("exp", xb)
    dx = ew("where", ew("gt", xb, float(threshold)), g,
            ew("div", ew("mul", g, z), ew("add", z, 1.0)))
    return _out(dx, grad)


@lowers("aten::native_dropout_backward", n_args=(3,))
def _dropout_backward(grad, mask, scale):
    """grad * mask * scale, as eager (the mask is the forward's, saved by AOTAutograd)."""
    return ew("mul", ew("mul", grad, mask), float(scale))


# ---- softmax --------------------------------------------------------------------------------------
@lowers("aten::_safe_softmax", op_class=NORMALIZATION, n_args=(2, 3), const_args=(1, 2))
def _safe_softmax(x, dim, dtype=None):
    """softmax, with 0 for rows whose every element is -inf (eager's masked attention rows)."""
    if dtype is not None:
        x = B.cast(x, _dtype(dtype))
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"softmax of a {x.dtype.name} tensor (eager raises)")
    xc = _float_compute(x)
    m = B.reduction("max", xc, [dim], keepdim=True)
    e = ew("exp", ew("sub", xc, m))
    sm = ew("div", e, B.reduction("sum", e, [dim], keepdim=True))
    out = ew("where", ew("eq", m, float("-inf")), 0.0, sm)
    return _out(out, x)


@lowers("aten::_softmax_backward_data", op_class=NORMALIZATION, n_args=(4,), const_args=(2, 3))
def _softmax_backward(grad, y, dim, input_dtype):
    """y * (grad - sum(grad * y, dim)) in float, rounded to input_dtype."""
    _floating("softmax backward", grad, y)
    g, yc = _float_compute(grad), _float_compute(y)
    s = B.reduction("sum", ew("mul", g, yc), [dim], keepdim=True)
    return B.cast(ew("mul", yc, ew("sub", g, s)), _dtype(input_dtype))


@lowers("aten::_log_softmax_backward_data", op_class=NORMALIZATION, n_args=(4,), const_args=(2, 3))
def _log_softmax_backward(grad, y, dim, input_dtype):
    """grad - exp(y) * sum(grad, dim) in float, rounded to input_dtype."""
    _floating("log_softmax backward", grad, y)
    g, yc = _float_compute(grad), _float_compute(y)
    s = B.reduction("sum", g, [dim], keepdim=True)
    return B.cast(ew("sub", g, ew("mul", ew("exp", yc), s)), _dtype(input_dtype))


# ---- layer norm -----------------------------------------------------------------------------------
@lowers("aten::native_layer_norm_backward", op_class=NORMALIZATION, n_args=(8,),
        const_args=(2, 7))
def _layer_norm_backward(dy, x, shape, mean, rstd, w, b, mask):
    """(dx, dweight, dbias): x_hat = (x - mean) * rstd, g = dy * w;
    dx = rstd / N * (N * g - sum(g) - x_hat * sum(g * x_hat)) over the normalized axes;
    dweight = sum(dy * x_hat), dbias = sum(dy) over the leading axes."""
    _floating("layer_norm backward", dy, x, mean, rstd)
    k = len(shape)
    dims = list(range(x.ndim - k, x.ndim))
    lead = list(range(x.ndim - k))
    xc, dyc = _float_compute(x), _float_compute(dy)
    mc, rc = _float_compute(mean), _float_compute(rstd)
    x_hat = ew("mul", ew("sub", xc, mc), rc)
    dx = dw = db = None
    if mask[0]:
        g = ew("mul", dyc, _float_compute(w)) if w is not None else dyc
        n = B.num_elements(xc, dims)
        sum_g = B.reduction("sum", g, dims, keepdim=True)
        sum_gx = B.reduction("sum", ew("mul", g, x_hat), dims, keepdim=True)
        inner = ew("sub", ew("sub", ew("mul", g, n), sum_g), ew("mul", x_hat, sum_gx))
        dx = _out(ew("mul", ew("div", rc, n), inner), x)
    if mask[1] and w is not None:
        dw = ew("mul", dyc, x_hat)
        dw = _out(B.reduction("sum", dw, lead) if lead else dw, w)
    if mask[2] and b is not None:
        db = _out(B.reduction("sum", dyc, lead) if lead else dyc, b)
    return dx, dw, db


# ---- group norm -----------------------------------------------------------------------------------
@lowers("aten::native_group_norm_backward", op_class=NORMALIZATION, n_args=(10,),
        const_args=(8, 9))
def _group_norm_backward(dy, x, mean, rstd, w, n, c, hw, groups, mask):
    """(dx, dweight, dbias) of native_group_norm: x and dy seen as [N, G, C / G, prod(*)] as
    the forward sees x, mean / rstd [N, G]; per (n, g) group of M = C / G * prod(*) elements,
    x_hat = (x - mean) * rstd, g = dy * w (per channel), dx = rstd / M * (M * g - sum(g) -
    x_hat * sum(g * x_hat)) (a layer norm's backward over the group); per channel over N and
    the spatial axes, dweight = sum(dy * x_hat), dbias = sum(dy). In float for half / bfloat16,
    rounded to x's / the weight's dtype."""
    _floating("group_norm backward", dy, x, mean, rstd)
    G = group_count(x, groups, "group_norm backward")
    if w is None and (mask[1] or mask[2]):
        raise UnsupportedOpError("group_norm backward of a parameter without a weight (left to "
                                 "eager)")
    shape = [d.full_extent for d in x.logical]
    spatial = B.num_elements(x, range(2, x.ndim))
    x4 = _float_compute(B.reshape(x, [shape[0], G, -1, spatial]))
    dy4 = _float_compute(B.reshape(dy, [shape[0], G, -1, spatial]))
    rows = [False, False, True, True]
    m4 = B.broadcast(_float_compute(mean), rows)
    r4 = B.broadcast(_float_compute(rstd), rows)
    x_hat = ew("mul", ew("sub", x4, m4), r4)
    w4 = None if w is None else B.broadcast(_float_compute(B.reshape(w, [G, -1])),
                                            [True, False, False, True])
    dx = dw = db = None
    if mask[0]:
        g = dy4 if w4 is None else ew("mul", dy4, w4)
        m = B.num_elements(x4, [2, 3])
        sum_g = B.reduction("sum", g, [2, 3], keepdim=True)
        sum_gx = B.reduction("sum", ew("mul", g, x_hat), [2, 3], keepdim=True)
        inner = ew("sub", ew("sub", ew("mul", g, m), sum_g), ew("mul", x_hat, sum_gx))
        dx = _out(B.reshape(ew("mul", ew("div", r4, m), inner), shape), x)
    if mask[1]:
        dw = _out(B.reshape(B.reduction("sum", ew("mul", dy4, x_hat), [0, 3]), [shape[1]]), w)
    if mask[2]:
        db = _out(B.reshape(B.reduction("sum", dy4, [0, 3]), [shape[1]]), w)
    return dx, dw, db


# ---- batch norm -----------------------------------------------------------------------------------
def _channel_dims(x):
    return [i for i in range(x.ndim) if i != 1]


@lowers("aten::native_batch_norm_backward", op_class=NORMALIZATION, n_args=(10,),
        const_args=(7, 8, 9))
def _batch_norm_backward(dy, x, w, rmean, rvar, save_mean, save_invstd, train, eps, mask):
    """(dx, dweight, dbias), per channel over the other axes. Training: with the batch's
    statistics, dx = (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean))) * invstd * w;
    eval: dx = dy * invstd * w with the running statistics. dweight = sum(dy * (x - mean)) *
    invstd, dbias = sum(dy)."""
    _floating("batch_norm backward", dy, x)
    dims = _channel_dims(x)
    xc, dyc = _float_compute(x), _float_compute(dy)
    if train:
        if save_mean is None or save_invstd is None:
            raise UnsupportedOpError("batch_norm backward without saved statistics")
        mean, invstd = _float_compute(save_mean), _float_compute(save_invstd)
    else:
        if rmean is None or rvar is None:
            raise UnsupportedOpError("batch_norm backward in eval mode without running statistics")
        mean = _float_compute(rmean)
        invstd = ew("rsqrt", ew("add", _float_compute(rvar), float(eps)))
    centered = ew("sub", xc, _channel_param(mean, xc))
    sum_dy = B.reduction("sum", dyc, dims)
    dot = B.reduction("sum", ew("mul", dyc, centered), dims)
    dx = dw = db = None
    if mask[0]:
        scale = _channel_param(invstd if w is None else ew("mul", invstd, _float_compute(w)), xc)
        if train:
            n = B.num_elements(xc, dims)
            grad_mean = _channel_param(ew("div", sum_dy, n), xc)
            proj = _channel_param(ew("div", ew("mul", ew("mul", dot, invstd), invstd), n), xc)
            dx = ew("mul", ew("sub", ew("sub", dyc, ew("mul", centered, proj)), grad_mean), scale)
        else:
            dx = ew("mul", dyc, scale)
        dx = _out(dx, x)
    if mask[1]:
        dw = ew("mul", dot, invstd)
        dw = _out(dw, w) if w is not None else dw
    if mask[2]:
        db = sum_dy if w is None else _out(sum_dy, w)
    return dx, dw, db


@lowers("aten::nll_loss_backward", n_args=(7,), const_args=(4, 5))
def _nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    """The gradient of nll_loss for [N, C] log-probabilities and int64 class indices, as eager
    writes it into zeros: -(grad_output / total_weight) (mean), -grad_output (sum) or
    -grad_output[i] (none) where the class is the row's target and the target is not
    ignore_index, 0 elsewhere. The class is compared with an iota, so the gradient is computed
    where it is read (the log_softmax backward after it sums it per row) instead of a zero fill
    and a scatter through memory. A target out of [0, C) gives a NaN row (eager raises there).
    With class weights the target's gradient is times weight[target] (picked per row)."""
    return _nll_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight,
                         2, "nll_loss_backward")


@lowers("aten::nll_loss2d_backward", n_args=(7,), const_args=(4, 5))
def _nll_loss2d_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    """nll_loss_backward of [N, C, H, W] log-probabilities and [N, H, W] targets: the same
    gradient at each position's target class (axis 1)."""
    return _nll_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight,
                         4, "nll_loss2d_backward")


def _nll_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight,
                  ndim: int, what: str):
    if not isinstance(x, TensorView) or x.ndim != ndim or not x.dtype.is_floating:
        shape = "[N, C]" if ndim == 2 else "[N, C, H, W]"
        raise UnsupportedOpError(f"{what} of other than {shape} floating inputs")
    check_weight(weight, x, what)
    if not isinstance(target, TensorView) or target.ndim != ndim - 1 or \
            target.dtype.name != "Int":
        raise UnsupportedOpError(f"{what}: class-index targets must be int64 of rank {ndim - 1}")
    if reduction not in (0, 1, 2):
        raise UnsupportedOpError(f"{what}: reduction {reduction!r}")
    along = [i == 1 for i in range(ndim)]           # a per-position value along the classes
    if reduction == 1:
        grad = ew("neg", ew("div", grad_output, total_weight))
    elif reduction == 2:
        grad = ew("neg", grad_output)
    else:
        if not isinstance(grad_output, TensorView) or grad_output.ndim != ndim - 1:
            raise UnsupportedOpError(f"{what}: reduction none needs a gradient of the "
                                     f"target's shape")
        grad = B.broadcast(ew("neg", grad_output), along)
    onehot = one_hot(target, x.logical[1].full_extent)
    t = B.broadcast(target, along)
    in_range, valid = _target_masks(t, x.logical[1].full_extent, ignore_index)
    zero = B.constant(0.0, x.dtype)
    grad = B.cast(grad, x.dtype)
    if weight is not None:          # weight[target] * grad, rounded as eager's x.dtype product
        w = target_weights(weight, target, onehot, ignore_index, x.dtype)
        grad = ew("mul", B.broadcast(w, along), grad)
    out = ew("where", onehot, grad, zero)
    return ew("where", valid, ew("where", in_range, out, B.constant(float("nan"), x.dtype)), zero)
