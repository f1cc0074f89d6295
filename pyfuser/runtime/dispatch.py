"""Where a Fusion runs: the single entry point `execute_fusion(fusion, inputs) -> list[Tensor]`.

Every frontend (FusionDefinition.execute, the TorchScript graph runner) calls this, never the
evaluator or the kernel executor directly, so the choice between CUDA kernels and the reference
evaluator is made in one place:

- any CUDA tensor input -> the fusion's FusionExecutor (one per Fusion object, kept in a
  WeakKeyDictionary), unless the pointwise scheduler refuses the fusion (`can_schedule`), in
  which case the reference evaluator runs it (logged once per reason, `fallback` dump);
- CPU inputs -> the reference evaluator, or the codegen's CPU interpreter (through a
  FusionExecutor in "interpret" mode, which also NVRTC-compiles the kernel) when
  `mode="interpret"` or `PYFUSER_CPU_EXECUTOR=interpret`.

The segmenter (a later issue) slots in here, in place of the single-kernel executor.
"""
from __future__ import annotations

import os
import weakref

import torch

from ..ir.tensor import TensorView

# Executors live in an attribute of their Fusion (so they die with it: an executor refers to its
# fusion, which a WeakKeyDictionary value must not); _holders lets clear_caches find them.
_ATTR = "_pyfuser_executors"
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
        ex = _executor(fusion, "cuda")
        if ex is None:
            return _evaluate(fusion, inputs)
        return ex.run(_scalars_to_device(fusion, inputs))
    mode = mode or os.environ.get("PYFUSER_CPU_EXECUTOR", "evaluator") or "evaluator"
    if mode not in CPU_MODES:
        raise ValueError(f"CPU executor mode must be one of {CPU_MODES}, got {mode!r}")
    if mode == "interpret":
        ex = _executor(fusion, "interpret")
        if ex is not None:
            return ex.run(inputs)
    return _evaluate(fusion, inputs)


def get_executor(fusion, mode: str = "cuda"):
    """The cached FusionExecutor of `fusion` (None if its scheduler refuses it)."""
    return _executor(fusion, mode)


def _executor(fusion, mode: str):
    per_fusion = fusion.__dict__.get(_ATTR)
    if per_fusion is not None and mode in per_fusion:
        return per_fusion[mode]
    from ..codegen.api import can_schedule
    from .executor import FusionExecutor, note_fallback
    ok, reason = can_schedule(fusion)
    if ok:
        ex = FusionExecutor(fusion, mode=mode)
    else:
        note_fallback(reason)
        ex = None
    fusion.__dict__.setdefault(_ATTR, _Executors())[mode] = ex
    _holders.add(fusion)
    return ex


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
    for fusion in list(_holders):
        fusion.__dict__.pop(_ATTR, None)
    _holders.clear()
