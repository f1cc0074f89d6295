"""`explain` of TorchScript programs: the fused graph, run once, group by group.

The object is fused as `pyfuser.jit` fuses it (a plain function or nn.Module that does not
script is traced with the example inputs, and the report says so). The fused graph then runs on
the example inputs (IR text without inputs: seeded random ones made from its declared types)
with every group's subgraph run eagerly, which gives each group the arguments it gets in a real
call; each group is then lowered on those arguments, as its first call would lower it. A group
that would run eagerly says why: autograd (grad mode on and an input requiring grad: pyfuser's
kernels have no backward), or its lowering failed. Groups inside a branch or loop body that did
not run on these inputs are listed as not run.
"""
from __future__ import annotations

import os

import torch

from ..errors import PyfuserError
from .frontends import Collected, GroupSource


def matches(obj) -> bool:
    from ..frontend.torchscript.graph import Graph
    from ..frontend.torchscript.jit import CompiledGraph
    if isinstance(obj, (Graph, CompiledGraph, str, os.PathLike, torch._C.Graph,
                        torch.jit.ScriptFunction, torch.jit.ScriptModule, torch.nn.Module)):
        return True
    return callable(obj) and not isinstance(obj, type)


def _compile(obj, inputs, notes: list):
    """(CompiledGraph, what it is) for `obj`; a function or module that does not script is
    traced with `inputs`."""
    import pyfuser
    from ..frontend.torchscript.jit import CompiledGraph
    if isinstance(obj, CompiledGraph):
        return obj, "pyfuser.jit result"
    if isinstance(obj, (str, os.PathLike)):
        text = os.fspath(obj)
        return pyfuser.jit(obj), (text if "graph(" not in text else "IR text")
    from ..frontend.torchscript.graph import Graph
    if isinstance(obj, Graph):
        return pyfuser.jit(obj), "graph"
    if isinstance(obj, torch.jit.ScriptFunction):
        name = obj.name
    else:
        name = getattr(obj, "original_name", None) or getattr(obj, "__name__", None) or \
            type(obj).__name__
    scriptable = isinstance(obj, (torch.jit.ScriptFunction, torch.jit.ScriptModule,
                                  torch._C.Graph))
    if scriptable:
        return pyfuser.jit(obj), name
    try:
        return pyfuser.jit(obj), f"{name} (scripted)"
    except PyfuserError as e:
        if not inputs:
            raise
        first = str(e).splitlines()[0][:200]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(obj, tuple(inputs), strict=False)
    notes.append(f"{name} does not script ({first}); traced with the example inputs")
    return pyfuser.jit(traced), f"{name} (traced)"


def _inputs(compiled, inputs, device, seed):
    if inputs:
        return list(inputs)
    from ..frontend.torchscript.inputs import make_inputs
    graph = compiled.original
    if compiled.module is not None:
        raise PyfuserError("pyfuser.explain: a module's graph needs example inputs")
    return make_inputs(graph, device=device or "cpu", seed=seed)


def _device_of(args, asked) -> str:
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in args):
        return "cuda"
    return asked or "cpu"


def collect(obj, inputs, options) -> Collected:
    from ..frontend.torchscript.jit import GRAD_REASON, eager_handler
    from ..frontend.torchscript.passes.groups import GROUP_KIND
    from ..frontend.torchscript.runner import run_graph
    from .fallbacks import unfused_ops
    from .picture import graph_picture
    notes: list = []
    compiled, source = _compile(obj, list(inputs), notes)
    args = _inputs(compiled, inputs, options.get("device"), options.get("seed", 0))
    full = ([compiled.module] if compiled.module is not None else []) + args
    captured: dict = {}

    def handle(node, a, ctx):
        if node.kind == GROUP_KIND:
            captured.setdefault(node, list(a))     # the first call (a loop body may repeat)
            return ctx.run_graph(node.g("Subgraph"), a)
        return eager_handler(node, a, ctx)

    device = _device_of(args, options.get("device"))
    run_graph(compiled.graph, full, device=options.get("device"), node_handler=handle,
              no_grad=False)
    groups = []
    nodes = [n for n in compiled.graph.all_nodes() if n.kind == GROUP_KIND]
    for i, node in enumerate(nodes):
        groups.append(_group_source(i, node, captured.get(node), GRAD_REASON))
    unfused = unfused_ops(compiled)
    picture = graph_picture(compiled.graph, nodes, unfused)
    fallbacks = [fb for _, fb in unfused]
    if not torch.is_grad_enabled():
        notes.append("grad mode is off (torch.no_grad / inference_mode): groups fuse")
    return Collected(source, "torchscript", device, "cuda" if device == "cuda" else "interpret",
                     groups, fallbacks, picture, notes)


def _group_source(i, node, args, grad_reason) -> GroupSource:
    from ..frontend.lowering import lower_graph
    from ..frontend.torchscript.printer import node_line
    sub = node.g("Subgraph")
    ops = [node_line(n) for n in sub.nodes() if n.kind != "prim::Constant"]
    ins = ["%" + v.debug_name for v in node.inputs]
    outs = ["%" + v.debug_name for v in node.outputs]
    name = f"group {i} -> {', '.join(outs)}"
    src = GroupSource(i, name, ops, ins, outs)
    if args is None:
        src.eager_reason = "not run: the block holding it did not run on these inputs"
        return src
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                       for a in args):
        src.eager_reason = grad_reason
    try:
        lowered = lower_graph(sub, args)
    except PyfuserError as e:
        src.eager_reason = f"lowering failed: {e}"
        return src
    src.fusion, src.args = lowered.fusion, lowered.fusion_args(args)
    return src
