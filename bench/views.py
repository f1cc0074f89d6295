"""Seed 002 on the GPU: bookend views should cost nothing.

Rows: GELU with bookend views, GELU without views, the transpose with bookend views; each timed
for pyfuser, eager and torch.compile (median, bench/common.bench_us: do_bench with L2 flush),
with achieved bandwidth as % of device copy bandwidth; also pyfuser's kernel time alone (profiler,
L2 flushed) and its host time per cached call (CPU time, GPU not awaited). Prints a markdown table; writes it to
$OUT/bench_views.md when OUT is set. Targets: GELU views vs no views within 3%, GELU >= 92% of
copy bandwidth, transpose >= 80%.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import bench_us, copy_rate, host_us_per_call, markdown, same_size_copy_us  # noqa: E402

_spec = importlib.util.spec_from_file_location("segment_cases", os.path.join(
    os.path.dirname(__file__), "..", "tests", "cpu", "segment_cases.py"))
C = importlib.util.module_from_spec(_spec)
sys.modules["segment_cases"] = C          # torch.compile imports the module its functions live in
_spec.loader.exec_module(C)


def _compiled(fn):
    try:
        return torch.compile(fn)
    except Exception:  # noqa: BLE001 - torch.compile may be unavailable
        return None


def _kernel_us(fn, n: int = 10) -> float:
    """GPU time of pyfuser's kernels (pf_*) per call, from torch.profiler, with L2 flushed before
    each call as bench_us does (a warm-L2 figure would flatter kernels whose data fits in L2)."""
    try:
        import torch.profiler as P
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        fn()
        torch.cuda.synchronize()
        with P.profile(activities=[P.ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        return sum(e.device_time_total for e in prof.key_averages() if e.key.startswith("pf_")) / n
    except Exception:  # noqa: BLE001 - profiler optional
        return float("nan")


def main() -> None:
    torch.manual_seed(0)
    rate = copy_rate()
    x = torch.randn(8192, 3072, device="cuda")
    x3 = x.view(64, 128, 3072).clone()
    xt = torch.randn(768, 128, 64, device="cuda")
    cases = [
        ("gelu + bookend views", C.gelu(C.FULL_GELU), [x], lambda: C.gelu_eager(x, C.FULL_GELU),
         2 * x.nbytes),
        ("gelu, no views", C.gelu(C.FULL_GELU, views=False), [x3],
         lambda: C.gelu_eager(x3, views=False), 2 * x.nbytes),
        ("transpose + bookend views", C.transpose(C.FULL_TR), [xt],
         lambda: C.transpose_eager(xt, C.FULL_TR), 2 * xt.nbytes),
    ]
    rows, results = [], {}
    for name, fs, ins, eager, nbytes in cases:
        out = fs.execute(ins)[-1]
        torch.testing.assert_close(out, eager())
        us = bench_us(lambda: fs.execute(ins))
        eager_us = bench_us(eager)
        comp = _compiled(eager)
        comp_us = bench_us(comp) if comp is not None else float("nan")
        pct = 100 * nbytes / (us * 1e-6) / rate
        results[name] = (us, pct)
        gpu_us = _kernel_us(lambda: fs.execute(ins))
        host_us = host_us_per_call(lambda: fs.execute(ins), n=500, rounds=3)
        copy_us = same_size_copy_us(nbytes)
        rows.append([name, f"{us:.1f}", f"{gpu_us:.1f}", f"{host_us:.1f}", f"{eager_us:.1f}",
                     f"{comp_us:.1f}", f"{copy_us:.1f}", f"{pct:.1f}%", str(fs.last_run.kernels),
                     str(fs.last_run.host_segments)])
    ratio = results["gelu + bookend views"][0] / results["gelu, no views"][0]
    table = markdown(rows, ["case", "pyfuser us", "its kernels us (profiler, L2 flushed)",
                            "host us / call", "eager us", "torch.compile us",
                            "same-size copy us", "% of copy BW",
                            "kernels", "host segments"])
    text = (f"{table}\n\ncopy bandwidth: {rate / 1e9:.0f} GB/s; gelu views / no views = {ratio:.3f} "
            f"(target <= 1.03); gelu >= 92%, transpose >= 80% of copy bandwidth\n")
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_views.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
