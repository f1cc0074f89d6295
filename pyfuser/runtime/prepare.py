"""Planning a Fusion's kernels before its first run, so that their NVRTC compiles overlap.

`prepare_fusion(fusion, inputs, mode, arch)` does what the first `execute_fusion(fusion, inputs)`
would do up to the compiles: it segments the Fusion and walks its segments as run_segments does,
but on stand-ins of the inputs (meta tensors with the real inputs' dtypes, sizes, strides and
storage offsets, so `signature` sees the same layout facts, data-pointer alignment included), and
for every kernel segment asks its executor (the one the run will use) to `prepare`: plan the
kernel and start its compile in the background (nvrtc.compile_async). Host segments run as
views of the stand-ins; a kernel's outputs are what its plan would allocate. A frontend that
knows its fusions' inputs ahead of the run (the torch.compile backend, from FX's example values)
calls it for each fusion in turn: the planning of one overlaps the compiles of the ones before.

Invariants:
- Nothing here decides anything a run would not: the entries are keyed by the executor's own
  `signature` of the stand-ins; a run whose inputs have other facts plans and compiles its own
  kernel then, as without preparation.
- Best effort: it stops at the first segment it cannot walk (an eager segment, a fallback, an
  input the fusion refuses, anything raising) and returns; what was not prepared is planned by
  the run. It never raises.
- Evaluator mode (`PYFUSER_CPU_EXECUTOR=evaluator`) has no kernels: nothing is prepared.
"""
from __future__ import annotations

import logging

import torch

from ..ir.shapes import bind
from ..ir.tensor import TensorView

log = logging.getLogger("pyfuser")


def stand_in(x):
    """A meta tensor with x's dtype, sizes, strides and storage offset (its data pointer is the
    offset in bytes, as a real tensor's is modulo the allocator's alignment); x if no tensor."""
    if not isinstance(x, torch.Tensor):
        return x
    return meta_tensor(x.dtype, tuple(x.shape), tuple(x.stride()), x.storage_offset())


def meta_tensor(dtype, sizes, strides, offset: int = 0) -> torch.Tensor:
    sizes, strides = tuple(int(n) for n in sizes), tuple(int(st) for st in strides)
    span = 1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0
    base = torch.empty(int(offset) + span, dtype=dtype, device="meta")
    return base.as_strided(sizes, strides, int(offset))


def prepare_fusion(fusion, inputs, mode: str, arch: str | None = None) -> int:
    """Prepare the kernels of `fusion` for `inputs` (stand-ins, see `stand_in`); returns how
    many kernel segments were prepared. `mode`: the executor mode the run will use ("cuda",
    "interpret")."""
    if mode not in ("cuda", "interpret"):
        return 0
    try:
        return _prepare(fusion, list(inputs), mode, arch)
    except Exception as e:  # noqa: BLE001 - the run plans what was not prepared
        log.debug("pyfuser: kernels not prepared ahead of the first run: %s: %s",
                  type(e).__name__, e)
        return 0


def _prepare(fusion, inputs, mode, arch) -> int:
    from ..segment.host import run_host
    from ..segment.segmenter import segment
    from .dispatch import _segment_executor
    sf = segment(fusion)
    segs = sf.segments
    if len(segs) == 1 and segs[0].fusion is fusion and segs[0].kind == "kernel":
        ex = _segment_executor(fusion, mode)
        return int(ex is not None and ex.prepare(inputs, arch) is not None)
    b = bind(fusion, inputs)
    env = {id(v): x for v, x in zip(fusion.inputs, inputs)}
    done = 0
    for seg in segs:
        if seg.kind == "host":
            for e in seg.exprs:
                env[id(e.output)] = run_host(e, env[id(e.inputs[0])], b)
            continue
        if seg.kind != "kernel":
            return done                  # an eager segment: the run takes it from here
        args = [env[id(v)] if isinstance(v, TensorView) else
                (env[id(v)] if id(v) in env else b.value(v)) for v in seg.sub_inputs]
        ex = _segment_executor(seg.fusion, mode)
        outs = ex.prepare(args, arch) if ex is not None else None
        if outs is None:
            return done
        done += 1
        for o, x in zip(seg.outputs, outs):
            env[id(o)] = x
    return done
