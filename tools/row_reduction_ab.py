"""Pure row reductions under knob settings, one process per setting (GPU): an A/B of kernels
whose plans a `PYFUSER_RED_*` knob changes (the knobs are read when a kernel is planned, so
each setting needs its own process).

    PYTHONPATH=. python3 tools/row_reduction_ab.py --settings "default,PYFUSER_RED_HOLD=0,default"
    PYTHONPATH=. python3 tools/row_reduction_ab.py --shapes 65536x128,8192x3072 --dtypes bfloat16

Ops (over the last axis, through `pyfuser.jit`): `sum`, `var_mean`, `amax`, `(x*x).sum`.
Each case is checked against eager with bench/normalization.py's tolerances (a wrong result is
marked WRONG), then timed with bench/common.bench_us (do_bench, L2 flushed by a write); % =
(input + output bytes / time) over (2 x input bytes / the time of a copy of the input). Prints
one markdown table, a column per setting in the order given (repeat a setting to interleave
rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = ("8192x3072,32768x256,4096x1024,16384x768,2048x8192,65536x128,1024x16384,131072x64,"
          "262144x32")


def sum_last(x):
    return x.sum(-1)


def var_mean_last(x):
    return torch.var_mean(x, -1)


def amax_last(x):
    return x.amax(-1)


def sumsq_last(x):
    return (x * x).sum(-1)


OPS = {"sum(-1)": sum_last, "var_mean(-1)": var_mean_last, "amax(-1)": amax_last,
       "(x*x).sum(-1)": sumsq_last}


def child(shapes: list, dtypes: list) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from common import bench_us, same_size_copy_us
    from normalization import _outputs_match
    import pyfuser
    res = {}
    for dt in dtypes:
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dt))
            nb = x.numel() * x.element_size()
            copy = same_size_copy_us(2 * nb)
            for name, fn in OPS.items():
                f = pyfuser.jit(torch.jit.script(fn))
                want = fn(x)
                ok = _outputs_match(f(x), want, x.dtype)
                us = bench_us(lambda: f(x))
                out = sum(t.numel() * t.element_size()
                          for t in (want if isinstance(want, tuple) else (want,)))
                res[f"{name} {m}x{n} {dt}"] = (us, 100 * ((nb + out) / us) / (2 * nb / copy), ok)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", default="default,PYFUSER_RED_HOLD=0,default",
                   help="comma-separated: 'default' or space-separated VAR=value assignments")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    dtypes = a.dtypes.split(",")
    if a.child:
        print("RESULT " + json.dumps(child(shapes, dtypes)))
        return 0
    cols = []
    for setting in a.settings.split(","):
        env = dict(os.environ, PYTHONPATH=ROOT)
        for kv in ([] if setting == "default" else setting.split()):
            k, _, v = kv.partition("=")
            env[k] = v
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "1", "--shapes", a.shapes,
               "--dtypes", a.dtypes]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{setting}: child failed\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        cols.append((setting, json.loads(line[-1][7:])))
    print("| case | " + " | ".join(s for s, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for key in cols[0][1]:
        cells = []
        for _, r in cols:
            us, pct, ok = r[key]
            cells.append(f"{us:.1f} ({pct:.0f}%)" + ("" if ok else " WRONG"))
        print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
