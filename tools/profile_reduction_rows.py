"""Run chosen rows of bench/normalization.py through pyfuser a fixed number of times, each call
inside an NVTX range named after the row, so that Nsight Compute can profile their kernels:

    PYTHONPATH=. ncu --clock-control none --nvtx --section SpeedOfLight ... \\
        python3 tools/profile_reduction_rows.py --only "sum(-1),softmax 8192" --calls 2

(the first call compiles; every call launches the kernels). Without a GPU, --dry-run lists the
rows it would run. Prints, per row and dtype, the torch profiler's kernel names and µs of the
last call (--no-timing: not; --host N: and its N costliest host ops), so that a plain run (no
ncu) is a quick per-kernel timing too; --times adds host / back-to-back / do_bench times beside
eager's, --cprofile N the Python functions of most own time over 200 calls.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def selected(only: str):
    from normalization import WORKLOADS
    names = [o.strip() for o in only.split(",") if o.strip()]
    return [(n, fn, make) for n, fn, make in WORKLOADS if not names or any(n.startswith(o) for o in names)]


def row_parser(only: str = "") -> argparse.ArgumentParser:
    """The options every row tool takes: --only (row name prefixes), --dtypes, --dry-run."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=only)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--dry-run", action="store_true")
    return ap


def parse_rows(ap: argparse.ArgumentParser):
    """(arguments, the selected rows); None for the rows after --dry-run listed them."""
    a = ap.parse_args()
    rows = selected(a.only)
    if a.dry_run:
        for name, _, _ in rows:
            print(name)
        return a, None
    return a, rows


def main():
    ap = row_parser()
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--no-timing", dest="timing", action="store_false",
                    help="skip the torch profiler (under ncu: both use CUPTI)")
    ap.add_argument("--times", action="store_true",
                    help="also time each call four ways: host µs, back to back (steady), do_bench "
                         "with the write flush (the benchmark's method), and eager's do_bench")
    ap.add_argument("--cprofile", type=int, default=0,
                    help="also print the N functions of most own time over 200 calls (cProfile)")
    ap.add_argument("--host", type=int, default=0,
                    help="also print the N host ops of most self CPU time in the profiled call")
    a, rows = parse_rows(ap)
    if rows is None:
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    import pyfuser
    from pyfuser.runtime import native
    # the native cached-call runner, as bench/normalization.py builds it: a fresh GPU machine
    # has none, and host times would be Python's call path
    print("native cached-call runner", "on" if native.build() is not None else "OFF", flush=True)
    for name, fn, make in rows:
        for dt in a.dtypes.split(","):
            dtype = getattr(torch, dt)
            torch.manual_seed(0)
            xs = make(dtype)
            pf = pyfuser.jit(torch.jit.script(fn))
            for _ in range(a.calls):
                torch.cuda.nvtx.range_push(f"{name} {dt}")
                pf(*xs)
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            if a.times:
                from common import bench_us, host_us_per_call, steady_us
                print(f"{name} {dt}: host {host_us_per_call(lambda: pf(*xs)):.1f} us, steady "
                      f"{steady_us([lambda: pf(*xs)]):.1f} us, do_bench {bench_us(lambda: pf(*xs)):.1f} us, "
                      f"eager do_bench {bench_us(lambda: fn(*xs)):.1f} us", flush=True)
            if a.cprofile:
                import cProfile
                import pstats
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(200):
                    pf(*xs)
                prof.disable()
                torch.cuda.synchronize()
                pstats.Stats(prof).sort_stats("tottime").print_stats(a.cprofile)
            if not a.timing:
                continue
            acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if a.host else [])
            with profile(activities=acts) as prof:
                pf(*xs)
                torch.cuda.synchronize()
            kernels = [(e.name, e.device_time) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA]
            print(f"{name} {dt}: " + ", ".join(f"{k[:40]} {us:.1f} us" for k, us in kernels), flush=True)
            if a.host:
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.host), flush=True)


if __name__ == "__main__":
    main()
