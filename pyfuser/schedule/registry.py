"""The scheduler registry: every kernel scheduler, in one priority order, behind one protocol.

Each `Scheduler` answers
- `compile_check(fusion) -> (ok, reason)`: can this fusion's ops and structure be scheduled at
  all? A function of the Fusion alone (the segmenter's verdicts are cached per Fusion);
- `run_check(fusion, inputs, bindings) -> (ok, reason)`: do these inputs (sizes, layouts) fit,
  e.g. a persistent row in registers? Asked when a kernel is planned for a new signature;
- `plan(fusion, inputs)`: the schedule, whose `params.as_dict()` is printable
  (`PYFUSER_DUMP=scheduler_params`).

The segmenter offers groups of exprs to `accepting` (first scheduler of SCHEDULERS whose compile
check passes; every verdict is logged under `segmenter_logging`); the codegen plans a kernel
segment with `select`, the first scheduler, from the one the segmenter named on, whose compile
and run checks both pass for the inputs (so a normalization whose rows do not fit on chip goes to
the next scheduler in line, at plan time, never in the size-free segmentation).

Invariant: `schedule/` never imports `codegen/`; the codegen maps a scheduler's name to its
lowering (codegen/api.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import dump as D
from ..errors import SchedulerError


def _always(fusion, inputs, bindings):
    return True, ""


@dataclass(frozen=True)
class Scheduler:
    name: str
    compile_check: Callable
    plan: Callable
    run_check: Callable = _always
    # (fusion, inputs) -> what of the plan follows from sizes (part of the kernel signature)
    size_class: Callable = None


def _transpose():
    from . import transpose
    return Scheduler("transpose", transpose.can_schedule, transpose.schedule)


def _pointwise():
    from . import pointwise
    return Scheduler("pointwise", pointwise.can_schedule, pointwise.schedule)


def _horizontal():
    from . import horizontal
    return Scheduler("horizontal", horizontal.can_schedule, horizontal.schedule,
                     horizontal.run_check, horizontal.size_class)


def _embedding_backward():
    from . import embedding_backward as EB
    return Scheduler(EB.NAME, EB.can_schedule, EB.schedule, EB.run_check, EB.size_class)


def _tail():
    from . import tail
    return Scheduler(tail.NAME, tail.can_schedule, tail.schedule, tail.run_check, tail.size_class)


def _build() -> tuple:
    """(every scheduler in priority order, the names of those that schedule reductions)."""
    from . import inner_outer, reduction
    reductions = [*reduction.schedulers(), inner_outer.scheduler()]
    return ([_transpose(), *reductions, _pointwise(), _horizontal(), _embedding_backward(),
             _tail()],
            tuple(s.name for s in reductions))


SCHEDULERS, REDUCTION_NAMES = _build()


def names() -> list[str]:
    return [s.name for s in SCHEDULERS]


def get(name: str) -> Scheduler:
    for s in SCHEDULERS:
        if s.name == name:
            return s
    raise KeyError(f"no scheduler named {name!r}; known: {names()}")


def verdicts(fusion, stop_at_first: bool = True, exclude=()) -> list[tuple[str, bool, str]]:
    """(name, accepted, reason) of each scheduler's compile check, in priority order (up to the
    first that accepts, unless `stop_at_first` is False); schedulers named in `exclude` refuse."""
    out = []
    for s in SCHEDULERS:
        ok, why = (False, "excluded (it refused these sizes at run time)") if s.name in exclude \
            else s.compile_check(fusion)
        out.append((s.name, ok, why))
        if ok and stop_at_first:
            break
    return out


def accepting(fusion, what: str = "", exclude=()) -> tuple[str | None, str]:
    """(name of the first scheduler whose compile check takes `fusion`, "") or (None, every
    refusal's reason joined). Each verdict goes to the `segmenter_logging` dump. Schedulers named
    in `exclude` refuse (segment/split.py: a segment whose scheduler refused its sizes)."""
    reasons = []
    for name, ok, why in verdicts(fusion, exclude=exclude):
        verdict = "accepted" if ok else f"refused: {why}"
        D.dump("segmenter_logging", f"{name} scheduler", lambda: f"{verdict}\n  group: {what}")
        if ok:
            return name, ""
        reasons.append(f"{name}: {why}")
    return None, "; ".join(reasons)


def select(fusion, inputs, bindings, first: str | None = None) -> Scheduler:
    """The scheduler that plans `fusion` for these inputs: the first, from `first` (the
    segmenter's choice) on, whose compile and run checks pass. SchedulerError if none does."""
    start = 0 if first is None else names().index(first)
    reasons = []
    for s in SCHEDULERS[start:]:
        ok, why = s.compile_check(fusion)
        if ok:
            ok, why = s.run_check(fusion, inputs, bindings)
        if ok:
            return s
        reasons.append(f"{s.name}: {why}")
    raise SchedulerError("no scheduler takes this fusion for these inputs: " + "; ".join(reasons))
