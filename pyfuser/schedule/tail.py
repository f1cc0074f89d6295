"""The tail scheduler: a reduction kernel whose last block to finish reduces the kernel's row
results to the fusion's scalars (a loss's mean over the rows) in the same launch.

A cross-entropy's mean is two reduction domains: the row's (max, sum of exp, the target's
logit over the classes: one row kernel) and the rows' (the losses summed and divided by the
count of targets not ignored). No other scheduler takes both, so they were two kernels, the
second a launch of a few microseconds over a few thousand values (docs/benchmarks.md, the
twenty-sixth session). This scheduler cuts such a fusion into
- the head: the reductions that reduce some axes (a row's), everything they read and the
  pointwise ops on their results, planned by a reduction-family scheduler (reduction,
  inner_persistent, outer_persistent) on its own sub-Fusion;
- the tail: the reductions of every axis (to a scalar) that no reduction reads, whose inputs
  span only the head's kept axes, and the ops after them, planned by the reduction scheduler
  on its own sub-Fusion as one block of the head's threads;
and codegen/tail_lowering.py makes them one kernel: every block runs the head, then counts
itself in on a semaphore; the block that arrives last runs the tail over the head's results
(written to global memory, fenced), in a fixed order, so the result is the same every run.

`split(fusion)` (a function of the Fusion alone, cached on it): the head and tail exprs, the
tensors the head computes for the tail (`crossing`) and the two sub-Fusions (segment/extract.py).
Pointwise ops of neither (a target's `!= ignore_index`) go to every side that reads them.
`can_schedule`: a split exists, the head is taken by a reduction-family scheduler's compile
check and the tail by the reduction scheduler's; no in-place outputs, no random numbers.
`run_check`: the tail reads at most MAX_TAIL_ELEMENTS a tensor and at least one (an empty
head launches no block, and the tail would never run), the head is taken for its inputs and
its block has at least a warp's threads, which the tail's plan takes too (both plans made).
Refused at run time, the segment runs as the other schedulers' kernels (segment/split.py).
`schedule`: the two plans (the head's with its reduced index split over no blocks: the
kernel's semaphore is the tail's).

Off by default, on with $PYFUSER_TAIL=1: on an H200 (docs/benchmarks.md, the twenty-eighth
session) cross-entropy 4096x32000 took 140.3 / 141.1 µs as one kernel against 138.6 / 139.9
as two in float32 (two rounds), 78.7 / 79.4 against 78.4 / 78.7 in bfloat16: the second
launch and its gap are saved, and more is spent inside the kernel (3.8-4.9 µs over the row
kernel alone, back to back), by the last block's serial tail (one block reading every row's
loss and target) and every block's fence and ticket before it retires. Kept for the kernel
count and as the place for a cheaper tail (docs/reductions.md, The tail).

Invariant: every decision reads the Fusion, the layout signature of the head's and tail's
inputs and the size classes of their plans (`size_class`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import dump as D
from ..errors import SchedulerError
from ..ir import exprs as E
from ..ir.object_cache import cached_on
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import layout as L

NAME = "tail"
MAX_TAIL_ELEMENTS = 16384      # a tail input's elements (one block reads them all)
MIN_THREADS = 32               # the tail's warp reductions name a full warp
HEAD_SCHEDULERS = ("reduction", "inner_persistent", "outer_persistent")
_CACHE = "_pyfuser_tail_split"      # Fusion attribute: dropped by any edit (ir/fusion.py)


@dataclass
class Split:
    head_exprs: list
    tail_exprs: list
    crossing: list              # tensors the head computes and the tail reads (fusion order)
    head_outputs: list          # indices into fusion.outputs the head computes
    tail_outputs: list          # indices into fusion.outputs the tail computes
    tail_reduction_inputs: list  # the tail reductions' inputs (the run check's sizes)
    head_scheduler: str         # the first reduction-family scheduler taking the head
    head: object = None         # segment.extract.Extracted
    tail: object = None


def _full(e) -> bool:
    """A reduction of every axis of its input that is not a size-1 broadcast."""
    tv = e.inputs[0]
    axes = set(e.axes)
    return all(a in axes or d.is_size_one_broadcast for a, d in enumerate(tv.logical))


def _descendants(seeds, exprs) -> set:
    """ids of the exprs (topological order) reading, transitively, an output of `seeds`."""
    out = {id(e) for e in seeds}
    produced = {id(o) for e in seeds for o in e.outputs}
    for e in exprs:
        if id(e) not in out and any(id(v) in produced for v in e.inputs):
            out.add(id(e))
            produced.update(id(o) for o in e.outputs)
    return out


def _ancestors(seeds, exprs) -> set:
    """ids of the exprs (topological order) whose outputs `seeds` read, transitively."""
    out = {id(e) for e in seeds}
    needed = {id(v) for e in seeds for v in e.inputs}
    for e in reversed(exprs):
        if id(e) not in out and any(id(o) in needed for o in e.outputs):
            out.add(id(e))
            needed.update(id(v) for v in e.inputs)
    return out


def _extent_key(uf, d):
    s = d.full_extent
    return ("const", s.value) if s.is_const else id(uf["find"](s))


def _analyse(fusion):
    """(Split, "") or (None, why not): the module docstring's cut, a function of the graph."""
    from .pointwise import _extent_classes
    if getattr(fusion, "aliases", None):
        return None, "in-place outputs"
    exprs = [e for e in fusion.used_exprs() if any(isinstance(o, TensorView) for o in e.outputs)]
    if any(isinstance(e, (E.RandomOp, E.PhiloxUniformOp)) for e in exprs):
        return None, "random numbers"
    reds = [e for e in exprs if isinstance(e, (E.ReductionOp, E.WelfordOp))]
    # the tail's: reductions of every axis that no reduction reads (a row of one element's
    # max reduces every axis too, but the row's sum reads it)
    tails = [e for e in reds if isinstance(e, E.ReductionOp) and _full(e) and not (
        _descendants([e], exprs) & {id(r) for r in reds if r is not e})]
    heads = [e for e in reds if not any(e is t for t in tails)]
    if not heads or not tails:
        return None, "not a row reduction followed by a reduction of its rows to scalars"
    uf = _extent_classes(fusion)
    kept, reduced = set(), set()
    for e in heads:
        for a, d in enumerate(e.inputs[0].logical):
            if not d.is_size_one_broadcast:
                (reduced if a in e.axes else kept).add(_extent_key(uf, d))
    for t in tails:
        keys = {_extent_key(uf, d) for d in t.inputs[0].logical if not d.is_size_one_broadcast}
        if not keys <= kept or keys & reduced:
            return None, (f"{t.op_name} of {t.inputs[0].name} reduces axes other than the "
                          "rows of the row reduction")
    tail_core = _descendants(tails, exprs)
    if any(id(e) in tail_core for e in heads):
        return None, "a row reduction reads a reduction of the rows"
    head_anc = _ancestors(heads, exprs)
    if head_anc & tail_core:
        return None, "a row reduction reads a reduction of the rows"
    head_core = (head_anc | _descendants(heads, exprs)) - tail_core
    free = [e for e in exprs if id(e) not in head_core and id(e) not in tail_core]
    head_ids = head_core | (_ancestors([e for e in exprs if id(e) in head_core], exprs) &
                            {id(e) for e in free})
    tail_ids = tail_core | (_ancestors([e for e in exprs if id(e) in tail_core], exprs) &
                            {id(e) for e in free})
    # a free op read by neither side computes a fusion output: the head's
    head_ids |= {id(e) for e in free if id(e) not in tail_ids}
    head_exprs = [e for e in exprs if id(e) in head_ids]
    tail_exprs = [e for e in exprs if id(e) in tail_ids]
    head_made = {id(o) for e in head_exprs for o in e.outputs}
    tail_made = {id(o) for e in tail_exprs for o in e.outputs}
    if any(id(v) in tail_made and id(v) not in head_made for e in head_exprs for v in e.inputs):
        return None, "a row reduction reads a reduction of the rows"
    crossing, seen = [], set()
    for e in tail_exprs:
        for v in e.inputs:
            if isinstance(v, TensorView) and id(v) in head_made and id(v) not in tail_made \
                    and id(v) not in seen:
                seen.add(id(v))
                crossing.append(v)
    head_outputs = [k for k, o in enumerate(fusion.outputs) if id(o) in head_made]
    tail_outputs = [k for k, o in enumerate(fusion.outputs)
                    if id(o) in tail_made and id(o) not in head_made]
    if len(head_outputs) + len(tail_outputs) != len(fusion.outputs):
        return None, "an output is not computed in the fusion"
    from .reduction import reduction_check, schedulers
    sp = Split(head_exprs, tail_exprs, crossing, head_outputs, tail_outputs,
               [t.inputs[0] for t in tails], "")
    _extract(fusion, sp)
    for s in schedulers():
        if s.name in HEAD_SCHEDULERS and s.compile_check(sp.head.fusion)[0]:
            sp.head_scheduler = s.name
            break
    else:
        return None, "no reduction scheduler takes the row reduction alone"
    ok, why = reduction_check(sp.tail.fusion)
    if not ok:
        return None, f"the reduction of the rows: {why}"
    return sp, ""


def _inputs_of(exprs) -> list:
    made = {id(o) for e in exprs for o in e.outputs}
    out, seen = [], set()
    for e in exprs:
        for v in e.inputs:
            if isinstance(v, TensorView) and id(v) not in made and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def _extract(fusion, sp: Split) -> None:
    from ..segment.extract import FusionIndex, extract
    index = FusionIndex(fusion)
    outs = [fusion.outputs[k] for k in sp.head_outputs]
    outs += [v for v in sp.crossing if not any(v is o for o in outs)]
    sp.head = extract(fusion, sp.head_exprs, _inputs_of(sp.head_exprs), outs, index=index)
    sp.tail = extract(fusion, sp.tail_exprs, _inputs_of(sp.tail_exprs),
                      [fusion.outputs[k] for k in sp.tail_outputs], index=index)


def split(fusion):
    """(Split, "") or (None, reason), cached on the Fusion object."""
    return cached_on(fusion, _CACHE, _analyse)


def enabled() -> bool:
    """$PYFUSER_TAIL=1 turns the scheduler on; off by default (module docstring: measured no
    faster than the two kernels)."""
    return os.environ.get("PYFUSER_TAIL") == "1"


def can_schedule(fusion) -> tuple[bool, str]:
    if not enabled():
        return False, "off (on with $PYFUSER_TAIL=1)"
    if len(fusion.exprs) < 2:
        return False, "not a row reduction followed by a reduction of its rows to scalars"
    sp, why = split(fusion)
    return sp is not None, why


# ---- run time ---------------------------------------------------------------------------------
def _head_scheduler(sp, head_inputs):
    from . import registry
    b = bind(sp.head.fusion, head_inputs)
    s = registry.select(sp.head.fusion, head_inputs, b, sp.head_scheduler)
    if s.name not in HEAD_SCHEDULERS:
        raise SchedulerError(f"tail scheduler: the row reduction goes to {s.name}")
    return s


def run_check(fusion, inputs, bindings) -> tuple[bool, str]:
    sp, why = split(fusion)
    if sp is None:
        return False, why
    for t in sp.tail_reduction_inputs:
        n = L.numel(bindings.shape(t))
        if n > MAX_TAIL_ELEMENTS:
            return False, f"the reduction of the rows reads {n} elements, more than " \
                          f"{MAX_TAIL_ELEMENTS} for one block"
        if n == 0:
            return False, "no rows: the last block, which reduces them, would never run"
    try:
        schedule(fusion, inputs)      # the head's scheduler, and a tail block of its threads
    except SchedulerError as e:
        return False, str(e)
    return True, ""


# ---- the schedule -----------------------------------------------------------------------------
@dataclass
class TailParams:
    head_scheduler: str = ""
    head: dict = field(default_factory=dict)
    tail: dict = field(default_factory=dict)
    index_type: str = "int"

    def as_dict(self) -> dict:
        return {"head_scheduler": self.head_scheduler, "index_type": self.index_type,
                "head": self.head, "tail": self.tail}


@dataclass
class TailSchedule:
    fusion: object              # the user's fusion
    split: Split
    head: object                # ReductionSchedule of split.head.fusion
    tail: object                # ReductionSchedule of split.tail.fusion
    params: TailParams


def schedule(fusion, inputs) -> TailSchedule:
    from ..segment.extract import input_values
    from . import reduction
    sp, why = split(fusion)
    if sp is None:
        raise SchedulerError(f"tail scheduler: {why}")
    inputs = list(inputs)
    b = bind(fusion, inputs)
    head_inputs = input_values(fusion, sp.head, inputs, b)
    name = _head_scheduler(sp, head_inputs).name
    head = reduction.schedule(sp.head.fusion, head_inputs, name, force={"splits": 1})
    threads = head.params.bdimx * head.params.bdimy
    if threads < MIN_THREADS:
        raise SchedulerError(f"tail scheduler: the row reduction's block has {threads} threads, "
                             f"fewer than {MIN_THREADS}")
    tail = reduction.schedule(sp.tail.fusion, input_values(fusion, sp.tail, inputs, b), "reduction",
                              force={"bdimx": threads, "bdimy": 1, "steps": 0, "cluster": None})
    q = tail.params
    if q.kind != "inner" or q.bdimx * q.bdimy != threads or q.splits != 1 or q.cluster != 1:
        raise SchedulerError(f"tail scheduler: the reduction of the rows takes a {q.kind} block "
                             f"of ({q.bdimx}, {q.bdimy}), not one of the head's {threads} threads")
    it = "int64_t" if "int64_t" in (head.params.index_type, q.index_type) else "int"
    head.params.index_type = q.index_type = it
    params = TailParams(name, head.params.as_dict(), q.as_dict(), it)
    ts = TailSchedule(fusion, sp, head, tail, params)
    D.dump("scheduler_params", NAME, lambda: describe(ts))
    return ts


def size_class(fusion, inputs) -> tuple:
    ts = schedule(fusion, inputs)
    return (ts.params.head_scheduler, ts.head.params.size_class(), ts.tail.params.size_class(),
            ts.params.index_type)


def describe(ts: TailSchedule) -> str:
    sp = ts.split
    return "\n".join([
        f"head ({ts.params.head_scheduler}): {', '.join(e.op_name for e in sp.head_exprs)}",
        f"  {ts.head.params.reason}; block ({ts.head.params.bdimx}, {ts.head.params.bdimy})",
        f"tail (the last block): {', '.join(e.op_name for e in sp.tail_exprs)}",
        f"  {ts.tail.params.reason}",
        f"crossing: {', '.join(v.name for v in sp.crossing)}; index={ts.params.index_type}"])
