"""The long differential fuzzing run: N random programs (tests/cpu/program_fuzz.py) through
pyfuser.jit, checked against eager.

    PYTHONPATH=. python3 bench/fuzz_programs.py --n 10000                 # CPU: both executors
    PYTHONPATH=. python3 bench/fuzz_programs.py --n 10000 --device cuda   # GPU: the CUDA kernels
    PYTHONPATH=. python3 bench/fuzz_programs.py --n 10000 --jobs 8 --out /tmp/fuzz

Program i is `program_fuzz.generate(seed + i)`, so a failure is reproduced by its seed alone
(`--seed S --n 1`). On the CPU each program runs through the reference evaluator and the CPU
interpreter of the generated kernels, on CUDA through the kernels (eager on the GPU is then the
reference: no CPU/GPU rounding difference to correct). Each failure is shrunk and printed (IR
text, inputs) and, with `--out`, written to DIR/fail_<seed>.ir with its description; the exit
status is 1 when any program failed. `--jobs` runs that many worker processes (each with its
own CUDA context on --device cuda; NVRTC compiling the kernels is most of the time, so workers
help there too). On a GPU machine with 16 cores, `--jobs 8` runs the 10,000 programs in a few
minutes once the disk cache is warm; `--seed S --n N` splits a run into parts.
A CI run uses 300 programs (tests/cpu/test_diff_fuzz.py, PYFUSER_FUZZ_PROGRAMS to change it).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _load():
    sys.path.insert(0, HERE)
    from common import load_test_module
    return load_test_module("program_fuzz")


def _chunk(args):
    seeds, device = args
    PF = _load()
    out = []
    for p, f in PF.run_many(seeds, device=device):
        out.append((p.seed, str(f), PF.describe(p), p.text))
    return len(seeds), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0, help="first program seed")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=None, help="directory for failing programs")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("fuzz_programs: error: --device cuda: no CUDA device", file=sys.stderr)
            return 2
    seeds = list(range(args.seed, args.seed + args.n))
    size = 50
    chunks = [(seeds[i:i + size], args.device) for i in range(0, len(seeds), size)]
    t0, done, failures = time.perf_counter(), 0, []
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    pool = mp.get_context("spawn").Pool(args.jobs) if args.jobs > 1 else None
    results = pool.imap(_chunk, chunks) if pool else map(_chunk, chunks)
    from pyfuser.progress import Progress
    progress = Progress(len(chunks), "fuzz_programs")
    for n, fails in results:
        progress.start(f"{done + n}/{len(seeds)} programs, {len(failures)} failing")
        progress.finish()
        done += n
        for seed, what, desc, text in fails:
            failures.append(seed)
            print(f"FAIL seed {seed}: {what}\n{desc}", flush=True)
            if args.out:
                with open(os.path.join(args.out, f"fail_{seed}.ir"), "w") as fh:
                    fh.write(text)
                with open(os.path.join(args.out, f"fail_{seed}.txt"), "w") as fh:
                    fh.write(f"{what}\n{desc}")
        print(f"{done}/{len(seeds)} programs, {len(failures)} failing, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    progress.close()
    if pool:
        pool.close()
    print(f"fuzz_programs: {len(seeds)} programs on {args.device} from seed {args.seed}: "
          f"{len(failures)} failing {failures[:20]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
