"""The graph rebuild of the channels-last pass (layout_channels_last.py, whose docstring states
the steps and invariants): `_rewrite(gm, example_inputs, kind, convert)` builds a new graph
node by node, with
- the convolutions' operands copied into channels_last where they are not (when `convert`);
- each node's example value recomputed under the graph's FakeTensorMode from its new inputs
  (`_run`), the placeholders' from example inputs strided other than their values;
- the inputs of ops that are not layout-agnostic (layout_policy), and of views the new strides
  cannot express, copied back to the strides the original graph gave them (`restore`: a clone
  into contiguous_format or channels_last, or a permute, a clone and a permute back);
- the outputs restored the same way (`_output`), but a training forward's saved tensors.

Invariants: one copy per (value, layout) (`copies`); the original graph is never modified: a
failure raises (`_GiveUp` where the pass cannot keep its contract) and the caller keeps the old
graph; a restore needs the original strides dense (`_dense_order`), else `_GiveUp`.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field

import torch

from .layout_policy import _CONV_OPERANDS, _agnostic, _is_conv, _static
from .meta import meta

log = logging.getLogger("pyfuser")
aten = torch.ops.aten


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
