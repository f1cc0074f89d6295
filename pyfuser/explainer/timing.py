"""`pyfuser explain --bench`: a kernel's GPU time against a copy of the same bytes (CUDA only).

    kernel_bench(call, nbytes) -> {"us", "copy_us", "pct_of_copy", "method"}

Both are timed the same way: back-to-back calls with the same inputs, queued behind a sleep
kernel so that the host's time to issue them stays hidden, CUDA events around the batch; the
median of a few rounds, per call. The copy is torch's `dst.copy_(src)` of float32 tensors moving
`nbytes` (read + write), so `pct_of_copy` = copy time / kernel time: 100% means the kernel moves
its bytes as fast as the simplest kernel can. Small tensors stay in L2 between calls, for the
kernel and for the copy alike. (bench/common.py has the benchmarks' three methods.)
"""
from __future__ import annotations

import statistics

import torch

METHOD = "back to back, same inputs, behind a sleep kernel; median of 5 rounds"


def gpu_us(fn, calls: int = 32, rounds: int = 5) -> float:
    """GPU time per call of `fn` in µs (see the module docstring)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(20_000_000)      # ~10 ms: longer than issuing `calls` calls
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times) * 1e3


def copy_us(nbytes: int) -> float:
    src = torch.randn(max(nbytes // 8, 1), device="cuda")
    dst = torch.empty_like(src)
    return gpu_us(lambda: dst.copy_(src))


def kernel_bench(call, nbytes: int) -> dict:
    us = gpu_us(call)
    cu = copy_us(nbytes)
    return {"us": round(us, 2), "copy_us": round(cu, 2),
            "pct_of_copy": round(100.0 * cu / us, 1) if us > 0 else None, "method": METHOD}
