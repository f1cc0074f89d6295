"""Lowerings of reductions and normalizations (sum, mean, var, std, amax/amin, softmax,
log_softmax, batch_norm, layer_norm).

Normalizations are written with the builder's reductions and elementwise ops in the same order of
operations as PyTorch's reference formulas; nothing is reassociated.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_pointwise import _dtype
from .registry import NORMALIZATION, POINTWISE, REDUCTION, lowers

ew = B.elementwise


def _dims(dims, x: TensorView) -> list[int]:
    if dims is None or dims == []:
        return list(range(x.ndim))
    if isinstance(dims, int):
        return [dims]
    if not all(isinstance(d, int) for d in dims):
        raise UnsupportedOpError(f"reduction dims must be constants, got {dims!r}")
    return list(dims)


@lowers("aten::sum", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _sum(x, *args):
    if len(args) == 1:                       # sum(x, dtype)
        return B.reduction("sum", x, None, False, _opt_dtype(args[0]))
    dims, keepdim, dtype = (list(args) + [None, False, None])[:3] if args else (None, False, None)
    return B.reduction("sum", x, _dims(dims, x), bool(keepdim), _opt_dtype(dtype))


def _opt_dtype(code):
    return None if code is None else _dtype(code)


@lowers("aten::mean", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _mean(x, *args):
    if len(args) == 1:
        return B.mean(x, None, False, _opt_dtype(args[0]))
    dims, keepdim, dtype = (list(args) + [None, False, None])[:3]
    return B.mean(x, _dims(dims, x), bool(keepdim), _opt_dtype(dtype))


@lowers("aten::amax", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(1, 2))
def _amax(x, dims=None, keepdim=False):
    return B.reduction("max", x, _dims(dims, x), bool(keepdim))


@lowers("aten::amin", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(1, 2))
def _amin(x, dims=None, keepdim=False):
    return B.reduction("min", x, _dims(dims, x), bool(keepdim))


def _correction(args) -> tuple:
    """var/std arguments after x: (dims, unbiased, keepdim) or (dims, *, correction, keepdim)."""
    dims, second, keepdim = (list(args) + [None, None, False])[:3]
    if isinstance(second, bool) or second is None:
        correction = 1 if second is None or second else 0
    else:
        correction = second
    return dims, correction, bool(keepdim)


@lowers("aten::var", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _var(x, *args):
    if len(args) == 1 and isinstance(args[0], bool):    # var(x, unbiased)
        args = (None, args[0], False)
    dims, correction, keepdim = _correction(args)
    return B.var_mean(x, _dims(dims, x), correction, keepdim)[0]


@lowers("aten::std", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _std(x, *args):
    return ew("sqrt", _var(x, *args))


@lowers("aten::softmax", "aten::_softmax", op_class=NORMALIZATION, n_args=(2, 3), const_args=(1, 2))
def _softmax(x, dim, dtype=None):
    x = _softmax_input(x, dtype)
    m = B.reduction("max", x, [dim], keepdim=True)
    e = ew("exp", ew("sub", x, m))
    return ew("div", e, B.reduction("sum", e, [dim], keepdim=True))


@lowers("aten::log_softmax", "aten::_log_softmax", op_class=NORMALIZATION, n_args=(2, 3),
        const_args=(1, 2))
def _log_softmax(x, dim, dtype=None):
    x = _softmax_input(x, dtype)
    m = B.reduction("max", x, [dim], keepdim=True)
    shifted = ew("sub", x, m)
    return ew("sub", shifted, ew("log", B.reduction("sum", ew("exp", shifted), [dim], keepdim=True)))


def _softmax_input(x, dtype):
    # aten::_softmax's third argument is half_to_float (bool); softmax's is an optional dtype.
    if dtype is True:
        return B.cast(x, DataType.Float)
    if dtype is None or dtype is False:
        return x
    return B.cast(x, _dtype(dtype))


def _channel_param(p, x: TensorView):
    """A [C] parameter broadcast to x's rank along axis 1."""
    return B.broadcast(p, [i != 1 for i in range(x.ndim)])


def _batch_norm_class(node) -> str:
    """Inference batch norm (training a constant False) is pointwise: per-channel scale and
    shift with running statistics. Training mode reduces over the batch."""
    from .lower import constant_value, is_constant
    if node.kind == "aten::_native_batch_norm_legit_no_training":
        return POINTWISE
    training = node.inputs[5] if len(node.inputs) > 5 else None
    # TorchScript prints a bool constant as `prim::Constant[value=0]()`: 0 and False alike.
    if training is not None and is_constant(training) and constant_value(training) in (False, 0):
        return POINTWISE
    return NORMALIZATION


@lowers("aten::batch_norm", op_class=NORMALIZATION, n_args=(9,), const_args=(5, 6, 7, 8),
        classify=_batch_norm_class)
def _batch_norm(x, w, b, rmean, rvar, training, momentum, eps, cudnn_enabled):
    return _native_batch_norm(x, w, b, rmean, rvar, training, momentum, eps)[0]


@lowers("aten::native_batch_norm", "aten::_native_batch_norm_legit_no_training",
        op_class=NORMALIZATION, n_args=(8, 6), const_args=(5, 6, 7), classify=_batch_norm_class)
def _native_batch_norm(x, w, b, rmean, rvar, training, momentum=None, eps=None):
    if eps is None:              # _native_batch_norm_legit_no_training(x, w, b, rm, rv, momentum, eps)
        training, momentum, eps = False, training, momentum
    out_dtype = x.dtype
    if training:
        if rmean is not None or rvar is not None:
            raise UnsupportedOpError("batch_norm in training mode updates running stats in place; "
                                     "left to eager")
        dims = [i for i in range(x.ndim) if i != 1]
        var, mean = B.var_mean(x, dims, correction=0, keepdim=True)
        invstd = ew("rsqrt", ew("add", var, float(eps)))
        y = ew("mul", ew("sub", x, mean), invstd)
        save_mean, save_invstd = B.squeeze(mean, dims), B.squeeze(invstd, dims)
    else:
        if rmean is None or rvar is None:
            raise UnsupportedOpError("batch_norm in inference mode needs running_mean and running_var")
        out_dtype = _inference_dtypes(x, (w, b, rmean, rvar))
        # Half/BFloat16 inputs compute in float (with float parameters) and round at the end.
        x, w, b, rmean, rvar = (B.cast(v, out_dtype.compute) if isinstance(v, TensorView) else v
                                for v in (x, w, b, rmean, rvar))
        centered = ew("sub", x, _channel_param(rmean, x))
        invstd = ew("rsqrt", ew("add", rvar, float(eps)))
        y = ew("mul", centered, _channel_param(invstd, x))
        save_mean = save_invstd = None
    if w is not None:
        y = ew("mul", y, _channel_param(w, x))
    if b is not None:
        y = ew("add", y, _channel_param(b, x))
    return B.cast(y, out_dtype), save_mean, save_invstd


def _inference_dtypes(x: TensorView, params) -> DataType:
    """Eager (CPU) batch_norm: the result has x's dtype; the parameters share one dtype, which is
    x's, or Float for a Half/BFloat16 x (mixed precision); anything else raises in eager."""
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"batch_norm of a {x.dtype.name} input (eager raises)")
    p_dtypes = {p.dtype for p in params if isinstance(p, TensorView)}
    if any(p is not None and not isinstance(p, TensorView) for p in params):
        raise UnsupportedOpError("batch_norm: a parameter is not a tensor")
    ok = p_dtypes <= {x.dtype} or (x.dtype.is_reduced_float and p_dtypes == {DataType.Float})
    if not ok:
        names = sorted(d.name for d in p_dtypes)
        raise UnsupportedOpError(f"batch_norm: {x.dtype.name} input with {names} parameters "
                                 "(eager's mixed-dtype rules; left to eager)")
    return x.dtype


@lowers("aten::layer_norm", op_class=NORMALIZATION, n_args=(6,), const_args=(1, 4, 5))
def _layer_norm(x, shape, w, b, eps, cudnn_enable):
    return _native_layer_norm(x, shape, w, b, eps)[0]


@lowers("aten::native_layer_norm", op_class=NORMALIZATION, n_args=(5,), const_args=(1, 4))
def _native_layer_norm(x, shape, w, b, eps):
    k = len(shape)
    dims = list(range(x.ndim - k, x.ndim))
    var, mean = B.var_mean(x, dims, correction=0, keepdim=True)
    rstd = ew("rsqrt", ew("add", var, float(eps)))
    y = ew("mul", ew("sub", x, mean), rstd)
    if w is not None:
        y = ew("mul", y, w)
    if b is not None:
        y = ew("add", y, b)
    return y, mean, rstd
