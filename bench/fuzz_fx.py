"""The long differential fuzzing run of the torch.compile backend: N random Python programs
(tests/cpu/fx_fuzz.py) through `torch.compile(fn, backend=pyfuser, dynamic=False)` on CPU
tensors, checked against eager.

    PYTHONPATH=. python3 bench/fuzz_fx.py --n 1000 --seed 0

Program i is `fx_fuzz.generate(seed + i)`, so a failure is reproduced by its seed alone
(`--seed S --n 1`). A progress line every `--every` programs; each failure is printed with its
program source and inputs, the failing seeds are listed at the end, and the exit status is 1
when any program failed. The summary also sums what the backend fused (nodes), how many region
calls fell back to eager and why nodes stayed unfused.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _load():
    sys.path.insert(0, HERE)
    from common import load_test_module
    return load_test_module("fx_fuzz")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="number of programs")
    ap.add_argument("--seed", type=int, default=0, help="first program's seed")
    ap.add_argument("--every", type=int, default=50, help="progress line every N programs")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("pyfuser").setLevel(logging.WARNING)
    FZ = _load()
    failed, fused, eager_calls, unfused = [], 0, 0, {}
    t0 = time.time()
    for i, s in enumerate(range(args.seed, args.seed + args.n), 1):
        p = FZ.generate(s)
        try:
            f = FZ.check(p)
        except Exception as e:  # noqa: BLE001  (the checker itself broke: report, go on)
            f = FZ.Failure(p, f"checker raised {type(e).__name__}: {e}")
        fused += p.stats.get("fused_nodes", 0)
        eager_calls += p.stats.get("eager_calls", 0)
        for reason, k in p.stats.get("unfused", {}).items():
            unfused[reason] = unfused.get(reason, 0) + k
        if f is not None:
            failed.append(s)
            print(f"FAIL {f}\n", flush=True)
        if i % args.every == 0 or i == args.n:
            print(f"[{i}/{args.n}] seeds {args.seed}..{s}: {len(failed)} failing, "
                  f"{time.time() - t0:.0f} s", flush=True)
    print(f"fused nodes {fused}, region calls run eagerly {eager_calls}")
    for reason, k in sorted(unfused.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  unfused x{k}: {reason}")
    print(f"failing seeds: {failed}" if failed else "no failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
