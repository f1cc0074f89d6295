"""The graph cache's compiled graphs (graph_cache.py) in torch's bundled-cache protocol: what
AOTAutograd's compilers return while the cache stores, and how a stored graph is compiled again.

`GraphOutputCode` holds the aten graph AOTAutograd gave the compiler, pickled (`dump_graph`:
torch's GraphPickler, with the example values `val`, the only node metadata compile_graph reads)
before compile_graph rewrote it, and compile_one's other arguments; after loading,
`post_compile` compiles it again (`recompile`: compile_one on the unpickled graph, its example
values in the compile's fake mode) and refuses a graph the channels-last pass would change.

Example values are pickled by their layout (`_ValuePickler`): a FakeTensor of static sizes,
strided, of FakeTensor's own type, is stored as its sizes, strides, offset, storage bytes,
dtype, device and requires_grad, and comes back as a new FakeTensor of that layout on a storage
of its own (about 16 µs each, where GraphPickler's full description and MetaConverter took
about 0.4 ms: most of a warm start's cache load). What is not kept: a value's view relation and
shared storages between values; compile_graph reads aliasing from the graph's ops, never from
values (a test compares the regions and results of a cache hit with a compile). Other values
(symbolic sizes, other layouts, subclasses) go through GraphPickler as before.

This module imports torch internals at its top (OutputCode, GraphPickler): graph_cache.py
imports it only when the cache is on and this torch has them (`graph_cache._torch_parts`).
"""
from __future__ import annotations

import torch
from torch._inductor.output_code import OutputCode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx._graph_pickler import GraphPickler, Options
from torch.utils._mode_utils import no_dispatch


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
    return _ValuePickler.dumps(gm, opts)


class _ValuePickler(GraphPickler):
    """GraphPickler with plain example values pickled by their layout (module docstring)."""

    def reducer_override(self, obj):
        if type(obj) is FakeTensor:
            layout = _plain_layout(obj)
            if layout is not None:
                return _fake_of_layout, (layout, self._unpickle_state)
        return super().reducer_override(obj)


def _plain_layout(t) -> tuple | None:
    """(sizes, strides, offset, storage bytes, dtype, device, requires_grad) of a strided
    FakeTensor of static sizes, or None for any other."""
    if t.layout is not torch.strided or t.is_quantized or t.is_nested or t.is_conj() \
            or t.is_neg():
        return None
    dims = (*t.shape, *t.stride(), t.storage_offset())
    if not all(type(d) is int for d in dims):
        return None
    nbytes = t.untyped_storage().nbytes()
    if type(nbytes) is not int:
        return None
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), nbytes, t.dtype,
            str(t.device), bool(t.requires_grad))


def _fake_of_layout(layout, state):
    """A FakeTensor of `_plain_layout`'s layout in the unpickling's fake mode."""
    shape, stride, offset, nbytes, dtype, device, requires_grad = layout
    with no_dispatch():
        flat = torch.empty((nbytes // dtype.itemsize,), dtype=dtype, device="meta")
        meta = torch.empty((0,), dtype=dtype, device="meta")
        meta.set_(flat.untyped_storage(), offset, shape, stride)
        if requires_grad:
            meta.requires_grad_(True)
    return FakeTensor(state.fake_mode, meta, torch.device(device))


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
