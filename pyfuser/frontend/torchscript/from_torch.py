"""Graphs straight from PyTorch objects: `graph_from_function(obj) -> Graph`.

Takes a torch.jit.ScriptFunction, ScriptModule, traced function/module, a torch._C.Graph, or a
plain Python function (scripted first). Calls are inlined (`inlined_graph`), then the printed
text is parsed, so the result is exactly what parse_ir makes of PyTorch's own output. Module
graphs keep `%self` as first input: pass the module object as the first runner input, and
`prim::GetAttr` reads parameters and buffers from it.
"""
from __future__ import annotations

import torch

from .graph import Graph
from .parser import parse_ir


def graph_from_function(obj) -> Graph:
    if isinstance(obj, torch._C.Graph):
        ts_graph = obj
    else:
        if not isinstance(obj, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
            obj = torch.jit.script(obj)
        ts_graph = obj.inlined_graph
    name = getattr(obj, "__name__", None) or getattr(obj, "original_name", "graph")
    return parse_ir(str(ts_graph), filename=f"<{name}>")
