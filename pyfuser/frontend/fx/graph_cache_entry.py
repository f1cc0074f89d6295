"""The graph cache's compiled graphs (graph_cache.py) in torch's bundled-cache protocol: what
AOTAutograd's compilers return while the cache stores, and how a stored graph is compiled again.

`GraphOutputCode` holds the aten graph AOTAutograd gave the compiler, pickled (`dump_graph`:
torch's GraphPickler, with the example values `val`, the only node metadata compile_graph reads)
before compile_graph rewrote it, and compile_one's other arguments; after loading,
`post_compile` compiles it again (`recompile`: compile_one on the unpickled graph, its example
values in the compile's fake mode) and refuses a graph the channels-last pass would change.

This module imports torch internals at its top (OutputCode, GraphPickler): graph_cache.py
imports it only when the cache is on and this torch has them (`graph_cache._torch_parts`).
"""
from __future__ import annotations

import torch
from torch._inductor.output_code import OutputCode
from torch.fx._graph_pickler import GraphPickler, Options


class GraphOutputCode(OutputCode):
    """A compiled graph in torch's bundled-cache protocol: the aten graph AOTAutograd gave the
    compiler (pickled with its example values, before compile_graph rewrote it) and what the
    compiler needs besides; compiled again after loading (`post_compile`)."""

    def __init__(self, kind, compiled, data, extra):
        self.kind = kind
        self.compiled = compiled
        self.data = data
        self.extra = extra
        self._boxed_call = True

    def __call__(self, args):
        return self.compiled(args)

    def prepare_for_serialization(self) -> None:
        self.compiled = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["compiled"] = None
        return state

    def post_compile(self, *args, **kwargs) -> None:
        if self.compiled is None:
            if self.data is None:
                raise ValueError(f"the {self.kind} graph was not stored")
            compiled = recompile(self.kind, self.data, self.extra)
            if layout(compiled) is not None:
                raise ValueError(f"the channels-last pass changed the {self.kind} graph")
            if self.kind == "backward":          # as AOTAutograd's wrapping of bw_compiler
                compiled = disable(compiled, "do not trace generated backwards pass")
            self.compiled = compiled

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


_KEPT_META = frozenset({"val"})    # what compile_graph reads of a node's metadata (meta.py)


def examples_differ(gm, example) -> bool:
    """Whether AOTAutograd handed the compiler example inputs other than the placeholders'
    example values (a backward whose saved tensors' strides the forward reported): a rebuilt
    graph is compiled from the placeholders' values."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(places) != len(example):
        return True
    for n, x in zip(places, example):
        v = n.meta.get("val")
        if isinstance(x, torch.Tensor) != isinstance(v, torch.Tensor):
            return True
        if isinstance(x, torch.Tensor) and (
                x.dtype != v.dtype or tuple(x.shape) != tuple(v.shape) or
                tuple(x.stride()) != tuple(v.stride()) or
                x.storage_offset() != v.storage_offset()):
            return True
    return False


def layout(compiled):
    """The channels-last pass' report of a compiled graph (a GraphedInference's inner one)."""
    inner = getattr(compiled, "compiled", compiled)
    return getattr(inner, "layout", getattr(compiled, "layout", None))


def dump_graph(gm) -> bytes:
    """The graph with its nodes' example values (FakeTensors, SymInts), and no other metadata
    (stacks, provenance: nothing pyfuser reads; unpickling them cost more than the values)."""
    opts = Options(ops_filter=None, node_metadata_key_filter=_KEPT_META.__contains__)
    return GraphPickler.dumps(gm, opts)


def recompile(kind, data, extra):
    """compile_one of a stored graph (`dump_graph`'s bytes) with its stored arguments."""
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from .backend import compile_one
    # the example values in the fake mode of the compile (Dynamo's, as AOTAutograd's graphs
    # have it): passes that make values in the tracing context's mode can mix them
    ctx = torch._guards.TracingContext.try_get()
    fake_mode = getattr(ctx, "fake_mode", None) or FakeTensorMode(shape_env=ShapeEnv())
    gm = GraphPickler.loads(data, fake_mode)
    example = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    with fake_mode:
        return compile_one(gm, example, kind, **extra)


def disable(fn, reason: str):
    """`torch._dynamo.disable(fn)`: Dynamo does not trace into a compiled graph."""
    try:
        return torch._dynamo.disable(fn, reason=reason)
    except TypeError:  # pragma: no cover - a torch without disable's reason
        return torch._dynamo.disable(fn)
