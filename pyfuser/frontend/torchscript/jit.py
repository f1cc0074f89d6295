"""Running a fused graph: groups through pyfuser, everything else through the eager runner.

`CompiledGraph(graph, module=None, arg_limit=128, cpu_executor=None)` fuses a copy of
`graph` (passes.run_pipeline) and is called like the original function. Each
`prim::PyfuserGroup` node gets a GroupRunner that:
  * on its first call lowers the subgraph with those inputs as examples (`lower_graph`) and
    remembers their guard signature (passes/guards.py);
  * on later calls runs the Fusion through `runtime.dispatch.execute_fusion` when the
    signature matches (new sizes, same rank/layout: no re-lowering, no recompilation), and
    else runs the unfused subgraph eagerly, logging the reason once. Inputs whose dtypes,
    sizes, strides and devices (per other value: type) passed the guard before pass it again
    without recomputing the signature, which is a function of exactly those (`_guard_key`);
  * is specialised on the values of inputs the lowering needs as constants (view sizes made
    of `aten::size` results, dims: `lowering.specialised_inputs`); new values of those are
    lowered again (at most MAX_VARIANTS per group, then eagerly);
  * runs eagerly, under autograd, when grad mode is on and an input requires grad (pyfuser's
    kernels have no backward): outputs require grad exactly when eager's do, never a
    silently detached result. The rest of the graph runs in the caller's grad mode;
  * when lowering or running fails with a PyfuserError, runs eagerly from then on (reason
    logged once); an ExecuteError (these inputs' sizes do not fit the fusion, e.g. an axis
    of size 1 the fusion did not take as broadcast) runs that call eagerly. Never a silent
    wrong result: every fallback is the eager subgraph.
`prim::add_optional` and `prim::*_copy` nodes left outside groups run eagerly here (EAGER).
`last_run` (RunStats) describes the last call: groups, kernels launched, host segments,
fallbacks. Counts come from the dispatcher's RunReport (`last_report(fusion)`) of each group call, i.e. from
the segments the segmenter split the group into (a group of views only is host segments and 0
kernels; views peeled off a group's edges cost no kernel):
  * `kernels`: on CUDA, the kernels actually launched (`launched`); on the CPU, the kernel
    segments run (what a GPU run would launch, whichever CPU executor ran them);
  * `host_segments` / `eager_segments`: segments run as views on the host / on the evaluator.
A group that falls back to eager counts nothing here (it is in `fallbacks`/`eager_groups`).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from ...dump import dump
from ...errors import ExecuteError, PyfuserError
from ...ir.shapes import bind
from ...runtime import dispatch
from ..lowering import lower_graph
from ..lowering.lower import HostValue, specialised_inputs
from ..lowering.aten_pointwise import check_inplace_cast
from .ops import call_op
from .passes import run_pipeline
from .passes.alias_copy import FROM_COPY
from .passes.groups import GROUP_KIND
from .passes.guards import mismatch, signature
from .module_flags import guards_hold
from .passes.report import describe
from .runner import run_graph

log = logging.getLogger("pyfuser")


def _add_optional(node, args, ctx):
    a, b = args
    return [a if b is None else torch.add(a, b)]


def _inplace_cast(node, args, ctx):
    result, self_ = args
    check_inplace_cast(result.dtype, self_.dtype)
    return [result.to(self_.dtype)]


def _copy_op(node, args, ctx):
    return call_op(FROM_COPY[node.kind], args, ctx.map_device)


EAGER = {"prim::add_optional": _add_optional, "prim::inplace_cast": _inplace_cast,
         **{k: _copy_op for k in FROM_COPY}}


@dataclass
class RunStats:
    groups: int = 0
    kernels: int = 0
    fallbacks: list = field(default_factory=list)
    eager_groups: int = 0
    executor: str = ""
    host_segments: int = 0
    eager_segments: int = 0

    def as_dict(self) -> dict:
        return {"groups": self.groups, "kernels": self.kernels, "fallbacks": list(self.fallbacks),
                "eager_groups": self.eager_groups, "executor": self.executor,
                "host_segments": self.host_segments, "eager_segments": self.eager_segments}

    def add_run(self, report, on_cuda: bool) -> None:
        """Count one group call from its fusion's RunReport (`dispatch.last_report`)."""
        if report is None:
            return
        self.kernels += report.launched if on_cuda else report.kernels
        self.host_segments += report.host_segments
        self.eager_segments += report.eager_segments


_MAX_PASSED = 256
GRAD_REASON = ("an input requires grad and grad mode is on: pyfuser's kernels have no "
               "backward, so this group runs eagerly with autograd (call under torch.no_grad() "
               "or torch.inference_mode() to fuse)")
MAX_VARIANTS = 8           # value specialisations (sizes from the host) kept per group


def _freeze(a):
    return tuple(_freeze(e) for e in a) if isinstance(a, (list, tuple)) else a


def _guard_key(args) -> tuple:
    """What the guard signature is a function of, cheap to build and hash: per tensor its dtype,
    sizes, strides and device; per other value its type."""
    return tuple((a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor)
                 else type(a) for a in args)


class GroupRunner:
    def __init__(self, node, index: int):
        self.node, self.index = node, index
        self.subgraph = node.g("Subgraph")
        self.special = specialised_inputs(self.subgraph)
        self.lowered = None           # the first call's lowering (its fusion: dumps, tests)
        self.variants: dict = {}      # values of the specialised inputs -> LoweredGraph or reason
        self.spec = None
        self.dead = None              # reason this group runs eagerly for good
        self._logged: set = set()
        self._passed: dict = {}       # _guard_key of inputs that passed -> (lowered, on CUDA)
        self._host: dict = {}         # (_guard_key, variant) -> host-answered outputs

    @property
    def name(self) -> str:
        return f"{GROUP_KIND}_{self.index} -> " + ", ".join("%" + v.debug_name for v in self.node.outputs)

    def _fallback(self, reason, args, ctx, stats):
        stats.fallbacks.append({"node": self.name, "kind": GROUP_KIND, "reason": reason})
        stats.eager_groups += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("pyfuser: %s runs eagerly: %s", self.name, reason)
            dump("fallback", self.name, reason)
        return ctx.run_graph(self.subgraph, args)

    def _variant(self, args):
        """The LoweredGraph for these inputs' specialised values (lowered on first sight), or
        the reason they run eagerly."""
        vkey = tuple(_freeze(args[i]) for i in self.special)
        lowered = self.variants.get(vkey)
        if lowered is not None:
            return lowered
        if len(self.variants) >= MAX_VARIANTS:
            return (f"more than {MAX_VARIANTS} specialisations on the values of "
                    + ", ".join(f"%{self.subgraph.inputs[i].debug_name}" for i in self.special))
        try:
            lowered = lower_graph(self.subgraph, args)
        except PyfuserError as e:
            lowered = f"lowering failed: {e}"
        self.variants[vkey] = lowered
        if self.lowered is None and not isinstance(lowered, str):
            self.lowered = lowered
            dump("fusion_ir", self.name, lambda: str(lowered.fusion))
        return lowered

    def _admit(self, args):
        """(LoweredGraph, on CUDA) for inputs not seen before, or why they run eagerly."""
        sig = signature(args)
        if self.spec is None:
            self.spec = sig
        elif sig != self.spec:
            return f"guard failed: {mismatch(self.spec, sig)}"
        lowered = self._variant(args)
        if isinstance(lowered, str):
            if not self.special:          # no other specialisation can lower: for good
                self.dead = lowered
            return lowered
        return lowered, any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)

    def run(self, args, ctx, stats, cpu_mode):
        if self.dead is not None:
            return self._fallback(self.dead, args, ctx, stats)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            return self._fallback(GRAD_REASON, args, ctx, stats)
        key = _guard_key(args)
        if self.special:                 # and the values the group is specialised on
            key = (key, tuple(_freeze(args[i]) for i in self.special))
        hit = self._passed.get(key)
        if hit is None:                  # not seen yet: the full guard signature
            hit = self._admit(args)
            if isinstance(hit, str):
                return self._fallback(hit, args, ctx, stats)
            if len(self._passed) >= _MAX_PASSED:
                self._passed.clear()
            self._passed[key] = hit
        lowered, on_cuda = hit
        fusion = lowered.fusion
        fargs = lowered.fusion_args(args)
        try:
            outs = dispatch.execute_fusion(fusion, fargs, None if on_cuda else cpu_mode) \
                if fusion.outputs else []
            host = self._host_values(key, lowered, fargs) if lowered.host_values else None
        except ExecuteError as e:        # these inputs only (a size the fusion cannot take)
            return self._fallback(f"inputs not accepted: {e}", args, ctx, stats)
        except PyfuserError as e:
            self.dead = f"execution failed: {type(e).__name__}: {e}"
            return self._fallback(self.dead, args, ctx, stats)
        stats.add_run(dispatch.last_report(fusion) if fusion.outputs else None, on_cuda)
        if host is None:
            return [outs[i] for i in lowered.output_map]
        return [outs[m] if h is None else (list(h) if isinstance(h, list) else h)
                for m, h in zip(lowered.output_map, host)]

    def _host_values(self, key, lowered, fargs) -> list:
        """Per graph output, its HostValue's value (None for kernel outputs); the sizes are fixed
        by the guard key, so they are computed once per key."""
        host = self._host.get((key, id(lowered)))
        if host is None:
            b = bind(lowered.fusion, fargs)
            if len(self._host) >= _MAX_PASSED:
                self._host.clear()
            host = self._host[(key, id(lowered))] = [
                m.value(b) if isinstance(m, HostValue) else None for m in lowered.output_map]
        return host


MAX_FLAG_VARIANTS = 4


@dataclass
class _Variant:
    """One fused graph of a CompiledGraph (one per set of module flag values)."""
    original: object
    graph: object
    report: object
    runners: dict
    guards: list


class CompiledGraph:
    """A fused graph, callable like the function it came from. For a module whose flags were
    folded (`flag_guards`, module_flags.py), each call checks them; when one changed, the graph
    is built again by `rebuild()` -> (graph, guards) for the new values (a few kept)."""

    def __init__(self, graph, module=None, arg_limit: int = 128, cpu_executor=None,
                 flag_guards=(), rebuild=None):
        self.module = module
        self.arg_limit = arg_limit
        self.cpu_mode = cpu_executor or os.environ.get("PYFUSER_CPU_EXECUTOR") or "interpret"
        self._rebuild = rebuild
        self._variants: list = []
        self._use(self._make_variant(graph, list(flag_guards)))

    def _make_variant(self, graph, guards) -> _Variant:
        fused = graph.copy()
        report = run_pipeline(fused, self.arg_limit)
        groups = [n for n in fused.all_nodes() if n.kind == GROUP_KIND]
        v = _Variant(graph, fused, report, {n: GroupRunner(n, i) for i, n in enumerate(groups)},
                     guards)
        if len(self._variants) >= MAX_FLAG_VARIANTS:
            self._variants.pop(0)
        self._variants.append(v)
        return v

    def _use(self, v: _Variant) -> None:
        self._variant = v
        self.original, self.graph, self.report, self.runners = v.original, v.graph, v.report, v.runners
        self.last_run = RunStats(groups=len(v.runners), fallbacks=v.report.fallbacks())

    def _check_flags(self) -> None:
        """Switch to (or build) the variant whose folded module flags hold now."""
        if guards_hold(self._variant.guards):
            return
        for v in self._variants:
            if guards_hold(v.guards):
                self._use(v)
                return
        graph, guards = self._rebuild()
        log.info("pyfuser: a module flag changed (e.g. train()/eval()): graph built again")
        self._use(self._make_variant(graph, guards))

    @property
    def num_groups(self) -> int:
        return len(self.runners)

    def _handler(self, stats):
        def handle(node, args, ctx):
            runner = self.runners.get(node)
            if runner is not None:
                return runner.run(args, ctx, stats, self.cpu_mode)
            fn = EAGER.get(node.kind)
            return fn(node, args, ctx) if fn is not None else None
        return handle

    def run(self, inputs: list, device=None) -> list:
        """Run on the graph's inputs (the module first for `%self` graphs); all outputs."""
        stats = RunStats(groups=len(self.runners), fallbacks=self.report.fallbacks(),
                         executor=self.cpu_mode)
        self.last_run = stats
        return run_graph(self.graph, inputs, device=device, node_handler=self._handler(stats),
                         no_grad=False)

    def __call__(self, *args):
        if self._rebuild is not None:
            self._check_flags()
        inputs = ([self.module] if self.module is not None else []) + list(args)
        outs = self.run(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __str__(self) -> str:
        return str(self.graph)


def eager_handler(node, args, ctx):
    """Node handler for running graphs that contain fuser-made kinds, without fusion."""
    fn = EAGER.get(node.kind)
    return fn(node, args, ctx) if fn is not None else None


__all__ = ["CompiledGraph", "RunStats", "GroupRunner", "EAGER", "eager_handler", "describe"]
