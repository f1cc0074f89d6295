"""The long differential fuzzing run of the torch.compile backend: N random Python programs
(tests/cpu/fx_fuzz.py) through `torch.compile(fn, backend=pyfuser, dynamic=False)` on CPU
tensors, checked against eager.

    PYTHONPATH=. python3 bench/fuzz_fx.py --n 1000 --seed 0

    PYTHONPATH=. python3 bench/fuzz_fx.py --dynamic --n 300 --seed 910000

`--more-ops` (static or dynamic programs): each program with 1-4 more lines of the ops only
tests/cpu/fx_fuzz_more.py draws (trigonometric, rounding, activations, bitwise, remainders,
logsumexp, std, var_mean, max over a dim, cumsum, rms_norm, group_norm, batch_norm, ...).

`--dynamic`: the dynamic-shape programs (tests/cpu/fx_fuzz_dynamic.py: compiled once with
dynamic=True or mark_dynamic, called at three sets of sizes, checked for recompiles too); the
summary then also counts the region calls that ran eagerly by reason and the programs whose
guards Dynamo itself recompiles or rejects (skipped). It runs with PYFUSER_DISABLE_DISK_CACHE=1
unless that is set (no region or kernel plans from earlier processes).

`--random-ops`: the programs of tests/cpu/fx_fuzz_random.py (dropout, rand_like, bernoulli,
uniform_, rand among fx_fuzz's lines), judged by the draws' laws, a replay of the compiled
call's draws, reproducibility and independence; the summary adds the kept / one rate of every
tested value summed over the run (`--dump DIR`: each program's reproducible outputs written
there instead of checked, to compare two pyfuser versions bit for bit).

Program i is `fx_fuzz.generate(seed + i)` (`fx_fuzz_dynamic.generate` with --dynamic), so a
failure is reproduced by its seed alone (`--seed S --n 1`). A progress line every `--every` programs; each failure is printed with its
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


def _load(dynamic=False, random_ops=False):
    sys.path.insert(0, HERE)
    from common import load_test_module
    if random_ops:
        load_test_module("fx_fuzz")
        return load_test_module("fx_fuzz_random"), None
    if not dynamic:
        return load_test_module("fx_fuzz"), None
    import types
    load_test_module("fx_fuzz")
    gen, chk = load_test_module("fx_fuzz_dynamic"), load_test_module("fx_check_dynamic")
    return types.SimpleNamespace(generate=gen.generate, check=chk.check,
                                 Failure=chk.Failure), chk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="number of programs")
    ap.add_argument("--seed", type=int, default=0, help="first program's seed")
    ap.add_argument("--every", type=int, default=50, help="progress line every N programs")
    ap.add_argument("--dynamic", action="store_true", help="dynamic-shape programs")
    ap.add_argument("--more-ops", action="store_true",
                    help="programs with 1-4 more lines of tests/cpu/fx_fuzz_more.py's ops")
    ap.add_argument("--random-ops", action="store_true",
                    help="programs with random ops (tests/cpu/fx_fuzz_random.py)")
    ap.add_argument("--dump", default=None,
                    help="with --random-ops: write each program's outputs to DIR/SEED.pt")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("pyfuser").setLevel(logging.WARNING)
    logging.getLogger("torch._guards").setLevel(logging.CRITICAL)  # Dynamo's own rejections
    if args.dynamic:   # no plans from other processes: a seed's result is its own
        os.environ.setdefault("PYFUSER_DISABLE_DISK_CACHE", "1")
    if args.random_ops and (args.more_ops or args.dynamic):
        raise SystemExit("--random-ops takes neither --more-ops nor --dynamic")
    FZ, _ = _load(args.dynamic, args.random_ops)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for s in range(args.seed, args.seed + args.n):
            FZ.dump(FZ.generate(s), os.path.join(args.dump, f"{s}.pt"))
        print(f"wrote {args.n} programs' outputs to {args.dump}")
        return 0
    tested = [0, 0.0, 0.0, 0.0]      # elements, ones, expected ones, variance
    failed, fused, eager_calls, unfused, reasons, skipped = [], 0, 0, {}, {}, {}
    t0 = time.time()
    for i, s in enumerate(range(args.seed, args.seed + args.n), 1):
        p = FZ.generate(s, more_ops=True) if args.more_ops else FZ.generate(s)
        try:
            f = FZ.check(p)
        except Exception as e:  # noqa: BLE001  (the checker itself broke: report, go on)
            f = FZ.Failure(p, f"checker raised {type(e).__name__}: {e}")
        fused += p.stats.get("fused_nodes", 0)
        eager_calls += p.stats.get("eager_calls", 0)
        for reason, k in p.stats.get("unfused", {}).items():
            unfused[reason] = unfused.get(reason, 0) + k
        for reason, k in p.stats.get("eager_reasons", {}).items():
            reasons.setdefault(reason, []).append(s)
        for key in ("dynamo_skipped", "dynamo_recompiled"):
            if p.stats.get(key):
                skipped.setdefault(key, []).append(s)
        for n, ones, q in p.stats.get("tested", []):
            tested[0] += n
            tested[1] += ones
            tested[2] += n * q
            tested[3] += n * q * (1 - q)
        if f is not None:
            failed.append(s)
            print(f"FAIL {f}\n", flush=True)
        if i % args.every == 0 or i == args.n:
            print(f"[{i}/{args.n}] seeds {args.seed}..{s}: {len(failed)} failing, "
                  f"{time.time() - t0:.0f} s", flush=True)
    print(f"fused nodes {fused}, region calls run eagerly {eager_calls}")
    for reason, k in sorted(unfused.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  unfused x{k}: {reason}")
    for reason, seeds in reasons.items():
        print(f"  ran eagerly ({len(seeds)} programs, e.g. {seeds[:5]}): {reason}")
    for key, seeds in skipped.items():
        print(f"  {key}: {len(seeds)} programs, e.g. {seeds[:8]}")
    if tested[0]:
        z = (tested[1] - tested[2]) / max(tested[3], 1e-12) ** 0.5
        print(f"random values: {tested[0]} elements tested, {tested[1]:.0f} ones against "
              f"{tested[2]:.1f} expected (z = {z:.2f})")
        if abs(z) > 6:
            print("FAIL the run's rate is off by more than 6 standard deviations")
            failed.append("rate")
    print(f"failing seeds: {failed}" if failed else "no failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
