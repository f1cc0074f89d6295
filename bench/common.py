"""Timing helpers for the benchmarks (GPU only).

- `bench_us(fn)`: median time of one call in microseconds: triton.testing.do_bench when Triton is
  installed (it flushes L2 before each call), else CUDA events around each call after an L2 flush.
- `copy_rate()`: device-to-device copy bandwidth in bytes/s (read + write bytes), measured once.
- `count_kernels(fn)`: CUDA kernels one call launches, from torch.profiler (memcpy/memset excluded).
- `host_us_per_call(fn)`: host (CPU) time of one cached call, median of rounds of 2000 calls.
- `markdown(rows, headers)`: a markdown table.
"""
from __future__ import annotations

import functools
import statistics
import time

import torch


def bench_us(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    fn()
    torch.cuda.synchronize()
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3
    except ImportError:
        return _events_us(fn, rep_ms)


def _events_us(fn, rep_ms: float) -> float:
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    n = max(5, min(1000, int(rep_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(n):
        flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1e3


def same_size_copy_us(nbytes: int) -> float:
    """Time of one float32 dst.copy_(src) moving `nbytes` (read + write). Small transfers do not
    reach the large-copy rate (launch, ramp-up, tail), so at a case's size this is the practical
    floor."""
    src = torch.randn(max(nbytes // 8, 1), device="cuda")
    dst = torch.empty_like(src)
    return bench_us(lambda: dst.copy_(src))


@functools.lru_cache(maxsize=None)
def copy_rate() -> float:
    """Bytes moved per second by a large (1 GiB source) copy, counting reads and writes."""
    nbytes = 2 << 30
    return nbytes / (same_size_copy_us(nbytes) * 1e-6)


def count_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    n = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.lower()
            if not (name.startswith("memcpy") or name.startswith("memset")):
                n += 1
    return n


def host_us_per_call(fn, n: int = 2000, rounds: int = 5) -> float:
    """CPU time of one call (µs): the median over `rounds` of n back-to-back calls, each round
    started on an idle GPU (synchronized) and timed without waiting for the GPU."""
    for _ in range(100):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) / n * 1e6


def markdown(rows, headers) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
