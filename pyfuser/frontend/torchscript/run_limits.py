"""What `pyfuser run` checks before it makes inputs: the device exists, the size cap is sane,
and the declared inputs fit in memory (and, on the CPU, are not so large that the kernel
interpreter would take minutes and gigabytes).

`check_device(device)` and `check_run(graph, device, shrink=None, full_size=False)` raise a PyfuserError whose one-line
message says what is wrong and how to run it instead (`--shrink N`, `--device cpu`,
`--full-size`); check_run returns the estimate it used (`RunEstimate`). Estimates are of the run as
`pyfuser run` makes it: the inputs, eager's copies of them, the outputs of both runs (taken as
large as the largest input each) and the interpreter's working memory (as much again).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from ...errors import PyfuserError
from .types import TensorType

# Above this many elements in one input the CPU run is refused without --shrink / --full-size
# (seed 000's 130M-element graphs take ~30 s and ~9 GB through the interpreter; seed 003's
# 6.4M run in ~4 s).
CPU_LARGE_NUMEL = 1 << 24
DEFAULT_SHRINK = 128


@dataclass
class RunEstimate:
    input_bytes: int
    need_bytes: int
    largest: str              # `%name : type` of the largest input
    largest_numel: int


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _input_size(t: TensorType, cap: Optional[int]) -> int:
    """Elements of the storage a declared tensor input needs (strides honoured)."""
    sizes = [4 if s is None else s for s in (t.sizes if t.sizes is not None else [None])]
    if cap is not None:
        sizes = [min(s, cap) for s in sizes]
    if 0 in sizes:
        return 0
    st = t.strides
    if cap is None and st is not None and len(st) == len(sizes) and None not in st:
        return 1 + sum((s - 1) * abs(x) for s, x in zip(sizes, st))
    return math.prod(sizes)


def estimate(graph, shrink: Optional[int] = None) -> RunEstimate:
    total, largest, largest_bytes, largest_numel = 0, "", -1, 0
    for v in graph.inputs:
        t = v.type
        if not isinstance(t, TensorType):
            continue
        numel = _input_size(t, shrink)
        nbytes = numel * torch.empty((), dtype=t.dtype or torch.float32).element_size()
        total += nbytes
        if nbytes > largest_bytes:
            largest, largest_bytes, largest_numel = f"%{v.debug_name} : {t}", nbytes, numel
    n_out = max(len(graph.outputs), 1)
    need = 2 * total + 2 * n_out * max(largest_bytes, 0) + total
    return RunEstimate(total, need, largest, largest_numel)


def available_bytes(device: str) -> Optional[int]:
    """Free memory where the run happens (None when unknown)."""
    if device == "cuda":
        try:
            return int(torch.cuda.mem_get_info()[0])
        except Exception:          # noqa: BLE001 - unknown: no check
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise PyfuserError("--device cuda: no CUDA device is available here "
                           "(torch.cuda.is_available() is False); use --device cpu")


def check_run(graph, device: str, shrink: Optional[int] = None,
              full_size: bool = False) -> RunEstimate:
    check_device(device)
    if shrink is not None and shrink < 1:
        raise PyfuserError(f"--shrink {shrink}: the size cap must be a positive integer "
                           f"(e.g. --shrink {DEFAULT_SHRINK})")
    est = estimate(graph, shrink)
    how = f"pass --shrink N to cap every input size at N (e.g. --shrink {DEFAULT_SHRINK})"
    avail = available_bytes(device)
    if avail is not None and est.need_bytes > avail:
        raise PyfuserError(
            f"the declared inputs take {_gb(est.input_bytes)} (largest {est.largest}); running "
            f"and checking them needs about {_gb(est.need_bytes)}, more than the "
            f"{_gb(avail)} free on {device}; {how}")
    if device == "cpu" and shrink is None and not full_size and est.largest_numel > CPU_LARGE_NUMEL:
        raise PyfuserError(
            f"input {est.largest} has {est.largest_numel:,} elements: on the CPU the kernels run "
            f"through pyfuser's interpreter, which would take about {_gb(est.need_bytes)} and "
            f"tens of seconds; {how}, or --full-size to run it as declared")
    return est


__all__ = ["check_run", "check_device", "estimate", "available_bytes", "RunEstimate", "CPU_LARGE_NUMEL",
           "DEFAULT_SHRINK"]
