"""Where a Fusion runs: the single entry point `execute_fusion(fusion, inputs) -> list[Tensor]`.

Every frontend (FusionDefinition.execute, the TorchScript graph runner) calls this, never the
evaluator or the kernel executor directly. The Fusion is segmented once (segment/segmenter.py:
host segments of views at the edges, kernel segments, eager segments) and the segments run in
order (segment/runtime.py). Kernel segments run
- on CUDA tensors: through their FusionExecutor (one per segment program, cached on it);
- on CPU tensors: on the reference evaluator, or the codegen's CPU interpreter (a FusionExecutor
  in "interpret" mode, which also NVRTC-compiles the kernel) when `mode="interpret"` or
  `PYFUSER_CPU_EXECUTOR=interpret`.
A Fusion that is exactly one kernel goes straight to its executor (no segment bookkeeping).

`last_report(fusion)` is the RunReport of the fusion's last execute (segments in order with kind
and scheduler, kernels run, host segments); `fs.last_run` and `pyfuser run --json` read it.
`run_summary(fusion)` gives its {"kernels", "host_segments", ...} dict.
"""
from __future__ import annotations

import os
import weakref

import torch

from ..ir.tensor import TensorView
from ..segment.segmented_fusion import RunReport, SegmentRun

# Executors live in an attribute of their Fusion (so they die with it: an executor refers to its
# fusion, which a WeakKeyDictionary value must not); _holders lets clear_caches find them.
_ATTR = "_pyfuser_executors"
_REPORT = "_pyfuser_last_run"
_holders: "weakref.WeakSet" = weakref.WeakSet()


class _Executors(dict):
    """mode -> executor. Copies and pickles of the Fusion (the codegen deep-copies it) get an
    empty one: executors are caches of this very object, never state to carry along."""

    def __deepcopy__(self, memo):
        return _Executors()

    def __copy__(self):
        return _Executors()

    def __reduce__(self):
        return (_Executors, ())
CPU_MODES = ("evaluator", "interpret")


def execute_fusion(fusion, inputs, mode: str | None = None) -> list:
    inputs = list(inputs)
    on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    if on_cuda:
        backend, inputs = "cuda", _scalars_to_device(fusion, inputs)
    else:
        backend = mode or os.environ.get("PYFUSER_CPU_EXECUTOR", "evaluator") or "evaluator"
        if backend not in CPU_MODES:
            raise ValueError(f"CPU executor mode must be one of {CPU_MODES}, got {mode!r}")
    from ..segment.segmenter import segment
    sf = segment(fusion)
    segs = sf.segments
    if len(segs) == 1 and segs[0].fusion is fusion and segs[0].kind == "kernel":
        return _run_whole(fusion, segs[0], inputs, backend)
    from ..segment.runtime import run_segments
    outs, report = run_segments(sf, inputs, backend, _segment_executor)
    fusion.__dict__[_REPORT] = report
    return outs


def _run_whole(fusion, seg, inputs, backend: str) -> list:
    ex = None
    if backend != "evaluator":
        ex = _executor(fusion, backend) if seg.scheduler == "pointwise" else \
            _segment_executor(fusion, backend)
    if ex is None:
        outs, used, launched = _evaluate(fusion, inputs), "evaluator", 0
    else:
        outs = ex.run(inputs)
        launched = int(ex.last_run.get("kernels", 0))
        used = "evaluator" if ex.last_run.get("fallback") else backend
    report = RunReport([SegmentRun("kernel", seg.scheduler, [e.op_name for e in seg.exprs], used)],
                       kernels=1, launched=launched)
    fusion.__dict__[_REPORT] = report
    return outs


def last_report(fusion) -> RunReport | None:
    """The RunReport of the last execute of `fusion` (None before the first)."""
    return fusion.__dict__.get(_REPORT)


def run_summary(fusion) -> dict:
    """{"kernels", "launched", "host_segments", "eager_segments", "segments"} of the last run."""
    r = last_report(fusion)
    return r.as_dict() if r is not None else {"kernels": 0, "launched": 0, "host_segments": 0,
                                              "eager_segments": 0, "segments": []}


def get_executor(fusion, mode: str = "cuda"):
    """The cached FusionExecutor of `fusion` (None if its scheduler refuses it)."""
    return _executor(fusion, mode)


def _executor(fusion, mode: str, checked: bool = False):
    per_fusion = fusion.__dict__.get(_ATTR)
    if per_fusion is not None and mode in per_fusion:
        return per_fusion[mode]
    from ..codegen.api import can_schedule
    from .executor import FusionExecutor, note_fallback
    ok, reason = (True, "") if checked else can_schedule(fusion)
    if ok:
        ex = FusionExecutor(fusion, mode=mode)
    else:
        note_fallback(reason)
        ex = None
    fusion.__dict__.setdefault(_ATTR, _Executors())[mode] = ex
    _holders.add(fusion)
    return ex


def _segment_executor(fusion, mode: str):
    """Executor of a kernel segment's program (the segmenter already had it accepted)."""
    from ..segment.kernel_exec import PLANNERS, PlannerExecutor
    scheduler = getattr(fusion, "kernel_scheduler", None)
    if scheduler not in PLANNERS:
        return _executor(fusion, mode, checked=True)
    per_fusion = fusion.__dict__.setdefault(_ATTR, _Executors())
    if mode not in per_fusion:
        per_fusion[mode] = PlannerExecutor(fusion, mode, scheduler)
        _holders.add(fusion)
    return per_fusion[mode]


def _scalars_to_device(fusion, inputs) -> list:
    """0-dim CPU tensor inputs next to CUDA tensors (eager allows it) move to the CUDA device."""
    device = None
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and not x.is_cuda and x.dim() == 0 and i < len(fusion.inputs) \
                and isinstance(fusion.inputs[i], TensorView):
            if device is None:
                device = next(t.device for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda)
                inputs = list(inputs)
            inputs[i] = x.to(device)
    return inputs


def _evaluate(fusion, inputs) -> list:
    from ..ir.evaluator import evaluate
    return evaluate(fusion, inputs)


def clear_caches() -> None:
    """Forget every executor (in-memory kernel caches); the disk cache stays."""
    from ..segment.segmenter import forget_all
    forget_all()
    for fusion in list(_holders):
        fusion.__dict__.pop(_ATTR, None)
    _holders.clear()
