"""Time chosen rows of bench/normalization.py three ways (L2 flushed by a write, L2 flushed by
a read, steady back-to-back calls) for eager, torch.compile and pyfuser side by side, with each
variant's kernels and their profiler µs, to tell a kernel's own speed from what surrounds it:

    PYTHONPATH=. python3 tools/compare_reduction_variants.py --only "sum(-1),sum(0)" \\
        [--dtypes float32]

With TORCH_LOGS=output_code the Triton source torch.compile generates goes to stderr (read its
launch configuration beside pyfuser's `PYFUSER_DUMP=scheduler_params`). Without a GPU, --dry-run
lists the rows.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _kernels(fn, xs) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*xs)
        torch.cuda.synchronize()
    ks = [(e.name, e.device_time) for e in prof.events()
          if e.device_type == torch.autograd.DeviceType.CUDA]
    return ", ".join(f"{k[:48]} {us:.1f}" for k, us in ks)


def main():
    from profile_reduction_rows import parse_rows, row_parser
    a, rows = parse_rows(row_parser("sum(-1),sum(0)"))
    if rows is None:
        return
    import torch

    import pyfuser
    from common import compile_static, input_sets, time_methods
    for name, fn, make in rows:
        for dt in a.dtypes.split(","):
            torch.manual_seed(0)
            xs = make(getattr(torch, dt))
            nbytes = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
            sets = input_sets(lambda: make(getattr(torch, dt)), nbytes)
            variants = {"eager": fn, "compile": compile_static(fn),
                        "pyfuser": pyfuser.jit(torch.jit.script(fn))}
            for vname, v in variants.items():
                v(*xs)
                torch.cuda.synchronize()
                t = time_methods(v, xs, sets)
                print(f"{name} {dt} {vname:8s}: write {t['write']:.1f} read {t['read']:.1f} "
                      f"steady {t['steady']:.1f} us | {_kernels(v, xs)}", flush=True)


if __name__ == "__main__":
    main()
