"""Running a fused graph: call plans per input signature, groups through pyfuser, the rest
through PyTorch.

`CompiledGraph(graph, module=None, arg_limit=128, cpu_executor=None)` fuses a copy of `graph`
(passes.run_pipeline) and is called like the original function. Each `prim::PyfuserGroup` node
gets a GroupRunner (group_runner.py: lowering per input signature, guards, eager fallback, the
group's fast call).

A call (`f(*args)`) computes one key over the top-level inputs (plan.key_function: grad mode;
per tensor dtype, sizes, strides, data_ptr % 16, device, requires_grad; ints, bools, strings
and number lists by value; other inputs by type) and looks it up among the call plans
(plan.py): straight-line Python for the whole graph with constants, submodules, aten
overloads and the groups' recorded programs bound. A miss runs the graph checked through the
eager runner while recording it, and makes the plan for that key (at most MAX_PLANS per fused
graph, oldest dropped); every signature gets its own fused kernels (its groups are lowered for
it), never a permanent eager fallback. The checked path also runs, without a plan, when
PYFUSER_DUMP or PYFUSER_POISON_OUTPUTS is set or the inputs are not of the declared kinds.
Plans are dropped when anything they bound is (clear_caches, a group that stops being fused,
a module flag that changed).

`run(inputs, device=None)` is the checked path alone (the `pyfuser run` command, tests): the
eager runner walks the graph node by node.

`prim::add_optional` and `prim::*_copy` nodes left outside groups run eagerly here (EAGER).
`last_run` (RunStats) describes the last call: groups, kernels launched, host segments,
fallbacks. Counts come from the dispatcher's RunReport (`last_report(fusion)`) of each group
call, i.e. from the segments the segmenter split the group into (a group of views only is host
segments and 0 kernels; views peeled off a group's edges cost no kernel):
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

from ...errors import PyfuserError
from ..lowering.aten_pointwise import check_inplace_cast
from .group_runner import GRAD_REASON, MAX_VARIANTS, GroupRunner  # noqa: F401 (re-exported)
from .module_flags import guards_hold
from .ops import call_op
from .passes import run_pipeline
from .passes.alias_copy import FROM_COPY
from .passes.groups import GROUP_KIND
from .passes.report import describe
from .runner import run_graph

log = logging.getLogger("pyfuser")
MAX_PLANS = 32             # call plans kept per fused graph (input signatures)


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

    def copy(self) -> "RunStats":
        return RunStats(self.groups, self.kernels, list(self.fallbacks), self.eager_groups,
                        self.executor, self.host_segments, self.eager_segments)


MAX_FLAG_VARIANTS = 4


@dataclass
class _Variant:
    """One fused graph of a CompiledGraph (one per set of module flag values), with its plans."""
    original: object
    graph: object
    report: object
    runners: dict
    guards: list
    plans: dict = field(default_factory=dict)
    key_of: object = None
    call: object = None
    entry: object = None              # what a call runs: `call`, or the native runner's `run`
    native: object = None             # the native Runner of its direct plans (plan.Plan.direct)
    no_graphs: object = None          # why its plans are not captured (cuda_graphs=True)


class CompiledGraph:
    """A fused graph, callable like the function it came from. For a module whose flags were
    folded (`flag_guards`, module_flags.py), each call checks them; when one changed, the graph
    is built again by `rebuild()` -> (graph, guards) for the new values (a few kept)."""

    def __init__(self, graph, module=None, arg_limit: int = 128, cpu_executor=None,
                 flag_guards=(), rebuild=None, cuda_graphs: bool = False, graph_backend=None,
                 binder=None):
        self.module = module
        self.binder = binder                # call_args.Binder: keywords and defaults, or None
        self.arg_limit = arg_limit
        self.cuda_graphs = bool(cuda_graphs)
        self._graph_backend = graph_backend
        self._graphed: list = []          # GraphedPlans holding a captured graph, oldest first
        self.cpu_mode = cpu_executor or os.environ.get("PYFUSER_CPU_EXECUTOR") or "interpret"
        self._rebuild = rebuild
        self._variants: list = []
        self._use(self._make_variant(graph, list(flag_guards)))

    def _make_variant(self, graph, guards) -> _Variant:
        from .plan import key_function
        fused = graph.copy()
        report = run_pipeline(fused, self.arg_limit)
        groups = [n for n in fused.all_nodes() if n.kind == GROUP_KIND]
        v = _Variant(graph, fused, report, {n: GroupRunner(n, i) for i, n in enumerate(groups)},
                     guards)
        for runner in v.runners.values():
            runner.listeners.append(lambda v=v: self._drop_plans(v))
        v.key_of = key_function(fused, 1 if self.module is not None else 0)
        v.call = v.entry = _dispatcher(self, v)
        if self.cuda_graphs:
            from .cuda_graphs import graphable
            v.no_graphs = graphable(fused, 1 if self.module is not None else 0)
            if v.no_graphs is not None:
                log.info("pyfuser: no CUDA graphs for this function: %s", v.no_graphs)
        if len(self._variants) >= MAX_FLAG_VARIANTS:
            self._drop_plans(self._variants.pop(0))
        self._variants.append(v)
        return v

    def _use(self, v: _Variant) -> None:
        self._variant = v
        self._entry = v.entry if self._rebuild is None else self._flagged
        self.original, self.graph, self.report, self.runners = v.original, v.graph, v.report, v.runners
        self.last_run = self._new_stats()

    def _new_stats(self) -> RunStats:
        v = self._variant
        return RunStats(groups=len(v.runners), fallbacks=v.report.fallbacks(),
                        executor=self.cpu_mode)

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

    @property
    def plans(self) -> dict:
        """The call plans of the current fused graph: plan key -> plan.Plan (None where no plan
        could be made for that key: those calls run checked)."""
        return self._variant.plans

    def _handler(self, stats):
        runners, cpu_mode = self.runners, self.cpu_mode

        def handle(node, args, ctx):
            runner = runners.get(node)
            if runner is not None:
                return runner.run(args, stats, cpu_mode, ctx)
            fn = EAGER.get(node.kind)
            return fn(node, args, ctx) if fn is not None else None
        return handle

    def run(self, inputs: list, device=None) -> list:
        """Run on the graph's inputs (the module first for `%self` graphs), checked, node by
        node; all outputs as a list."""
        stats = self._new_stats()
        self.last_run = stats
        return run_graph(self.graph, inputs, device=device, node_handler=self._handler(stats),
                         no_grad=False)

    def __call__(self, *args, **kwargs):
        b = self.binder
        if kwargs or (b is not None and len(args) != b.count):
            if b is None:
                raise PyfuserError("this compiled graph takes positional arguments only "
                                   "(it was not made from a Python or TorchScript function)")
            args = b.bind(args, kwargs)
        return self._entry(args)

    def _flagged(self, args):
        self._check_flags()
        return self._variant.entry(args)

    def _checked(self, args):
        inputs = ([self.module] if self.module is not None else []) + list(args)
        outs = self.run(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _miss(self, variant, args, key):
        """No plan for this key: run checked, and make the plan from that run (with
        $PYFUSER_GC_PAUSE=1 the cyclic garbage collector paused: runtime/gc_pause.py)."""
        from ...runtime.gc_pause import paused
        with paused():
            return self._miss_paused(variant, args, key)

    def _miss_paused(self, variant, args, key):
        from ...runtime.call_keys import slow_env
        if key is None or slow_env():
            return self._checked(args)
        from .plan import build_plan
        stats = self.last_run = self._new_stats()
        outs, plan = build_plan(self, variant, args, stats, self._new_stats)
        if plan is not None and self.cuda_graphs and variant.no_graphs is None:
            from .cuda_graphs import Backend, GraphedPlan
            plan = GraphedPlan(plan, self, self._graph_backend or Backend())
        plans = variant.plans
        if len(plans) >= MAX_PLANS:
            old = plans.pop(next(iter(plans)))
            if hasattr(old, "release"):
                old.release()
                if old in self._graphed:
                    self._graphed.remove(old)
        plans[key] = plan
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _go_native(self, variant, plan, args) -> None:
        """A direct plan (one fusion on the graph's inputs), on its first hit: its call is the
        fusion's recorded program, handed to a native Runner (where built) that answers the
        whole call: key, lookup, allocation, launch in C++; a miss (or grad mode on) calls the
        Python path."""
        from ...runtime import native
        from ...runtime.call_keys import _RAW_ENV
        plan.native_tried = True
        if self._rebuild is not None or self.cuda_graphs:
            return
        progs, key, unpack, order = plan.direct
        progs.handoff(args, key)
        data = progs.native_data.get(key)
        mod = native.runner_module() if data is not None else None
        if mod is None:
            return
        if variant.native is None:
            variant.native = mod.Runner(len(args), variant.call, _RAW_ENV,
                                        (b"PYFUSER_DUMP", b"PYFUSER_POISON_OUTPUTS"),
                                        grad_check=True, unpack=unpack)
        steps, results, effects, device = data
        variant.native.add(list(args), steps, [results[k] for k in order],
                           list(effects) + [("setattr", self, "last_run", plan.stats)], device)
        variant.entry = variant.native.run
        if self._variant is variant and self._rebuild is None:
            self._entry = variant.entry

    def _drop_plans(self, variant) -> None:
        """Forget a fused graph's plans (something they bound changed), their graphs too."""
        if variant.native is not None:
            variant.native.clear()                # its misses go to the Python dispatcher
        for plan in list(variant.plans.values()):
            if hasattr(plan, "release"):
                plan.release()
                if plan in self._graphed:
                    self._graphed.remove(plan)
        variant.plans.clear()

    def _note_graph(self, graphed) -> None:
        """A GraphedPlan is capturing: keep at most MAX_GRAPHS graphs (the oldest released)."""
        from .cuda_graphs import MAX_GRAPHS
        if graphed in self._graphed:
            self._graphed.remove(graphed)
        self._graphed.append(graphed)
        while len(self._graphed) > MAX_GRAPHS:
            self._graphed.pop(0).release()

    def __str__(self) -> str:
        return str(self.graph)


def _dispatcher(compiled, variant):
    """`call(args)`: the plan key, one lookup, the plan (a plan error names its node); a miss,
    a key that fails (inputs not of the declared kinds) or a debugging environment runs
    checked."""
    from ...runtime.call_keys import _RAW_ENV, slow_env
    key_of, plans, miss = variant.key_of, variant.plans, compiled._miss
    get = plans.get
    if _RAW_ENV is not None:
        env = _RAW_ENV

        def quiet():
            return b"PYFUSER_DUMP" not in env and b"PYFUSER_POISON_OUTPUTS" not in env
    else:
        def quiet():
            return not slow_env()

    def call(args):
        try:
            key = key_of(args)
            plan = get(key)
        except Exception:  # noqa: BLE001 - not the declared kinds of input: the checked path
            key = plan = None
        if plan is not None and quiet():
            if plan.direct is not None and not plan.native_tried:   # its first hit
                compiled._go_native(variant, plan, args)
            try:
                return plan.fn(*args)
            except Exception as e:
                raise plan.error(e) from e
        if key is not None and key in plans:      # no plan could be made for this key
            return compiled._checked(args)
        return miss(variant, args, key)
    return call


def eager_handler(node, args, ctx):
    """Node handler for running graphs that contain fuser-made kinds, without fusion."""
    fn = EAGER.get(node.kind)
    return fn(node, args, ctx) if fn is not None else None


__all__ = ["CompiledGraph", "RunStats", "GroupRunner", "EAGER", "eager_handler", "describe",
           "MAX_PLANS"]
