"""Lowerings of reductions and normalizations: sum, mean, var, std, var_mean, std_mean, amax,
amin, prod, max / min (full, .dim values and indices, .other), logsumexp, sum_to_size, _grad_sum_to_size, softmax,
log_softmax, layer_norm / native_layer_norm, rms_norm, batch_norm / native_batch_norm, group_norm
(the losses are in aten_loss.py, argmax / argmin in aten_arg_reduction.py).

Normalizations are written with the builder's reductions and elementwise ops in the order of
operations of PyTorch's own kernels, so the results are eager's within rounding:
- half / bfloat16 inputs are computed in float (eager's accumulation type) and rounded once at
  the end (softmax, log_softmax, layer_norm, rms_norm's normalization, batch_norm, mean, var);
- statistics come from one Welford pass (builder.var_mean / builder.welford), not two;
- nothing is reassociated.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_pointwise import _dtype
from .aten_arg_reduction import arg_positions
from .device import device_type
from .registry import NORMALIZATION, POINTWISE, REDUCTION, lowers

ew = B.elementwise


def _dims(dims, x: TensorView) -> list[int]:
    if dims is None or dims == []:
        return list(range(x.ndim))
    if isinstance(dims, int) and not isinstance(dims, bool):
        return [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        raise UnsupportedOpError(f"reduction dims must be constants, got {dims!r}")
    return list(dims)


def _opt_dtype(code):
    return None if code is None else _dtype(code)


def _float_compute(x: TensorView) -> TensorView:
    """x in eager's accumulation type: float for half / bfloat16, else x."""
    return B.cast(x, DataType.Float) if x.dtype.is_reduced_float else x


@lowers("aten::sum", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _sum(x, *args):
    if len(args) == 1:                       # sum(x, dtype)
        return B.reduction("sum", x, None, False, _opt_dtype(args[0]))
    dims, keepdim, dtype = (list(args) + [None, False, None])[:3] if args else (None, False, None)
    return B.reduction("sum", x, _dims(dims, x), bool(keepdim), _opt_dtype(dtype))


@lowers("aten::prod", op_class=REDUCTION, n_args=(2, 4), const_args=(1, 2, 3))
def _prod(x, *args):
    """prod(x, dtype) of every element, prod(x, dim, keepdim, dtype) over one dim (integers and
    bools as int64, half / bfloat16 accumulated in float, as sum)."""
    if len(args) == 1:
        return B.reduction("prod", x, None, False, _opt_dtype(args[0]))
    dim, keepdim, dtype = args
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise UnsupportedOpError(f"prod: dim must be a constant, got {dim!r}")
    return B.reduction("prod", x, [dim], bool(keepdim), _opt_dtype(dtype))


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


def _max_min_class(node) -> str:
    from ..torchscript.types import TensorType
    if len(node.inputs) == 2 and isinstance(node.inputs[1].type, TensorType):
        return POINTWISE                                     # max.other: elementwise maximum
    return REDUCTION


def _max_min(op, binary):
    def lower(x, other=None, keepdim=False):
        if isinstance(other, TensorView):
            return ew(binary, x, other)
        if other is None:                                    # max(x): every element
            return B.reduction(op, x, None, False)
        if not isinstance(other, int) or isinstance(other, bool):
            raise UnsupportedOpError(f"{op}.dim: dim must be a constant, got {other!r}")
        # max.dim / min.dim: (values, indices), the indices argmax's (a graph that reads only
        # the values leaves them out of every kernel: the schedulers take the exprs an output
        # uses). A bool x: its values only (a use of its indices keeps the aten call).
        if x.ndim == 0 or not (x.dtype.is_floating or x.dtype.is_integral):
            return B.reduction(op, x, [other], bool(keepdim)), None
        if not -x.ndim <= other < x.ndim:
            raise UnsupportedOpError(f"{op}.dim: dim {other} out of range")
        d = other % x.ndim                   # the indices' extreme is the values with keepdim
        m = B.reduction(op, x, [d], True)
        values = m if keepdim else B.reduction(op, x, [d], False)
        return values, arg_positions(x, [d], m, bool(keepdim))
    return lower


_lowers_max = lowers("aten::max", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(2,),
                     classify=_max_min_class)(_max_min("max", "maximum"))
_lowers_min = lowers("aten::min", op_class=REDUCTION, n_args=(1, 2, 3), const_args=(2,),
                     classify=_max_min_class)(_max_min("min", "minimum"))


def _correction(args) -> tuple:
    """var/std arguments after x: (dims, unbiased, keepdim) or (dims, *, correction, keepdim)."""
    dims, second, keepdim = (list(args) + [None, None, False])[:3]
    if isinstance(second, bool) or second is None:
        correction = 1 if second is None or second else 0
    else:
        correction = second
    return dims, correction, bool(keepdim)


def _var_mean_args(x, args):
    if len(args) == 1 and isinstance(args[0], bool):    # var(x, unbiased)
        args = (None, args[0], False)
    dims, correction, keepdim = _correction(args)
    return B.var_mean(x, _dims(dims, x), correction, keepdim)


@lowers("aten::var", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _var(x, *args):
    return _var_mean_args(x, args)[0]


@lowers("aten::std", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _std(x, *args):
    return ew("sqrt", _var(x, *args))


@lowers("aten::var_mean", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _var_mean(x, *args):
    return _var_mean_args(x, args)


@lowers("aten::std_mean", op_class=REDUCTION, n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _std_mean(x, *args):
    var, mean = _var_mean_args(x, args)
    return ew("sqrt", var), mean


@lowers("aten::logsumexp", op_class=REDUCTION, n_args=(2, 3), const_args=(1, 2))
def _logsumexp(x, dims, keepdim=False):
    """As eager: log(sum(exp(x - m))) + m with m = amax(x); where m is infinite, m itself
    (eager shifts by 0 there: a row of -inf gives -inf, a row holding +inf gives +inf, not NaN);
    an integer or bool x in the default dtype, as eager computes it. Written with the plain max inside the exp, so the max and the sum are one online pair
    (reduction_graph): one pass over the row."""
    if x.dtype.is_complex:
        raise UnsupportedOpError(f"logsumexp of a {x.dtype.name} tensor (left to eager)")
    if not x.dtype.is_floating:      # eager: of x in the default dtype (ints and bools)
        import torch
        x = B.cast(x, DataType.from_torch(torch.get_default_dtype()))
    dims = _dims(dims, x)
    m = B.reduction("max", x, dims, keepdim=True)
    s = B.reduction("sum", ew("exp", ew("sub", x, m)), dims, True)
    out = ew("where", ew("eq", ew("abs", m), float("inf")), m, ew("add", ew("log", s), m))
    return out if keepdim else B.squeeze(out, dims)


def _sum_to(x, size):
    """Sum x down to `size` (a constant list): its leading extra axes, and the axes where size
    is 1 (kept as size 1)."""
    if size is None:
        return x
    if not isinstance(size, (list, tuple)) or not all(isinstance(s, int) for s in size):
        raise UnsupportedOpError(f"sum_to_size: size must be a constant list, got {size!r}")
    lead = x.ndim - len(size)
    if lead < 0:
        raise UnsupportedOpError(f"sum_to_size: size {list(size)} has more axes than the tensor")
    keep = [lead + i for i, s in enumerate(size) if s == 1 and not x.logical[lead + i].is_broadcast]
    if keep:
        x = B.reduction("sum", x, keep, keepdim=True)
    if lead:
        x = B.reduction("sum", x, list(range(lead)), keepdim=False)
    return x


@lowers("aten::sum_to_size", op_class=REDUCTION, n_args=(2,), const_args=(1,))
def _sum_to_size(x, size):
    return _sum_to(x, size)


@lowers("aten::_grad_sum_to_size", op_class=REDUCTION, n_args=(2,), const_args=(1,))
def _grad_sum_to_size(x, size):
    return _sum_to(x, size)


def _softmax_dtypes(x, dtype):
    """(input in the compute dtype, output dtype). aten::_softmax's third argument is
    half_to_float (bool); softmax's an optional dtype the input is cast to first."""
    if dtype is True:
        out = DataType.Float
    elif dtype is None or dtype is False:
        out = x.dtype
    else:
        out = _dtype(dtype)
        x = B.cast(x, out)
    if not out.is_floating:
        raise UnsupportedOpError(f"softmax of a {out.name} tensor (eager raises)")
    return _float_compute(x), out


@lowers("aten::softmax", "aten::_softmax", op_class=NORMALIZATION, n_args=(2, 3), const_args=(1, 2))
def _softmax(x, dim, dtype=None):
    xc, out = _softmax_dtypes(x, dtype)
    m = B.reduction("max", xc, [dim], keepdim=True)
    e = ew("exp", ew("sub", xc, m))
    return B.cast(ew("div", e, B.reduction("sum", e, [dim], keepdim=True)), out)


@lowers("aten::log_softmax", "aten::_log_softmax", op_class=NORMALIZATION, n_args=(2, 3),
        const_args=(1, 2))
def _log_softmax(x, dim, dtype=None):
    xc, out = _softmax_dtypes(x, dtype)
    m = B.reduction("max", xc, [dim], keepdim=True)
    shifted = ew("sub", xc, m)
    lse = ew("log", B.reduction("sum", ew("exp", shifted), [dim], keepdim=True))
    return B.cast(ew("sub", shifted, lse), out)


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


@lowers("aten::batch_norm", op_class=NORMALIZATION, n_args=(9,), const_args=(5, 7, 8),
        classify=_batch_norm_class)
def _batch_norm(x, w, b, rmean, rvar, training, momentum, eps, cudnn_enabled):
    return _native_batch_norm(x, w, b, rmean, rvar, training, momentum, eps)[0]


@lowers("aten::native_batch_norm", op_class=NORMALIZATION, n_args=(8,), const_args=(5, 7),
        classify=_batch_norm_class)
def _native_batch_norm(x, w, b, rmean, rvar, training, momentum, eps):
    if training:
        return _batch_norm_training(x, w, b, rmean, rvar, momentum, eps)
    if rmean is None or rvar is None:
        raise UnsupportedOpError("batch_norm in inference mode needs running_mean and running_var")
    out_dtype = _inference_dtypes(x, (w, b, rmean, rvar))
    # Half/BFloat16 inputs compute in float (with float parameters) and round at the end.
    x, w, b, rmean, rvar = (B.cast(v, out_dtype.compute) if isinstance(v, TensorView) else v
                            for v in (x, w, b, rmean, rvar))
    centered = ew("sub", x, _channel_param(rmean, x))
    invstd = ew("rsqrt", ew("add", rvar, float(eps)))
    y = ew("mul", centered, _channel_param(invstd, x))
    y = _affine(y, w, b, x)
    return B.cast(y, out_dtype), None, None


@lowers("aten::_native_batch_norm_legit_no_training", op_class=NORMALIZATION, n_args=(7,),
        const_args=(5, 6), classify=_batch_norm_class)
def _batch_norm_no_training(x, w, b, rmean, rvar, momentum, eps):
    """An eval-mode batch norm (AOTAutograd's inference graphs): pointwise with the running
    statistics; eager's second and third results are empty tensors, not produced here (a graph
    that reads them leaves the region to eager, with the reason)."""
    return _native_batch_norm(x, w, b, rmean, rvar, False, momentum, eps)


def _affine(y, w, b, x):
    if w is not None:
        y = ew("mul", y, _channel_param(w, x))
    if b is not None:
        y = ew("add", y, _channel_param(b, x))
    return y


def _batch_norm_training(x, w, b, rmean, rvar, momentum, eps, in_place=True):
    """Statistics of this batch (one Welford pass over every axis but the channels, in float
    for half / bfloat16): y = (x - mean) * invstd * w + b; (y, mean, invstd). Running
    statistics, when given, are updated as eager does: running = momentum * batch +
    (1 - momentum) * running, with the unbiased variance m2 / (n - 1); `in_place`: written into
    the running tensors (in-place outputs of the fusion, `Fusion.aliases`: TorchScript's
    native_batch_norm), else returned as two more results, None where a running statistic is
    not given (the functional overload of AOTAutograd's graphs)."""
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"batch_norm of a {x.dtype.name} input (eager raises)")
    dims = [i for i in range(x.ndim) if i != 1]
    flags = [i != 1 for i in range(x.ndim)]
    xc = _float_compute(x)
    avg, m2, _ = B.welford(xc, dims)
    n = B.num_elements(xc, dims)
    invstd = ew("rsqrt", ew("add", ew("div", m2, n), float(eps)))
    y = ew("mul", ew("sub", xc, B.broadcast(avg, flags)), B.broadcast(invstd, flags))
    y = _affine(y, w, b, xc)
    updated = []
    for running, batch in ((rmean, avg), (rvar, None)):
        if running is None:
            updated.append(None)
            continue
        if batch is None:
            batch = ew("div", m2, ew("sub", n, B.constant(1)))
        updated.append(_update_running(running, batch, momentum, in_place))
    y = B.cast(y, x.dtype)
    return (y, avg, invstd) if in_place else (y, avg, invstd, *updated)


def _update_running(running, batch, momentum, in_place=True):
    """running <- momentum * batch + (1 - momentum) * running, computed in float for half /
    bfloat16 statistics; written into the running tensor (an in-place output) when `in_place`.
    Returns the new value."""
    from ...ir.fusion import Fusion
    fusion = Fusion.current()
    if in_place and (not isinstance(running, TensorView) or running not in fusion.inputs):
        raise UnsupportedOpError("batch_norm: a running statistic computed in the group cannot "
                                 "be updated in place")
    if not isinstance(running, TensorView):
        raise UnsupportedOpError("batch_norm: a running statistic is not a tensor")
    if not running.dtype.is_floating or running.ndim != 1:
        raise UnsupportedOpError(f"batch_norm: running statistic of {running.dtype.name}, rank "
                                 f"{running.ndim}")
    if momentum is None:
        raise UnsupportedOpError("batch_norm: momentum None with running statistics")
    keep = ew("sub", B.constant(1.0), momentum) if not isinstance(momentum, (int, float)) \
        else 1.0 - float(momentum)
    new = ew("add", ew("mul", B.cast(batch, running.dtype.compute), momentum),
             ew("mul", _float_compute(running), keep))
    new = B.cast(new, running.dtype)
    if in_place:
        fusion.add_output(new)
        fusion.aliases[new] = running
    return new


@lowers("aten::_native_batch_norm_legit_functional", op_class=NORMALIZATION, n_args=(8,),
        const_args=(5, 6, 7))
def _batch_norm_functional(x, w, b, rmean, rvar, training, momentum, eps):
    """AOTAutograd's functional training batch norm: (y, save_mean, save_invstd,
    new_running_mean, new_running_var), the running statistics new tensors (the graph copies
    them into the buffers)."""
    if not training:
        raise UnsupportedOpError("_native_batch_norm_legit_functional in eval mode")
    return _batch_norm_training(x, w, b, rmean, rvar, momentum, eps, in_place=False)


@lowers("aten::_native_batch_norm_legit", op_class=NORMALIZATION, n_args=(6,),
        const_args=(3, 4, 5))
def _batch_norm_no_stats(x, w, b, training, momentum, eps):
    """The `no_stats` overload (no running statistics): (y, save_mean, save_invstd)."""
    if not training:
        raise UnsupportedOpError("batch_norm without running statistics in eval mode")
    return _batch_norm_training(x, w, b, None, None, momentum, eps)


@lowers("aten::group_norm", op_class=NORMALIZATION, n_args=(6,), const_args=(1, 4, 5))
def _group_norm(x, groups, w, b, eps, cudnn_enabled):
    return _native_group_norm(x, w, b, None, None, None, groups, eps)[0]


@lowers("aten::native_group_norm", op_class=NORMALIZATION, n_args=(8,), const_args=(6, 7))
def _native_group_norm(x, w, b, n, c, hw, groups, eps):
    """x [N, C, *] seen as [N, G, C / G, prod(*)] (views of the input and of the output: host
    segments, no copy); one Welford pass per (n, g) row, in float for half / bfloat16; the
    per-channel weight and bias seen as [1, G, C / G, 1]. (out, mean [N, G], rstd [N, G])."""
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"group_norm of a {x.dtype.name} input (eager raises)")
    G = group_count(x, groups, "group_norm")
    out_dtype = _inference_dtypes(x, (w, b))
    shape = [d.full_extent for d in x.logical]
    spatial = B.num_elements(x, range(2, x.ndim))
    x4 = _float_compute(B.reshape(x, [shape[0], G, -1, spatial]))
    avg, m2, _ = B.welford(x4, [2, 3])
    var = ew("div", m2, B.num_elements(x4, [2, 3]))
    rstd = ew("rsqrt", ew("add", var, float(eps)))
    rows = [False, False, True, True]
    y = ew("mul", ew("sub", x4, B.broadcast(avg, rows)), B.broadcast(rstd, rows))
    for p, op in ((w, "mul"), (b, "add")):
        if p is not None:
            p4 = B.broadcast(B.cast(B.reshape(p, [G, -1]), out_dtype.compute),
                             [True, False, False, True])
            y = ew(op, y, p4)
    y = B.reshape(B.cast(y, out_dtype), shape)
    return y, B.cast(avg, x.dtype), B.cast(rstd, x.dtype)


def group_count(x: TensorView, groups, what: str) -> int:
    """The groups of a group norm (forward or backward) over x [N, C, *], checked: a rank of 2
    or more, a count that divides the channels (eager raises otherwise)."""
    if x.ndim < 2:
        raise UnsupportedOpError(f"{what} of a rank-{x.ndim} input (eager raises)")
    G = int(groups)
    ch = x.logical[1].known_size()
    if G <= 0 or (ch is not None and ch % G):
        raise UnsupportedOpError(f"{what}: {G} groups do not divide the channels (eager raises)")
    return G


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
    """(y, mean, rstd) with Welford statistics over the last len(shape) axes, computed in float
    for half / bfloat16 and y rounded once. Eager returns the statistics of a half input in half
    on the CPU and in float on CUDA: so does this lowering where the frontend names the device
    (lowering/device.py); where it does not, a group that uses them for such inputs is left to
    eager."""
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"layer_norm of a {x.dtype.name} input (eager raises)")
    k = len(shape)
    dims = list(range(x.ndim - k, x.ndim))
    xc = _float_compute(x)
    var, mean = B.var_mean(xc, dims, correction=0, keepdim=True)
    rstd = ew("rsqrt", ew("add", var, float(eps)))
    y = ew("mul", ew("sub", xc, mean), rstd)
    if w is not None:
        y = ew("mul", y, w)
    if b is not None:
        y = ew("add", y, b)
    if x.dtype.is_reduced_float:
        dev = device_type()
        if dev == "cuda":
            return B.cast(y, x.dtype), mean, rstd
        if dev == "cpu":
            return B.cast(y, x.dtype), B.cast(mean, x.dtype), B.cast(rstd, x.dtype)
        return B.cast(y, x.dtype), None, None
    return y, mean, rstd


@lowers("aten::rms_norm", op_class=NORMALIZATION, n_args=(4,), const_args=(1, 3))
def _rms_norm(x, shape, w, eps):
    """As eager's rms_norm: x in float, x * rsqrt(mean(x * x) + eps) rounded to x's dtype, then
    times the weight (eps None: float epsilon)."""
    if not x.dtype.is_floating:
        raise UnsupportedOpError(f"rms_norm of a {x.dtype.name} input (eager raises)")
    dims = list(range(x.ndim - len(shape), x.ndim))
    xc = _float_compute(x)
    if eps is None:
        import torch
        eps = torch.finfo(xc.dtype.torch).eps
    ms = B.mean(ew("mul", xc, xc), dims, keepdim=True)
    y = B.cast(ew("mul", xc, ew("rsqrt", ew("add", ms, float(eps)))), x.dtype)
    return ew("mul", y, w) if w is not None else y
