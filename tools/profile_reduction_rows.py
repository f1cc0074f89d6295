"""Run chosen rows of bench/normalization.py through pyfuser a fixed number of times, each call
inside an NVTX range named after the row, so that Nsight Compute can profile their kernels:

    PYTHONPATH=. ncu --clock-control none --nvtx --section SpeedOfLight ... \\
        python3 tools/profile_reduction_rows.py --only "sum(-1),softmax 8192" --calls 2

(the first call compiles; every call launches the kernels). Without a GPU, --dry-run lists the
rows it would run. Prints, per row and dtype, the torch profiler's kernel names and µs of the
last call (--no-timing: not), so that a plain run (no ncu) is a quick per-kernel timing too.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-timing", dest="timing", action="store_false",
                    help="skip the torch profiler (under ncu: both use CUPTI)")
    a = ap.parse_args()
    rows = selected(a.only)
    if a.dry_run:
        for name, _, _ in rows:
            print(name)
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    import pyfuser
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
            if not a.timing:
                continue
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                pf(*xs)
                torch.cuda.synchronize()
            kernels = [(e.name, e.device_time) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA]
            print(f"{name} {dt}: " + ", ".join(f"{k[:40]} {us:.1f} us" for k, us in kernels), flush=True)


if __name__ == "__main__":
    main()
