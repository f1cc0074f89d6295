"""A kernel segment whose scheduler refuses its sizes at plan time runs as the other schedulers'
segments.

Segmentation is size-free (segmenter.py): a group one scheduler's compile check takes is one
kernel segment whatever the sizes. A scheduler that can still refuse at run time with no later
scheduler taking the same group — inner_outer_persistent, whose row must fit on chip — would
leave the segment to the reference evaluator. Instead the executor (runtime/executor.py) asks
`split_runner` for a runner of the segment's program: a copy of that Fusion whose segmentation
excludes the refusing scheduler (segmenter.EXCLUDE_ATTR), so the segmenter cuts it where the
other schedulers want (a layer norm's backward: dx in one kernel, dweight and dbias in a second)
and those run as usual (their own executors, cached calls included). The refusal is logged under
`segmenter_logging`.

A reduction segment that holds a lookup (gather, index_select / embedding) and that no
scheduler takes at plan time is split the same way, with a copy whose reduction groups may hold
no lookup (segmenter.LOOKUPS_APART_ATTR): the reduction schedulers' run checks refuse a lookup
whose index changes along the innermost axis in memory (`_gather_layout`), and inner_persistent
a kept innermost axis, so a layer norm of a transposed convolution output plus a position
embedding (CLIP's and Whisper's embeddings) had no scheduler and ran on the reference
evaluator; the copy runs the lookup as a pointwise kernel and the normalization as an
outer_persistent one.

A reduction segment that is a pure reduction only through its picks (schedule/reduction.py
`pure_by_picks`: torch.compile's cross-entropy) and that no scheduler takes at plan time (laid
out by columns, with $PYFUSER_OUTER_SPLIT=1) is split with a copy whose groups of that kind the
reduction scheduler may not take (segmenter.PICKS_APART): the copy is segmented as the
normalization it is without its picks, and the refusals of those schedulers split it further,
down to the reduction scheduler's pure pieces.

Invariant: the copy computes the same outputs from the same inputs (a deep clone, without the
original's cached reduction analyses, which name its nodes by id); a copy that excludes every
scheduler that refused, or keeps its lookups apart, is never split again for that (no loop).
"""
from __future__ import annotations

from .. import dump as D
from .segmenter import (EXCLUDE_ATTR, LOOKUPS_APART_ATTR, PICKS_APART, excluded, holds_lookup,
                        lookups_apart)


# Schedulers whose plan-time refusal splits the segment (the others' refusals fall back to the
# reference evaluator, as before: their groups have no cut that schedules better).
SPLIT_SCHEDULERS = ("inner_outer_persistent", "tail")
# with $PYFUSER_OUTER_SPLIT=1 also the normalizations' (schedule/reduction.py `_outer_grid`: an
# outer normalization on too few blocks; the segment's scheduler is the segmenter's first pick,
# inner_persistent, whose run check hands an NHWC batch norm on to outer_persistent)
OUTER_SPLIT_SCHEDULERS = ("inner_persistent", "outer_persistent")


def split_runner(fusion, mode: str, reason: str):
    """(inputs) -> (outputs, kernels launched, kernel segments run) running `fusion` as the
    segments of the schedulers other than the one that refused it (`reason`); None when that
    scheduler is not one of SPLIT_SCHEDULERS or was excluded already."""
    from ..schedule import registry
    from ..schedule.reduction import outer_split, pure_by_picks
    name = getattr(fusion, "kernel_scheduler", None)
    allowed = SPLIT_SCHEDULERS + (OUTER_SPLIT_SCHEDULERS if outer_split() else ())
    if name in allowed and name not in excluded(fusion):
        attr, value = EXCLUDE_ATTR, tuple(excluded(fusion)) + (name,)
        how = "the segment runs as the other schedulers' segments"
    elif name in registry.REDUCTION_NAMES and not lookups_apart(fusion) and \
            holds_lookup(fusion.used_exprs()):
        attr, value = LOOKUPS_APART_ATTR, True
        how = "the segment runs with its lookups in kernels of their own"
    elif name == "reduction" and PICKS_APART not in excluded(fusion) and pure_by_picks(fusion):
        attr, value = EXCLUDE_ATTR, tuple(excluded(fusion)) + (PICKS_APART,)
        how = "the segment runs as a normalization's (the reduction scheduler takes its pieces)"
    else:
        return None
    from ..schedule.pointwise import _clone
    copy, _ = _clone(fusion)
    for key in [k for k in copy.__dict__ if k.startswith("_pyfuser_reduction_graph")]:
        del copy.__dict__[key]     # analyses of the original's nodes (keyed by their ids)
    copy.__dict__[attr] = value
    copy.__dict__.pop("kernel_scheduler", None)
    D.dump("segmenter_logging", f"{name} scheduler",
           lambda: f"refused at run time: {reason}\n  {how}")
    from ..runtime import dispatch
    sub_mode = "interpret" if mode == "interpret" else None

    def run(inputs):
        outs = dispatch.execute_fusion(copy, inputs, sub_mode)
        report = dispatch.last_report(copy)
        if report is None:
            return outs, 0, 0
        return outs, report.launched, report.kernels
    run.fusion = copy
    return run
