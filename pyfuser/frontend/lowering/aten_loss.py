"""Lowerings of the classification losses: `nll_loss_forward` (and `nll_loss2d_forward`, the
classes at dim 1 of [N, C, H, W]) and `cross_entropy_loss` (log_softmax
and the picked target's negative log-likelihood in the pass that reads the row), and
`binary_cross_entropy_with_logits` and `binary_cross_entropy` (of probabilities; and its
backward) (pointwise, then the mean or sum).

Written, as aten_reduction's normalizations are, with the builder's reductions and elementwise
ops in the order of PyTorch's own kernels: half / bfloat16 logits are computed in float and the
loss is rounded once; the target's logit is a sum over the row where a class iota equals the
target (no gather op; the reduction kernels read that one element, reduction_patterns.Pick); a row
whose target is `ignore_index` adds 0 to the loss and is not
counted in a mean; a class index out of range gives NaN (eager raises there). Class weights
(a [C] tensor of the input's dtype) are picked per row at the target (weight[target], as the
target's logit is): they scale the row's loss and make the mean's denominator. Label
smoothing (class-index targets) adds eager's smoothing term, each step rounded as eager's
tensors are. Class weights or label smoothing with probability targets are left to eager.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_reduction import _float_compute, ew
from .registry import NORMALIZATION, lowers


def _class_axis(ndim: int, of_classes: bool) -> list:
    """broadcast() flags that put a [C] vector (of_classes) or a target [N, *S] along the
    class axis 1 of a rank-`ndim` input [N, C, *S]."""
    return [(i != 1) if of_classes else (i == 1) for i in range(ndim)]


def one_hot(target: TensorView, classes) -> TensorView:
    """[N, C, *S] bool for targets [N, *S]: the class (an iota over the extent `classes`,
    axis 1) is the position's target."""
    n = target.ndim + 1
    iota = B.broadcast(B.iota(classes, 0, 1, DataType.Int), _class_axis(n, True))
    return ew("eq", iota, B.broadcast(target, _class_axis(n, False)))


def _pick(xc: TensorView, onehot: TensorView) -> TensorView:
    """[N, *S]: xc at each position's target class for [N, C, *S] xc (or a [C] vector
    broadcast to [1, C, 1...]), as a sum over the classes of xc where `onehot` (one_hot)
    holds: exactly that element, 0 for a class out of range (no gather op in the Fusion; the
    reduction kernels read it as that one element: reduction_patterns.Pick). Picks of one
    one_hot share it, so their kernels read the same tensors and the segmenter keeps them
    together."""
    return B.reduction("sum", ew("where", onehot, xc, 0.0), [1])


def _target_masks(target: TensorView, classes, ignore_index):
    """(in_range, valid) for class-index targets, elementwise on `target` (of any shape): the
    target is a class in [0, classes) the row has; it is not ignore_index. nll_loss and its
    backward give NaN where a target is valid but out of range (eager raises there) and 0
    where it is ignored; ignore_index itself may be out of range (eager's -100)."""
    in_range = ew("logical_and", ew("ge", target, 0), ew("lt", target, classes))
    valid = ew("ne", target, int(ignore_index))
    return in_range, valid


def target_weights(weight, target: TensorView, onehot: TensorView, ignore_index, dtype):
    """[N] for [N] targets: weight[target] in `dtype` where the target is not ignore_index,
    0 where it is or where it is out of [0, C): a pick (the sum over the classes of the
    weight where the class is the target, `onehot`, the logits' C classes; the reduction
    kernels read it as one element), not a lookup, whose index must be read from memory and
    may not be out of range."""
    picked = _pick(B.broadcast(B.cast(weight, dtype), _class_axis(onehot.ndim, True)), onehot)
    return ew("where", ew("ne", target, int(ignore_index)), picked, 0.0)


def check_weight(weight, x: TensorView, what: str) -> None:
    if weight is None:
        return
    if not isinstance(weight, TensorView) or weight.ndim != 1 or weight.dtype != x.dtype:
        raise UnsupportedOpError(f"{what}: class weights other than a [C] tensor of the "
                                 f"input's dtype (left to eager)")


def _row_losses(x: TensorView, picked: TensorView, target: TensorView, ignore_index,
                weight=None, onehot=None):
    """(per-row loss -picked, times the target's class weight where there are weights, 0 where
    the target is ignore_index, NaN where it is out of [0, C) (eager raises there); the total
    weight of the rows not ignored: their count, or their targets' class weights summed), in
    the compute dtype."""
    classes = x.logical[1].full_extent
    in_range, valid = _target_masks(target, classes, ignore_index)
    loss = ew("neg", picked)
    every = list(range(target.ndim))
    if weight is None:
        total = B.reduction("sum", B.cast(valid, picked.dtype), every)
    else:
        w = target_weights(weight, target, onehot, ignore_index, picked.dtype)
        loss, total = ew("mul", loss, w), B.reduction("sum", w, every)
    nan = ew("where", in_range, loss, float("nan"))
    return ew("where", valid, nan, 0.0), total


@lowers("aten::nll_loss_forward", op_class=NORMALIZATION, n_args=(5,), const_args=(3, 4))
def _nll_loss_forward(x, target, weight, reduction, ignore_index):
    """(output, total_weight) as eager's for [N, C] log-probabilities and int64 class indices:
    -x[i, target[i]] per row (0 where ignored, NaN for a class out of range: eager raises),
    summed, averaged over the rows not ignored (NaN when none is) or per row; total_weight the
    count of rows not ignored (0 for reduction none). The target's element is picked by an
    iota compare in the pass over the row (with the log_softmax before it, in one kernel).
    With class weights each row's loss is times weight[target], and total_weight (the mean's
    denominator) sums those weights instead of counting the rows."""
    return _nll(x, target, weight, reduction, ignore_index, 2, "nll_loss")


@lowers("aten::nll_loss2d_forward", op_class=NORMALIZATION, n_args=(5,), const_args=(3, 4))
def _nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    """nll_loss_forward of [N, C, H, W] log-probabilities and [N, H, W] targets (F.cross_entropy
    of inputs with the classes at dim 1 and more than one other axis: segmentation maps,
    [batch, classes, tokens] viewed as [N, C, 1, T]): every position's loss, picked along the
    class axis, then summed or averaged over all of them."""
    return _nll(x, target, weight, reduction, ignore_index, 4, "nll_loss2d")


def _nll(x, target, weight, reduction, ignore_index, ndim: int, what: str):
    if not isinstance(x, TensorView) or x.ndim != ndim or not x.dtype.is_floating:
        shape = "[N, C]" if ndim == 2 else "[N, C, H, W]"
        raise UnsupportedOpError(f"{what} of other than {shape} floating inputs (left to eager)")
    check_weight(weight, x, what)
    if not isinstance(target, TensorView) or target.ndim != ndim - 1 or \
            target.dtype is not DataType.Int:
        raise UnsupportedOpError(f"{what}: class-index targets must be int64 of rank {ndim - 1}")
    if reduction not in (0, 1, 2):
        raise UnsupportedOpError(f"{what}: reduction {reduction!r}")
    xc = _float_compute(x)
    onehot = one_hot(target, x.logical[1].full_extent)
    loss, total = _row_losses(x, _pick(xc, onehot), target, ignore_index, weight, onehot)
    if reduction == 0:
        return B.cast(loss, x.dtype), B.full([], 0.0, x.dtype)
    s = B.reduction("sum", loss, list(range(target.ndim)))
    out = s if reduction == 2 else ew("div", s, total)
    return B.cast(out, x.dtype), B.cast(total, x.dtype)


@lowers("aten::cross_entropy_loss", op_class=NORMALIZATION, n_args=(6,), const_args=(3, 4, 5))
def _cross_entropy(x, target, weight, reduction, ignore_index, label_smoothing):
    """As eager (log_softmax, then nll_loss) for [N, C] logits and class-index or probability
    targets: lp = (x - max) - log(sum(exp(x - max))) in float, rounded to x's dtype; the loss of
    a row is -lp[target] (picked by comparing the class index with an iota, so the logits are
    read once), 0 for ignore_index, NaN for a class index out of range (eager raises there);
    reduction none / sum / mean (over the rows not ignored). Class weights (class-index
    targets) weigh each row's loss by weight[target] and the mean by their sum, as nll_loss
    does; with probability targets they are left to eager. Label smoothing: `_smoothed`.

    With class indices, lp[target] is computed per row, not per element: the target's logit
    (a sum over the row of x where the class is the target: x[target] exactly) minus the max
    minus log(sum(exp(x - max))), the same operations as eager's log_softmax on that element.
    Every reduction over the classes (max and sum of exp as an online pair, the target's logit)
    then runs in one pass: one read of the logits, one combine. The mean over
    the rows is a second reduction domain: its own small kernel."""
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise UnsupportedOpError(f"cross_entropy: label_smoothing {label_smoothing!r} (eager "
                                 "raises outside [0, 1])")
    if label_smoothing and target.dtype.is_floating:
        raise UnsupportedOpError("cross_entropy with label smoothing and probability targets "
                                 "(left to eager)")
    if not isinstance(x, TensorView) or x.ndim != 2 or not x.dtype.is_floating:
        raise UnsupportedOpError("cross_entropy of other than [N, C] floating logits (left to eager)")
    check_weight(weight, x, "cross_entropy")
    if weight is not None and target.dtype.is_floating:
        raise UnsupportedOpError("cross_entropy with class weights and probability targets "
                                 "(left to eager)")
    if reduction not in (0, 1, 2):
        raise UnsupportedOpError(f"cross_entropy: reduction {reduction!r}")
    xc = _float_compute(x)
    m = B.reduction("max", xc, [1], keepdim=True)
    shifted = ew("sub", xc, m)
    lse = ew("log", B.reduction("sum", ew("exp", shifted), [1], keepdim=True))
    if target.dtype.is_floating:                           # class probabilities
        if target.ndim != 2:
            raise UnsupportedOpError("cross_entropy: probability targets must be [N, C]")
        lp = B.cast(B.cast(ew("sub", shifted, lse), x.dtype), xc.dtype)   # log_softmax, rounded
        loss = ew("neg", B.reduction("sum", ew("mul", lp, _float_compute(target)), [1]))
        total = B.num_elements(x, [0])
    else:
        if target.ndim != 1 or target.dtype is not DataType.Int:
            raise UnsupportedOpError("cross_entropy: class-index targets must be int64 [N]")
        onehot = one_hot(target, x.logical[1].full_extent)
        x_t = _pick(xc, onehot)                             # x[target] (or 0)
        lp_t = ew("sub", ew("sub", x_t, B.squeeze(m, [1])), B.squeeze(lse, [1]))
        picked = B.cast(B.cast(lp_t, x.dtype), xc.dtype)   # log_softmax's output, rounded
        loss, total = _row_losses(x, picked, target, ignore_index, weight, onehot)
    if reduction == 0:
        out = B.cast(loss, x.dtype)
    else:
        s = B.reduction("sum", loss, [0])
        out = B.cast(s if reduction == 2 else ew("div", s, total), x.dtype)
    if not label_smoothing:
        return out
    return _smoothed(x, ew("sub", shifted, lse), target, weight, reduction, ignore_index,
                     float(label_smoothing), out, total)


def _smoothed(x, lp, target, weight, reduction, ignore_index, eps: float, nll, total):
    """cross_entropy's label smoothing as eager writes it, each step rounded to x's dtype as
    eager's tensors are: (1 - eps) * nll + smooth * (eps / C), where a row's smooth loss is
    -sum over the classes of log_softmax(x) (times the class weights), 0 for an ignored
    target, then summed, or averaged over the rows not ignored (their total weight with
    weights: nll's denominator). The log-probabilities are each element's, rounded, so the
    row is read again after its max and sum: an inner-persistent kernel."""
    cd = lp.dtype

    def rnd(v):                              # a tensor of x's dtype, as eager's is
        return B.cast(B.cast(v, x.dtype), cd)
    lp = rnd(lp)
    if weight is not None:
        lp = rnd(ew("mul", lp, B.broadcast(B.cast(weight, cd), [True, False])))
    smooth = rnd(ew("neg", rnd(B.reduction("sum", lp, [1]))))
    smooth = ew("where", ew("eq", target, int(ignore_index)), 0.0, smooth)
    if reduction != 0:
        smooth = rnd(B.reduction("sum", smooth, [0]))
        if reduction == 1:          # eager's weight sum is a tensor of x's dtype, its count
            smooth = rnd(ew("div", smooth, total if weight is None else rnd(total)))  # int64
    classes = x.logical[1].full_extent
    scale = ew("div", B.constant(eps, DataType.Double), B.cast(classes, DataType.Double))
    part = rnd(ew("mul", smooth, B.cast(scale, cd)))
    keep = rnd(ew("mul", B.cast(nll, cd), 1.0 - eps))
    return B.cast(ew("add", keep, part), x.dtype)


@lowers("aten::binary_cross_entropy_with_logits", op_class=NORMALIZATION, n_args=(2, 3, 4, 5),
        const_args=(4,))
def _bce_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    """As eager's kernel, op by op: log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), times
    (pos_weight - 1) * target + 1 with a pos_weight; the loss (1 - target) * x - that, times the
    weight, then reduction none / mean (over every element) / sum. float32 and float64 only
    (eager rounds each step of a half / bfloat16 loss: left to eager)."""
    if not isinstance(x, TensorView) or not isinstance(target, TensorView):
        raise UnsupportedOpError("binary_cross_entropy_with_logits of a non-tensor (left to eager)")
    dtypes = {v.dtype for v in (x, target, weight, pos_weight) if isinstance(v, TensorView)}
    if len(dtypes) != 1 or x.dtype not in (DataType.Float, DataType.Double):
        raise UnsupportedOpError("binary_cross_entropy_with_logits of other than float32 / "
                                 "float64 tensors of one dtype (left to eager)")
    if reduction not in (0, 1, 2):
        raise UnsupportedOpError(f"binary_cross_entropy_with_logits: reduction {reduction!r}")
    log_sigmoid = ew("sub", ew("minimum", x, 0.0), ew("log1p", ew("exp", ew("neg", ew("abs", x)))))
    if pos_weight is not None:
        log_sigmoid = ew("mul", log_sigmoid, ew("add", ew("mul", ew("sub", pos_weight, 1.0),
                                                          target), 1.0))
    loss = ew("sub", ew("mul", ew("sub", B.constant(1.0), target), x), log_sigmoid)
    if weight is not None:
        loss = ew("mul", loss, weight)
    return reduce_loss(loss, reduction)


def check_float_loss(what: str, reduction, *xs) -> None:
    """The operands (None: an absent weight) are float32 or float64 tensors of one dtype and
    `reduction` is none / mean / sum (0 / 1 / 2), else the op is left to eager: the loss
    kernels whose half / bfloat16 forms eager computes step by step in that dtype."""
    ts = [x for x in xs if x is not None]
    if not all(isinstance(x, TensorView) for x in ts):
        raise UnsupportedOpError(f"{what} of a non-tensor (left to eager)")
    if len({x.dtype for x in ts}) != 1 or ts[0].dtype not in (DataType.Float, DataType.Double):
        raise UnsupportedOpError(f"{what} of other than float32 / float64 tensors of one dtype "
                                 f"(eager rounds each step of half / bfloat16: left to eager)")
    if reduction not in (0, 1, 2):
        raise UnsupportedOpError(f"{what}: reduction {reduction!r}")


def reduce_loss(loss: TensorView, reduction) -> TensorView:
    """A loss per element, or its mean or sum over every element (reduction 0 / 1 / 2)."""
    if reduction == 0:
        return loss
    return B.mean(loss, None, False) if reduction == 1 else B.reduction("sum", loss, None, False)


@lowers("aten::binary_cross_entropy", op_class=NORMALIZATION, n_args=(2, 3, 4), const_args=(3,))
def _bce(x, target, weight=None, reduction=1):
    """As eager's kernel: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100), times the
    weight, then reduction none / mean / sum. eager asserts 0 <= x <= 1 (on CUDA, a device
    assert); outside it the logs give NaN here. float32 / float64 only."""
    check_float_loss("binary_cross_entropy", reduction, x, target, weight)
    log_x = ew("maximum", ew("log", x), -100.0)
    log_1mx = ew("maximum", ew("log1p", ew("neg", x)), -100.0)
    loss = ew("sub", ew("mul", ew("sub", target, 1.0), log_1mx), ew("mul", target, log_x))
    if weight is not None:
        loss = ew("mul", loss, weight)
    return reduce_loss(loss, reduction)


@lowers("aten::binary_cross_entropy_backward", n_args=(3, 4, 5), const_args=(4,))
def _bce_backward(grad, x, target, weight=None, reduction=1):
    """grad * (x - t) / max((1 - x) * x, 1e-12), times the weight, divided by the element count
    for a mean, as eager's kernel and its two tensor ops after it (eager's CUDA division by the
    count multiplies by its reciprocal: pyfuser divides, as for any Python number)."""
    check_float_loss("binary_cross_entropy_backward", reduction, grad, x, target, weight)
    denom = ew("maximum", ew("mul", ew("sub", 1.0, x), x), 1e-12)
    g = ew("div", ew("mul", grad, ew("sub", x, target)), denom)
    if weight is not None:
        g = ew("mul", g, weight)
    if reduction == 1:
        g = ew("div", g, B.num_elements(x, list(range(x.ndim))))
    return g
