"""The eager reference runner: executes any parsed Graph with PyTorch.

`run_graph(graph, inputs, device=None, node_handler=None) -> list of outputs`.
Order of dispatch for each node:
  1. `node_handler(node, args, ctx)` if given: returns the list of outputs, or None to let
     the default run the node (the fuser plugs in here, e.g. for `prim::PyfuserGroup`);
  2. nodes with a `Subgraph` attribute (`prim::FusionGroup`, `prim::CudaFusionGroup`,
     `prim::TensorExprGroup`, `prim::DifferentiableGraph`, ...): run the subgraph (the handler
     applies inside too) and keep its first len(node.outputs) results;
  3. `prim::` kinds: the table in prim_ops.py;
  4. other `ns::op` kinds: Python scalar/list ops (scalar_ops.py), else `torch.ops` with the
     overload chosen from the runtime values (ops.py).
`device`: when given, every device the graph names (Device constants, `device=` arguments,
tensor constants) is mapped to it, so a graph dumped on a GPU runs on CPU.
The run happens under `torch.no_grad()` unless `no_grad=False` (then under the caller's grad
mode: outputs track gradients as eager's do). Any failure is a RunnerError naming the node (kind,
outputs, its IR line, and the source line it was parsed from), with `.line`/`.column` set.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from pyfuser.errors import PyfuserError, RunnerError

from .graph import Block, Graph
from .node import Node
from .ops import call_op, fits, out_schema, resolve
from .prim_ops import PRIM_HANDLERS
from .scalar_ops import try_python_op

NodeHandler = Callable[[Node, list, "RunContext"], Optional[list]]


class RunContext:
    """State of one run: device mapping, the node handler, the module for `%self`."""

    def __init__(self, device=None, node_handler: Optional[NodeHandler] = None):
        self.device = torch.device(device) if device is not None else None
        self.node_handler = node_handler

    def map_device(self, d) -> torch.device:
        return self.device if self.device is not None else torch.device(d)

    def run_graph(self, graph: Graph, inputs: Sequence[Any]) -> list:
        if len(inputs) != len(graph.inputs):
            raise RunnerError(f"graph takes {len(graph.inputs)} inputs "
                              f"({', '.join('%' + v.debug_name for v in graph.inputs)}), "
                              f"got {len(inputs)}")
        env: dict = {}
        return self._run(graph.block, list(inputs), env)

    def run_block(self, block: Block, args: list) -> list:
        """Run a nested block (of prim::If / prim::Loop) in the current environment."""
        return self._run(block, args, self._env)

    def _run(self, block: Block, args: list, env: dict) -> list:
        saved = getattr(self, "_env", None)
        self._env = env
        try:
            for v, a in zip(block.inputs, args):
                env[v] = a
            for n in block.nodes():
                self._eval(n, env)
            return [env[v] for v in block.outputs]
        finally:
            self._env = saved

    def _eval(self, node: Node, env: dict) -> None:
        args = [env[v] for v in node.inputs]
        try:
            outs = self._dispatch(node, args)
            if outs is None or len(outs) != len(node.outputs):
                got = "nothing" if outs is None else f"{len(outs)} values"
                raise RunnerError(f"produced {got} for {len(node.outputs)} outputs")
        except RunnerError as e:
            if getattr(e, "node_named", False):
                raise
            raise node_error(node, str(e)) from e
        except PyfuserError:
            raise
        except Exception as e:
            raise node_error(node, f"{type(e).__name__}: {_first_line(e)}") from e
        for v, o in zip(node.outputs, outs):
            env[v] = o

    def _dispatch(self, node: Node, args: list) -> list:
        return self.route(node, args)[1]

    def route(self, node: Node, args: list) -> tuple:
        """(how, outputs): how the node ran ("handler", "subgraph", "prim", "python", or the
        torch.ops schema it was called with) and its outputs (None: the handler declined and
        nothing else runs it, which _eval reports)."""
        if self.node_handler is not None:
            outs = self.node_handler(node, args, self)
            if outs is not None:
                return "handler", list(outs)
        sub = node.attributes.get("Subgraph")
        if sub is not None and sub[0] == "g":
            if sub[1] is None:
                raise RunnerError("its subgraph was not printed (`Subgraph=<Graph>`)")
            return "subgraph", self.run_graph(sub[1], args)[:len(node.outputs)]
        handler = PRIM_HANDLERS.get(node.kind)
        if handler is not None:
            return "prim", handler(self, node, args)
        if node.kind.startswith("prim::") or "::" not in node.kind:
            raise RunnerError("no eager implementation of this node kind")
        res = try_python_op(self, node.kind, args)
        if res is not NotImplemented:
            return "python", [] if not node.outputs and res is None else [res]
        try:
            schema = out_schema(node.kind, node.overload)
            if schema is None or not fits(schema, args):
                schema = resolve(node.kind, args)
            return schema, call_op(node.kind, args, self.map_device, schema)
        except LookupError as e:
            raise RunnerError(str(e)) from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def node_error(node: Node, reason: str) -> RunnerError:
    from .printer import node_line
    outs = ", ".join("%" + v.debug_name for v in node.outputs) or "no outputs"
    where = f" (line {node.src_line})" if node.src_line else ""
    err = RunnerError(f"cannot run {node.kind} -> {outs}{where}: {reason}\n"
                      f"  node: {node_line(node)}")
    err.node_named = True
    err.line, err.column = node.src_line, node.src_col
    err.node = node
    return err


def run_graph(graph: Graph, inputs: Sequence[Any], device=None,
              node_handler: Optional[NodeHandler] = None, no_grad: bool = True) -> list:
    """Run `graph` on `inputs` (a module object first where the graph takes `%self`). With
    `no_grad=False` the caller's grad mode applies (pyfuser.jit: autograd as in eager)."""
    ctx = RunContext(device, node_handler)
    if not no_grad:
        return ctx.run_graph(graph, inputs)
    with torch.no_grad():
        return ctx.run_graph(graph, inputs)
