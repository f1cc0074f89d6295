"""When the channels-last pass (layout_channels_last.py) runs on a graph, and which ops it
converts for or lets see new strides:
- `_CONV_OPERANDS`: the operands of a 4-D convolution / convolution_backward read channels_last
  (the pass converts them);
- `_agnostic(target)`: ops whose values do not depend on their inputs' strides
  (`torch.Tag.pointwise` ones and `_AGNOSTIC`); every other op reads its inputs in the strides
  the original graph gave them;
- `_wanted(graph, kind)`: whether the pass converts a graph, and why not (the switch below).

Invariants: `_AGNOSTIC` lists only ops whose values do not depend on their inputs' strides (the
pass's invariant (a) rests on it); `_wanted` reads the graph (its nodes' example values) and
never changes it.

Switch: `PYFUSER_CHANNELS_LAST` = `0` (the default: off; measured on an H200, 2026-11-30,
ResNet-18 at batch 8, 224 px: the eval forward's kernels 90 -> 65 and cuDNN's transposes 50 ->
0, but its wall time 1219 -> 1626 µs a step, the 18 eager weight and image copies a call costing
more host time than the transposes' GPU time; a training step 7892 -> 14507 µs; and float32
training with the pass was farther from the float64 oracle than eager, cuDNN's NHWC kernels
picking other algorithms), `auto` (on for graphs with a 4-D convolution on a
CUDA device, static shapes, at most 300 nodes per convolution, Inductor's guard against a lone
convolution in a big graph, and no training batch norm: an eval forward, not yet a training
step, see below), `1` (on for any inference graph with a 4-D convolution and static shapes, any device: the
layout semantics are the same without cuDNN), `train` (every such graph, training too), `0`
(off).
Training batch norms are why `auto` leaves training graphs alone: their statistics (and the
backward's sums) reduce over (N, H, W), which over NHWC is an outer normalization; the
outer_persistent plan does not split the reduced axes over blocks, so a batch norm of 64
channels runs as one block streaming all N * H * W rows (ResNet-18 at batch 8, 224 px: 25088),
where the NCHW plan runs a block per channel. Until that scheduler splits such reductions
(partial sums across blocks, or a reduction kernel then a pointwise one: PYFUSER_OUTER_SPLIT=1
does the latter, schedule/reduction.py `_outer_grid`, not yet measured), the pass is correct for
training but slower there, and on an H200 (2026-11-30, float32, TF32 off) ResNet-18's training
step with the pass gave conv weight gradients 13x farther from the float64 oracle than eager's
(layer3.0.conv1.weight: 0.0127 against 0.00095), not understood yet: `1` therefore runs the pass
on inference graphs only, `train` on training graphs too (experimental; the CPU tests, where
the interpreter's results match eager's).
"""
from __future__ import annotations

import operator
import os

import torch

from .meta import meta

aten = torch.ops.aten

CONV = aten.convolution.default
CONV_BACKWARD = aten.convolution_backward.default
# operands read channels_last: convolution (input, weight), convolution_backward (grad_output,
# input, weight)
_CONV_OPERANDS = {CONV: (0, 1), CONV_BACKWARD: (0, 1, 2)}
_NODES_PER_CONV = 300

# ops whose values do not depend on their inputs' strides (beside torch.Tag.pointwise ones);
# views among them are defined on logical shapes (a view the new strides cannot express fails
# under the fake mode, and its input is restored)
_AGNOSTIC = {
    aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default, aten.cudnn_batch_norm.default,
    aten.cudnn_batch_norm_backward.default,
    aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
    aten.avg_pool2d.default, aten.avg_pool2d_backward.default,
    aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default,
    aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default,
    aten.var.correction, aten.var_mean.correction,
    aten._to_copy.default, aten.copy_.default, aten.copy.default, aten.alias.default,
    aten.view.default, aten._unsafe_view.default, aten.reshape.default,
    aten.permute.default, aten.transpose.int, aten.t.default, aten.expand.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.select.int, aten.slice.Tensor,
    operator.getitem,
}


_TRAINING_BN = {aten._native_batch_norm_legit_functional.default,
                aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
                aten.native_batch_norm_backward.default, aten.cudnn_batch_norm_backward.default}


def _overloads(*names):
    """The aten overloads named "op.overload" that this torch has."""
    out = set()
    for name in names:
        op, overload = name.split(".")
        packet = getattr(aten, op, None)
        if packet is not None and hasattr(packet, overload):
            out.add(getattr(packet, overload))
    return out


# more ops whose values do not depend on their inputs' strides, and that take any strides: a
# ViT's patch embedding (a convolution) flows NHWC into a cat and layer norms; factories `_like`
# their input take its layout (preserve_format)
_AGNOSTIC |= _overloads(
    "cat.default", "stack.default", "mm.default", "addmm.default", "bmm.default",
    "_softmax.default", "_log_softmax.default", "_softmax_backward_data.default",
    "_log_softmax_backward_data.default", "native_layer_norm.default",
    "native_layer_norm_backward.default", "constant_pad_nd.default",
    "empty_like.default", "zeros_like.default", "ones_like.default", "full_like.default",
    "new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default")


def mode() -> str:
    v = os.environ.get("PYFUSER_CHANNELS_LAST", "0").strip().lower()
    if v in ("auto", "train"):
        return v
    if v in ("1", "on", "true", "yes", "force"):
        return "on"
    return "off"


def _is_conv(n) -> bool:
    if n.op != "call_function" or n.target not in _CONV_OPERANDS:
        return False
    v = meta(n.args[0])
    return isinstance(v, torch.Tensor) and v.dim() == 4


def _static(v) -> bool:
    if isinstance(v, torch.Tensor):
        return all(type(s) is int for s in (*v.shape, *v.stride(), v.storage_offset()))
    if isinstance(v, (tuple, list)):
        return all(_static(x) for x in v)
    return not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _wanted(graph, kind: str) -> tuple[bool, str]:
    m = mode()
    if m == "off":
        return False, "PYFUSER_CHANNELS_LAST=0"
    nodes = list(graph.nodes)
    convs = [n for n in nodes if _is_conv(n)]
    if not convs:
        return False, "no 4-D convolution"
    if not all(_static(meta(n)) for n in nodes if n.op != "output"):
        return False, "symbolic sizes"
    if m == "on" and kind != "inference":
        return False, ("a training graph (PYFUSER_CHANNELS_LAST=train runs the pass on those: "
                       "experimental, see the module docstring)")
    if m in ("on", "train"):
        return True, ""
    if not _on_cuda(convs):
        return False, "convolutions not on CUDA"
    if len(nodes) > _NODES_PER_CONV * len(convs):
        return False, f"{len(convs)} convolution(s) in {len(nodes)} nodes"
    stats = [n for n in nodes if _batch_norm_statistics(n)]
    if stats:
        return False, (f"{len(stats)} batch norm(s) reduce over (N, H, W): over NHWC an outer "
                       "normalization, planned as one block column (see the docstring)")
    return True, ""


def _batch_norm_statistics(n) -> bool:
    """A training batch norm, forward (batch statistics) or backward (its sums): a
    normalization reducing over (N, H, W), which over an NHWC tensor the reduction schedulers
    plan as an outer normalization with no split of the reduced axes (one block per 64 or so
    channels streaming every row: ResNet-18's first one at batch 8, 224 px, 1 block of 25088
    rows), far slower on a GPU than the NCHW inner-persistent plan (a block per channel)."""
    if n.op != "call_function":
        return False
    if n.target in _TRAINING_BN:
        return True
    if n.target in (aten.native_batch_norm.default, aten.cudnn_batch_norm.default):
        return bool(n.args[5]) if len(n.args) > 5 else bool(n.kwargs.get("training"))
    return False


def _on_cuda(convs) -> bool:
    return any(meta(n.args[0]).is_cuda for n in convs)


def _agnostic(target) -> bool:
    return target in _AGNOSTIC or torch.Tag.pointwise in getattr(target, "tags", ())
