"""Compiling one aten FX graph (a forward, backward or inference graph from AOTAutograd).

`compile_graph(gm, example_inputs, kind) -> CompiledGraph`, a boxed callable (AOTAutograd calls
it with one list of arguments). Steps:
-1. `layout_channels_last.channels_last`: on CUDA graphs with 2-D convolutions, convolutions
   read NHWC operands and the layout-agnostic ops between them compute NHWC values (example
   values recomputed); outputs keep eager's strides but a training forward's saved tensors,
   whose strides are reported to AOTAutograd for the backward (that module's docstring);
0. `rewrite_scan.cumsums_as_masked_sums` writes a cumsum of integers over a short axis as a
   masked sum (a reduction the schedulers fuse with its producers);
   `rewrite_index.index_by_aranges` turns advanced indexing by arange grids (HF's attention
   masks) into views, `rewrite_index_constants.index_by_constants` indexing (and index_put)
   by a constant index tensor (`x[:, :, [-2]]`) into slices; `rewrites.skip_detach` lets fused
   ops read a detached tensor itself;
   `sink_views` / `hoist_views` move dtype casts next to the compute they fuse with (above the
   views they read, or below a view of an unfused op's result); `sink_views_past_binary` moves
   an add of a fused value's view and an input below the view (and the casts after it),
   `hoist_views_past_binary` a view of an add of unfused values (or their casts) above it;
   `rewrites.unfuse_bias` splits a float32 addmm read by fused ops into mm + add;
   `rewrite_reduce.sum_through_views` lets a sum of a flattening view of a fused value read
   the value itself (a bias gradient then joins the kernel computing its input);
   `rewrite_reduce.unroll_small_sums` writes a sum of at most 4 elements of a value no fused op
   computes as adds of selects (a grouped-query key gradient joins its rotary backward);
1. every node is asked `support.node_support` (getitems follow their tuple's node);
2. `partition.partition` groups supported nodes into convex regions; the copy_ of a mutated
   input stays in one only beside its source and every other reader of the input
   (`mutations.placement_problem`), else it is marked unsupported and the graph partitioned
   again;
3. each region is lowered to a Fusion (`lower.lower_region`), shared with every region of the
   same canonical form (`lower.region_key`: the layers of a model, recompiles) through a cache,
   or loaded with its segmentation and kernel plans from disk (`plan_cache.py`: a process that
   compiled this form before); a node whose lowering fails is marked unsupported with the
   reason and the graph is partitioned again (a few rounds at most: each round removes at
   least one node);
4. a new graph is written with regions and the remaining nodes as units in a topological order
   (`partition.unit_order`): a region is one call of its `FusedRegion` and a getitem per output,
   the other nodes are copied as they are (they run as eager aten calls; views and matmuls
   through the tensor method or torch function of the same op, `rewrites.fast_calls`);
5. every region's kernels are planned from the example values (`FusedRegion.prepare`) and their
   NVRTC compiles start in background threads (runtime/nvrtc.py `compile_async`), so they
   overlap each other and the planning of later regions; the first call waits for each kernel
   where it needs it. Newly lowered regions are then written to disk (`plan_cache.store`).
The graph's own inputs, outputs and their order are unchanged, so AOTAutograd's wrappers (input
mutations, aliased outputs, saved tensors) see what they expect.

`CompiledGraph.report()` says what was fused: regions, the nodes left to FX with their reasons
(but host size arithmetic under dynamic shapes, `support.is_size_arithmetic`: no tensor op).
`PYFUSER_DUMP=fx_graph` prints the graph before and after.
"""
from __future__ import annotations

import logging
import operator
from collections import Counter, OrderedDict

import torch

from ... import dump as D
from . import plan_cache
from .mutations import is_input_copy, placement_problem
from .layout_channels_last import channels_last, report_output_strides
from .lower import RegionLoweringError, lower_region, region_key, resolve_symints
from .partition import Region, partition, unit_order
from .region import FusedRegion
from .rewrite_index import index_by_aranges
from .rewrite_index_constants import index_by_constants
from .rewrite_reduce import sum_through_views, unroll_small_sums
from .rewrite_scan import cumsums_as_masked_sums
from .rewrites import (fast_calls, hoist_views, hoist_views_past_binary, sink_views,
                       sink_views_past_binary, skip_detach,
                       unfuse_bias)
from .support import is_compute, is_getitem, is_size_arithmetic, node_support, returned_views

log = logging.getLogger("pyfuser")
_MAX_ROUNDS = 64
_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_CACHE_SIZE = 4096
_counter = [0]


def lowered_for(region):
    """The LoweredRegion of a region, from the cache when an equal one was lowered before (in
    this process, else on disk: plan_cache.py)."""
    plan = resolve_symints(region)
    key = region_key(region, plan)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    lowered = plan_cache.load(region, key, plan)
    if lowered is None:
        lowered = lower_region(region, plan)
        lowered.store_as = (key, plan)          # written to disk once prepared
    _CACHE[key] = lowered
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return lowered


def clear_cache() -> None:
    _CACHE.clear()


class CompiledGraph:
    """The rewritten graph, callable with AOTAutograd's boxed convention (`f(args_list)`)."""

    def __init__(self, kind: str, gm, regions, unsupported: dict, original: str):
        # an instance attribute: AOTAutograd wraps the backward compiler's result in
        # torch._dynamo.disable, whose functools.wraps copies the instance's __dict__ only
        self._boxed_call = True
        self.__name__ = f"pyfuser_{kind}_graph"
        self.kind = kind
        self.gm = gm
        self.regions = regions
        self.unsupported = unsupported          # node name -> reason
        self.original = original
        self._forward = gm.forward
        self.layout = None                      # the channels-last pass' LayoutReport, if any

    def __call__(self, args):
        return self._forward(*args)

    def kernels(self) -> int:
        """Kernels the fused regions ran in the last call (aten kernels not counted)."""
        return sum(r.kernels() for r in self.regions)

    def report(self) -> dict:
        reasons = Counter(self.unsupported.values())
        return {"kind": self.kind, "regions": len(self.regions),
                "fused_nodes": sum(len(r.ops) for r in self.regions),
                "unfused": dict(reasons.most_common())}


_COMPILED: list = []


def compiled_graphs() -> list:
    """Every CompiledGraph made in this process, oldest first (tests and benchmarks read it)."""
    return list(_COMPILED)


def reset_compiled() -> None:
    _COMPILED.clear()


def compile_graph(gm, example_inputs=None, kind: str = "forward") -> CompiledGraph:
    layout = channels_last(gm, example_inputs, kind)
    if layout is not None and layout.saved_channels_last:
        report_output_strides(gm)
    graph = gm.graph
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    graph_outputs = set(out_node.all_input_nodes)
    fusible = lambda n: is_compute(n) and node_support(n, graph_outputs)[0]   # noqa: E731
    if cumsums_as_masked_sums(graph, fusible) + index_by_aranges(graph, fusible) + \
            index_by_constants(graph, fusible) + skip_detach(graph, fusible) + \
            sink_views(graph) + hoist_views(graph, fusible) + \
            sink_views_past_binary(graph, fusible) + hoist_views_past_binary(graph, fusible) + \
            unfuse_bias(graph, fusible) + sum_through_views(graph, fusible) + \
            unroll_small_sums(graph, fusible):
        gm.recompile()
    chains, split = returned_views(graph, out_node)
    graph_outputs |= chains
    if split:
        gm.recompile()
    nodes = list(graph.nodes)
    unsupported: dict = {}
    supported = set()
    for n in nodes:
        if is_getitem(n):
            continue
        ok, why = node_support(n, graph_outputs)
        if ok:
            supported.add(n)
        elif n.op == "call_function" and not is_size_arithmetic(n):
            unsupported[n.name] = why
    supported |= {n for n in nodes if is_getitem(n) and n.args[0] in supported}
    for _ in range(_MAX_ROUNDS):
        regions = partition(nodes, supported)
        misplaced = _misplaced_copies(regions, supported)
        if misplaced:
            for n, why in misplaced:
                supported.discard(n)
                unsupported[n.name] = why
            continue
        try:
            lowered = [lowered_for(r) for r in regions]
            break
        except RegionLoweringError as e:
            bad = e.node.args[0] if is_getitem(e.node) else e.node
            drop = {bad} | {u for u in bad.users if is_getitem(u)}
            supported -= drop
            unsupported[bad.name] = e.reason
            log.debug("pyfuser: %s stays unfused: %s", bad.name, e.reason)
    else:
        regions, lowered = [], []
    fused = []
    new_gm = _rewrite(gm, nodes, regions, lowered, fused, kind)
    _prepare(fused)
    original = str(graph)
    D.dump("fx_graph", f"{kind} graph", lambda: f"{original}\n--- fused:\n{new_gm.graph}\n"
                                                f"--- left to FX: {unsupported}")
    compiled = CompiledGraph(kind, new_gm, fused, unsupported, original)
    compiled.layout = layout
    _COMPILED.append(compiled)
    return compiled


def _misplaced_copies(regions, supported) -> list:
    """[(copy_ node, why)] for the copies of mutated inputs the partition did not place where
    they may write (mutations.placement_problem): they stay FX nodes."""
    owner = {n: r for r in regions for n in r.nodes}
    out = []
    for n in supported:
        if is_input_copy(n):
            why = placement_problem(n, owner.get)
            if why:
                out.append((n, why))
    return sorted(out, key=lambda p: p[0].name)


def _prepare(fused) -> None:
    """Plan every region's kernels now, from the example values, so that their NVRTC compiles
    run in the background, overlapping one another and the planning of the next regions (the
    first call waits for what it needs); then store newly lowered regions on disk. Outside the
    tracer's modes (AOTAutograd calls the compilers under its FakeTensorMode): the stand-ins are
    plain meta tensors."""
    with _no_dispatch_modes():
        _prepare_regions(fused)


def _no_dispatch_modes():
    try:
        from torch.utils._python_dispatch import _disable_current_modes
        return _disable_current_modes()
    except ImportError:  # pragma: no cover - older torch
        import contextlib
        return contextlib.nullcontext()


def _prepare_regions(fused) -> None:
    # every region first: regions of one form share their LoweredRegion (its executors), and
    # each prepares its own sizes' plans, all of which the entry on disk must hold (stored after
    # the first region alone, a ResNet's other layers planned their kernels again every warm start)
    for fr in fused:
        fr.prepare()
    for fr in fused:
        lw = fr.lowered
        store_as = getattr(lw, "store_as", None)
        if store_as is not None:
            lw.store_as = None
            plan_cache.store(fr.region, lw, *store_as)


def _rewrite(gm, nodes, regions, lowered, fused, kind):
    g = torch.fx.Graph()
    env: dict = {}
    by_region = {id(r): lw for r, lw in zip(regions, lowered)}
    for unit in unit_order(nodes, regions):
        if isinstance(unit, Region):
            _counter[0] += 1
            name = f"pyfuser_{kind[:2]}_region_{_counter[0]}"
            fr = FusedRegion(name, by_region[id(unit)], unit, gm)
            fused.append(fr)
            call = g.call_function(fr, tuple(env[x] for x in unit.inputs))
            for k, o in enumerate(unit.outputs):
                item = g.call_function(operator.getitem, (call, k))
                item.meta = dict(o.meta)
                env[o] = item
            continue
        env[unit] = g.node_copy(unit, lambda a: env[a])
    fast_calls(g)
    new = torch.fx.GraphModule(gm, g)
    return new
