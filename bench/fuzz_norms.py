"""The long normalization fuzzing run: N random softmax-like and normalization cases
(tests/cpu/norm_fuzz.py) through pyfuser.jit, checked against eager.

    PYTHONPATH=. python3 bench/fuzz_norms.py --n 2000                  # CPU interpreter
    PYTHONPATH=. python3 bench/fuzz_norms.py --n 2000 --device cuda    # the CUDA kernels

Case i is `norm_fuzz.case(seed + i)` (`whole_case` with --whole: rows every thread holds
alike): a failure is reproduced by its seed alone (`--seed S --n 1`). Each failure is
printed with its case; the exit status is 1 when any case failed. A CI run checks a few
cases (tests/cpu/test_norm_fuzz.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="first case's seed")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--every", type=int, default=100, help="progress line every N cases")
    ap.add_argument("--whole", action="store_true",
                    help="whole rows (norm_fuzz.whole_case: equal-count Welford merges, the "
                         "warps' tree, rows without bounds checks)")
    a = ap.parse_args(argv)
    from common import load_test_module
    NF = load_test_module("norm_fuzz")
    t0, failed = time.time(), []
    for k, seed in enumerate(range(a.seed, a.seed + a.n), 1):
        why = NF.check(seed, a.device, a.whole)
        if why:
            failed.append(seed)
            print("FAIL", why, flush=True)
        if k % a.every == 0 or k == a.n:
            print(f"{k}/{a.n} cases, {len(failed)} failing, {time.time() - t0:.0f} s", flush=True)
    print(f"fuzz_norms: {a.n} cases on {a.device} from seed {a.seed}: {len(failed)} failing {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
