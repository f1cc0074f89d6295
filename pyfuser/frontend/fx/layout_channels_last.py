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
the interpreter's results match eager's). Not covered: 1-D / 3-D convolutions, dynamic
shapes (symbolic sizes); the weights' conversions are eager copy kernels (one per weight a
forward); the backward's weight gradients are copied back to NCHW (graph outputs).
"""
from __future__ import annotations

import logging
import operator
import os
from dataclasses import dataclass, field

import torch

from .meta import meta

log = logging.getLogger("pyfuser")
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


class _GiveUp(Exception):
    pass


@dataclass
class LayoutReport:
    """What the pass did to one graph."""
    kind: str
    convolutions: int = 0              # convolution / convolution_backward calls
    converted: list = field(default_factory=list)   # (conv node, operand index) copied to NHWC
    restored: list = field(default_factory=list)    # (node name, why) copied back to eager's
    saved_channels_last: int = 0       # forward outputs saved for the backward, now NHWC
    saved_converted: int = 0           # of which inputs saved as the NHWC copies made for a
                                       # convolution (weights, the image)
    propagated_only: bool = False      # no conversion: example values recomputed from inputs

    @property
    def copies(self) -> int:
        """Copies the pass added to the graph (conversions and restores)."""
        return len(self.converted) + len(self.restored)


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


def _strides(v):
    return tuple(int(s) for s in v.stride())


def _same_layout(a, b) -> bool:
    """Same strides on every axis of more than one element."""
    return all(n == 1 or int(s) == int(t) for n, s, t in zip(a.shape, a.stride(), b.stride()))


def _dense_order(v):
    """Axes outermost first if v is dense (non-overlapping, no gaps) in that order, else None."""
    sizes, strides = [int(s) for s in v.shape], _strides(v)
    order = sorted(range(len(sizes)), key=lambda i: (-strides[i], i))
    acc = 1
    for a in reversed(order):
        if sizes[a] != 1 and strides[a] != acc:
            return None
        acc *= max(sizes[a], 1)
    return order


def _saved_outputs(kind: str, n_outputs: int):
    """Indices of a training forward's outputs that it saves for the backward (tensors): their
    strides are free (AOTAutograd compiles the backward with the strides reported)."""
    if kind != "forward":
        return set()
    ctx = torch._guards.TracingContext.try_get()
    fw = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if fw is None or getattr(ctx, "output_strides", None) is None:
        return set()
    try:
        sl = fw.tensors_saved_for_backwards_slice
    except Exception:  # noqa: BLE001 - metadata of another torch version: restore everything
        return set()
    return set(range(n_outputs)[sl])


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


def _fake_mode(graph, example_inputs):
    from torch._guards import detect_fake_mode
    vals = [meta(n) for n in graph.nodes if isinstance(meta(n), torch.Tensor)]
    return detect_fake_mode(list(example_inputs or []) + vals)


def _rewrite(gm, example_inputs, kind: str, convert: bool):
    from torch._subclasses.fake_tensor import FakeTensor
    graph = gm.graph
    fake_mode = _fake_mode(graph, example_inputs)
    if fake_mode is None:
        raise _GiveUp("no fake mode")
    report = LayoutReport(kind)
    g = torch.fx.Graph()
    env: dict = {}            # old node -> new node
    val: dict = {}            # new node -> its example value under the new layouts
    copies: dict = {}         # (new node, key) -> its copy (one per value and layout)
    examples = list(example_inputs or [])

    def add(target, args, kwargs, v, name_hint):
        nn = g.create_node("call_function", target, args, kwargs, name=name_hint)
        nn.meta["val"] = v
        val[nn] = v
        return nn

    def to_format(x, fmt, tag):
        key = (x, fmt)
        if key not in copies:
            with fake_mode:
                v = val[x].clone(memory_format=fmt)
            copies[key] = add(aten.clone.default, (x,), {"memory_format": fmt}, v,
                              f"{x.name}_{tag}")
        return copies[key]

    def restore(x, orig, why):
        """x (a new node) copied into the strides of `orig` (its value in the original graph)."""
        order = _dense_order(orig)
        if order is None:
            raise _GiveUp(f"{why}: {x.name}'s eager strides {_strides(orig)} are not dense")
        key = (x, tuple(order))
        if key in copies:
            return copies[key]
        report.restored.append((x.name, why))
        if orig.dim() == 4 and order == [0, 2, 3, 1]:
            r = to_format(x, torch.channels_last, "nhwc")
        elif order == list(range(orig.dim())):
            r = to_format(x, torch.contiguous_format, "nchw")
        else:
            inv = [order.index(i) for i in range(len(order))]
            with fake_mode:
                pv = val[x].permute(order)
                cv = pv.clone(memory_format=torch.contiguous_format)
                bv = cv.permute(inv)
            p = add(aten.permute.default, (x, order), {}, pv, f"{x.name}_perm")
            c = add(aten.clone.default, (p,), {"memory_format": torch.contiguous_format}, cv,
                    f"{x.name}_dense")
            r = add(aten.permute.default, (c, inv), {}, bv, f"{x.name}_back")
        copies[key] = r
        return r

    def restored_args(n):
        """n's args with every tensor input whose strides changed copied back to eager's."""
        def fix(a):
            x = env[a]
            o = meta(a)
            if isinstance(o, torch.Tensor) and isinstance(val.get(x), torch.Tensor) and \
                    not _same_layout(val[x], o):
                return restore(x, o, f"{_op_name(n)} reads eager's strides")
            return x
        return torch.fx.node.map_arg(n.args, fix), torch.fx.node.map_arg(n.kwargs, fix)

    k = 0
    for n in graph.nodes:
        if n.op == "placeholder":
            nn = g.create_node("placeholder", n.target, name=n.name)
            nn.meta = dict(n.meta)
            v = meta(n)
            x = examples[k] if k < len(examples) else None
            k += 1
            if isinstance(x, torch.Tensor) and isinstance(v, torch.Tensor) and \
                    _static(x) and not _same_layout(x, v):
                v = x if isinstance(x, FakeTensor) else fake_mode.from_tensor(x)
            nn.meta["val"] = v
            val[nn] = v
            env[n] = nn
            continue
        if n.op == "output":
            env[n] = _output(g, n, env, val, report, restore, add, fake_mode, kind, copies)
            continue
        if n.op == "get_attr":              # a constant the graph holds (gm keeps it)
            nn = g.create_node("get_attr", n.target, name=n.name)
            nn.meta = dict(n.meta)
            v = meta(n)
            if v is None:
                attr = gm
                for part in str(n.target).split("."):
                    attr = getattr(attr, part)
                v = fake_mode.from_tensor(attr) if isinstance(attr, torch.Tensor) else attr
            nn.meta["val"] = v
            val[nn] = v
            env[n] = nn
            continue
        if n.op != "call_function":
            raise _GiveUp(f"{n.op} node {n.name}")
        args = torch.fx.node.map_arg(n.args, lambda a: env[a])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
        if convert and _is_conv(n):
            report.convolutions += 1
            args = list(args)
            for i in _CONV_OPERANDS[n.target]:
                a = args[i]
                if isinstance(a, torch.fx.Node) and \
                        not val[a].is_contiguous(memory_format=torch.channels_last):
                    args[i] = to_format(a, torch.channels_last, "nhwc")
                    report.converted.append((n.name, i))
            args = tuple(args)
        elif not _agnostic(n.target):
            args, kwargs = restored_args(n)
        v = _run(n, args, kwargs, val, fake_mode)
        if v is None:                       # a view the new strides cannot express
            args, kwargs = restored_args(n)
            v = _run(n, args, kwargs, val, fake_mode)
            if v is None:
                raise _GiveUp(f"{n.name} ({_op_name(n)}) does not run on the new layouts")
        nn = g.create_node("call_function", n.target, args, kwargs, name=n.name)
        nn.meta = dict(n.meta)
        nn.meta.pop("tensor_meta", None)
        nn.meta["val"] = v
        val[nn] = v
        env[n] = nn
    g.lint()
    return g, report


def _op_name(n) -> str:
    return str(n.target)


def _agnostic(target) -> bool:
    return target in _AGNOSTIC or torch.Tag.pointwise in getattr(target, "tags", ())


def _run(n, args, kwargs, val, fake_mode):
    """The node's example value on its new inputs (None where the op refuses them: a view)."""
    def value(a):
        return val[a]
    a = torch.fx.node.map_arg(args, value)
    kw = torch.fx.node.map_arg(kwargs, value)
    if n.target is operator.getitem:
        return a[0][a[1]]
    try:
        with fake_mode:
            return n.target(*a, **kw)
    except (RuntimeError, ValueError) as e:        # a view: "Cannot view a tensor ..."
        log.debug("pyfuser: channels-last: %s refuses the new layouts: %s", n.name, e)
        return None


def _output(g, n, env, val, report, restore, add, fake_mode, kind, copies):
    """The output node: outputs whose strides changed copied back to eager's, but a training
    forward's saved tensors."""
    outs = n.args[0]
    single = not isinstance(outs, (list, tuple))
    items = [outs] if single else list(outs)
    saved = _saved_outputs(kind, len(items))
    new_items = []
    for i, o in enumerate(items):
        if not isinstance(o, torch.fx.Node):
            new_items.append(o)
            continue
        x = env[o]
        if i in saved and o.op == "placeholder" and (x, torch.channels_last) in copies and \
                not any(u.target is aten.copy_.default and u.args[0] is o for u in o.users):
            # a weight (or image) the backward reads again: it gets the NHWC copy the forward
            # made for its convolution, not the input (which it would convert again)
            x = copies[(x, torch.channels_last)]
            report.saved_converted += 1
        ov, nv = meta(o), val[x]
        if isinstance(ov, torch.Tensor) and not _same_layout(nv, ov):
            if i in saved:
                report.saved_channels_last += 1
            else:
                x = restore(x, ov, "a graph output keeps eager's strides")
                nv = val[x]
        if isinstance(ov, torch.Tensor) and i not in saved and _strides(nv) != _strides(ov):
            # the same memory, other strides on axes of one element (a 1x1 convolution's
            # weight gradient): eager's strides as a view, no copy
            with fake_mode:
                v = torch.as_strided(nv, ov.shape, _strides(ov), nv.storage_offset())
            x = add(aten.as_strided.default, (x, list(ov.shape), list(_strides(ov)),
                                              int(nv.storage_offset())), {}, v,
                    f"{x.name}_strided")
        new_items.append(x)
    res = new_items[0] if single else type(outs)(new_items)
    out = g.output(res)
    out.meta = dict(n.meta)
    return out
