"""Channels-last activations around convolutions: the layout pass of the FX backend.

cuDNN runs its fast convolution kernels on NHWC data; handed NCHW tensors it transposes the
input and the weight to NHWC and the result back around each call (ResNet-18's forward on an
H200: 50 such transposes, ~200 µs of 624). Inductor avoids them by running convolutions in
channels_last (its layout optimization); this pass does the same for pyfuser's graphs.

`channels_last(gm, example_inputs, kind) -> LayoutReport | None` rewrites an AOTAutograd graph
(inference, forward or backward) in place, before anything else of `compile_graph` looks at it:
1. every 4-D `aten.convolution` reads its input and weight, every `aten.convolution_backward`
   its grad_output, input and weight, dense in channels_last; an operand that is not gets a
   copy (`aten.clone(x, memory_format=torch.channels_last)`, an eager copy kernel) inserted
   before the call: the weights (parameters are NCHW, a small copy each per call, as Inductor
   does in its graph) and the first convolution's input. Nothing else is converted at first:
2. every node's example value (`meta["val"]`) is recomputed from its (possibly re-laid-out)
   inputs under the graph's FakeTensorMode, in graph order, so the convolution's result is
   channels_last and so is what the layout-agnostic ops after it compute: pointwise ops
   (`torch.Tag.pointwise`: TensorIterator follows its inputs' layout), batch norm forward and
   backward, pooling forward and backward, reductions, views, the copy_ of a mutated input.
   The next convolution then finds its input channels_last and needs no copy. pyfuser's
   regions lay their outputs out as eager would for their inputs' layouts
   (schedule/layout.eager_output_orders), which is what the recomputed example values say, so a
   region writes its channels_last results directly (FusedRegion checks it on every call);
3. any other op (one whose values may depend on its inputs' strides, `as_strided`, or that the
   pass does not know) reads each tensor input in the strides the original graph gave it: an
   input whose layout changed is copied back first (a `clone` into contiguous_format, or into
   channels_last, or through a permute for another dense order); so is the input of a view that
   fails on the new strides. An input whose original strides are not dense cannot be restored:
   the pass then gives up and leaves the graph as it was;
4. the graph's outputs keep the strides they had (eager's), restored the same way, except the
   tensors a training forward saves for its backward (AOTAutograd's fw_metadata says which):
   those stay channels_last, and the forward reports its output strides to AOTAutograd
   (`TracingContext.output_strides`, as Inductor does), which then compiles the backward with
   placeholders of those strides. A weight (or image) saved for the backward's
   convolution_backward is saved as the channels_last copy the forward made for its own
   convolution, so the backward converts nothing again. A backward whose inputs' strides
   differ from its graph's example values (the saved channels_last activations) has its values
   recomputed from them even where the pass is off for it, so every node's example value is
   what runs.

Invariants: (a) values are unchanged: only ops whose results do not depend on their inputs'
strides see new strides; (b) the graph's inputs and outputs keep their order, and its outputs
their strides, but the saved tensors of a training forward; (c) every node's example value is
the value it will have at run time (what the lowering, the partitioner and FusedRegion's layout
checks read); (d) on any failure (an op the fake mode cannot run, a non-dense original input to
restore) the graph is left exactly as it was.

Not covered: 1-D / 3-D convolutions, dynamic shapes (symbolic sizes); the weights'
conversions are eager copy kernels (one per weight a forward); the backward's weight
gradients are copied back to NCHW (graph outputs).

Modules: this one is the pass's entry (`channels_last`, `report_output_strides`);
layout_policy.py says when it runs (the `PYFUSER_CHANNELS_LAST` switch) and which ops it
converts for or lets see new strides; layout_rewrite.py rebuilds the graph (the copies, the
example values recomputed, the outputs restored) and holds the LayoutReport.
"""
from __future__ import annotations

import logging

import torch

from .layout_policy import _is_conv, _static, _wanted
from .layout_rewrite import _GiveUp, _rewrite, _same_layout, _strides
from .meta import meta

log = logging.getLogger("pyfuser")


def report_output_strides(gm) -> None:
    """Hand the forward's output strides to AOTAutograd (TracingContext.output_strides, read
    for the saved tensors when it compiles the backward), as Inductor does."""
    ctx = torch._guards.TracingContext.try_get()
    if ctx is None or ctx.output_strides is None or ctx.output_strides:
        return
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    items = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    for a in items:
        v = meta(a) if isinstance(a, torch.fx.Node) else None
        ctx.output_strides.append(_strides(v) if isinstance(v, torch.Tensor) else None)


def channels_last(gm, example_inputs, kind: str):
    """Run the pass on `gm` (see the module docstring). Returns a LayoutReport when the graph
    changed (conversions, or only example values recomputed from differently strided inputs),
    None when it was left as it was."""
    graph = gm.graph
    want, why = _wanted(graph, kind)
    inputs_differ = _inputs_differ(graph, example_inputs)
    if not want and not inputs_differ:
        if why and any(_is_conv(n) for n in graph.nodes):
            log.debug("pyfuser: %s graph stays NCHW: %s", kind, why)
        return None
    try:
        new, report = _rewrite(gm, example_inputs, kind, convert=want)
    except _GiveUp as e:
        log.info("pyfuser: channels-last pass left the %s graph as it was: %s", kind, e)
        return None
    except Exception as e:  # noqa: BLE001 - a pass that cannot run leaves the graph alone
        log.warning("pyfuser: channels-last pass failed on the %s graph (%s: %s); left as it "
                    "was", kind, type(e).__name__, e)
        return None
    report.propagated_only = not want
    gm.graph = new
    gm.recompile()
    return report


def _placeholders(graph):
    return [n for n in graph.nodes if n.op == "placeholder"]


def _inputs_differ(graph, example_inputs) -> bool:
    """Whether an example input is a tensor strided other than its placeholder's value (the
    backward of a forward whose saved tensors are channels_last)."""
    if example_inputs is None:
        return False
    for n, x in zip(_placeholders(graph), example_inputs):
        v = meta(n)
        if isinstance(x, torch.Tensor) and isinstance(v, torch.Tensor) and _static(x) and \
                _static(v) and tuple(x.shape) == tuple(v.shape) and not _same_layout(x, v):
            return True
    return False
