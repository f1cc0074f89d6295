"""The user-facing fuser API: `pyfuser.jit(obj)` and `pyfuser.fuse_graph(graph)`.

    f = pyfuser.jit(torch.jit.script(fn))   # or IR text, a .ir path, a ScriptModule, a Graph
    out = f(x, y)                           # equals fn(x, y); groups run through pyfuser
    f.last_run.groups, f.last_run.kernels, f.last_run.fallbacks
    print(pyfuser.fuse_graph(graph))        # the fused graph (the argument is not changed)

PyTorch objects (scripted or traced functions and modules, a torch._C.Graph: a traced module's
`.graph` too, whose submodule calls are inlined) are turned into a graph through torch's node
API (from_torch.py: constants exact) from their inlined graph after PyTorch's own constant
propagation (on a copy); a module's graph keeps `%self`, and the compiled callable passes the
module to the runner for `prim::GetAttr`. `pyfuser.jit` of a module also folds its bool flags
(`training`) and None attributes into constants, guarded per call (module_flags.py).
"""
from __future__ import annotations

import os

from ...errors import PyfuserError
from .call_args import Binder
from .from_torch import graph_from_torch, torch_graph_of
from .module_flags import fold_module_flags
from .graph import Graph
from .jit import CompiledGraph
from .parser import parse_ir
from .passes import run_pipeline


def _torch_graph(obj, api: str, flags: bool = False):
    """(Graph, module or None, module flag guards) for a PyTorch object, read through torch's
    node API; with `flags`, a module's bool / None attributes are folded (module_flags.py)."""
    import torch
    g, module, _ = torch_graph_of(obj, api)
    guards = fold_module_flags(g, module) if flags and module is not None else []
    # Fold the constant branches of inlined helpers (`if inplace:` ...). No torch DCE here: it
    # deletes an unused training batch_norm, whose running-stat update the caller must see;
    # pyfuser's cleanup pass removes dead code knowing those writes.
    torch._C._jit_pass_constant_propagation(g)
    return graph_from_torch(g), module, guards


def to_graph(obj, api: str = "pyfuser.jit"):
    """(Graph, module or None) from IR text, a file path, a Graph or a PyTorch object; a
    PyfuserError naming the argument for anything else."""
    if isinstance(obj, Graph):
        return obj, None
    if isinstance(obj, (str, os.PathLike)):
        text = os.fspath(obj)
        if "graph(" not in text:
            if os.path.exists(text):
                try:
                    with open(text, encoding="utf-8") as f:
                        return parse_ir(f.read(), filename=text), None
                except (OSError, UnicodeDecodeError) as e:
                    raise PyfuserError(f"{api}: cannot read {text}: {e}") from None
            if isinstance(obj, os.PathLike) or text.endswith(".ir") or os.sep in text:
                raise PyfuserError(f"{api}: no such file: {text}")
        return parse_ir(text), None
    return _torch_graph(obj, api)[:2]


def jit(obj, *, arg_limit: int = 128, cpu_executor=None, cuda_graphs: bool = False
        ) -> CompiledGraph:
    """Compile `obj` into a callable whose results equal eager's (see jit.CompiledGraph).
    `cuda_graphs=True` replays each input signature's call plan from a CUDA graph from its
    second call on (cuda_graphs.py: inputs copied in, fresh outputs)."""
    if isinstance(obj, (Graph, str, os.PathLike)):
        graph, module = to_graph(obj, "pyfuser.jit")
        return CompiledGraph(graph, module=module, arg_limit=arg_limit, cpu_executor=cpu_executor,
                             cuda_graphs=cuda_graphs)
    graph, module, guards = _torch_graph(obj, "pyfuser.jit", flags=True)
    rebuild = (lambda: _torch_graph(module, "pyfuser.jit", flags=True)[::2]) if guards else None
    binder = Binder.from_object(obj, module)
    if binder is not None and binder.count != len(graph.inputs) - (module is not None):
        binder = None                       # parameters not the graph's inputs: positional only
    return CompiledGraph(graph, module=module, arg_limit=arg_limit, cpu_executor=cpu_executor,
                         flag_guards=guards, rebuild=rebuild, cuda_graphs=cuda_graphs,
                         binder=binder)


def fuse_graph(graph, arg_limit: int = 128) -> Graph:
    """Run the fuser's passes on a copy of `graph` (or of what `to_graph` makes); return it."""
    g, _ = to_graph(graph, "pyfuser.fuse_graph")
    g = g.copy()
    run_pipeline(g, arg_limit)
    return g


__all__ = ["jit", "fuse_graph", "to_graph"]
