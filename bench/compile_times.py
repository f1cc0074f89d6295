"""Compile times as a user meets them: every first call in a new process (issue 16's targets).

    PYTHONPATH=. python3 bench/compile_times.py --models bert,gpt2,llama --dtypes float32 --reps 2
    PYTHONPATH=. python3 bench/compile_times.py --dry-run --models bert --size 2,8,32,1  # CPU

bench/models.py times the first calls of every mode inside one long process, after the earlier
rows' compiles, timed runs and profiles; the compilers' second and third compiles there pay for
what the process holds by then (its heap, Dynamo's and Inductor's state), and which compiler
runs first decides who pays for what. Here each measurement is a process of its own
(`--child`), started with the compile caches pointed at directories of its own
(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, PYFUSER_CACHE_DIR; set before torch is imported,
so Inductor's compile workers see them too):
- the child imports torch and pyfuser, builds the native cached-call runner (an install step)
  and compiles a tiny function with the mode's backend (imports and worker pools: not a
  model's compile time), then times the model's first inference forward plus its first training
  step (bench/models.py's Case: Dynamo, AOTAutograd, the backend, the first runs, a synchronize
  at the end): `cold_s` with empty cache directories, `warm_s` in a second process reading the
  cold one's directories (the disk caches of both compilers: Inductor's FX graph, AOTAutograd
  and Triton caches; pyfuser's CUBINs, plans and graph cache). `cpu_s` is the child's main
  thread's CPU time over the same calls (compile threads and workers not counted).
- the modes of one model and dtype alternate their order from one repetition to the next; the
  table holds each cell's median over `--reps` and every run's value.
Mode `aot_eager` (torch's backend of Dynamo and AOTAutograd with eager kernels, no compiler) times
what both compilers' first calls hold besides their own work.
Output: a markdown table and pyfuser / Inductor ratios on stdout; under `--out` (default $OUT)
`bench_compile_times.md` and `.json`. On the CPU (`--dry-run`, or no GPU) the Inductor modes
are left out (its C++ backend is not what the targets are about), as bench/models.py does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.models import CACHE_VARS  # noqa: E402  (the compile caches bench/models.py empties)

MODES = ("inductor", "pyfuser", "aot_eager")


# ---- the child: one model's first calls in this process ------------------------------------------
def child(args) -> dict:
    import torch
    from bench.models import Case, compile_tiny, load_corpus, profile_size
    from bench.models_timing import sync
    TC = load_corpus()
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    size = profile_size(TC, device, args.size) if args.size else \
        (TC.BENCH if device == "cuda" else TC.SMALL)
    if device == "cuda" and args.mode == "pyfuser":
        from pyfuser.runtime import native
        native.build()
    compile_tiny(args.mode, device)
    sync(device)
    torch._dynamo.reset()
    case = Case(TC, args.models, args.dtypes, size, device, None)
    model, fn, opt = case.make(args.mode)
    c0, t0 = time.thread_time(), time.perf_counter()
    case.forward(model, fn)
    case.train_step(model, fn, opt)
    sync(device)
    return {"seconds": time.perf_counter() - t0, "cpu_s": time.thread_time() - c0,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__}


def run_child(model: str, dtype: str, mode: str, caches: str, args) -> dict:
    path = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))     # (no empty entry: the cwd)
    for var in CACHE_VARS:
        env[var] = os.path.join(caches, var.split("_")[0].lower())
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model,
           "--dtypes", dtype, "--modes", mode]
    if args.size:
        cmd += ["--size", args.size]
    if args.dry_run:
        cmd.append("--dry-run")
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {out.returncode}: {tail[0][:160]}"}
    return json.loads(line[-1][len("RESULT "):])


# ---- the parent: processes per model, dtype, mode and repetition --------------------------------
def measure(args, models, dtypes, modes, done=None) -> tuple[list, dict]:
    """(rows, facts): a row per model, dtype and mode; `done(rows, facts)` is called after each
    model and dtype (the outputs are written as the run goes: a run stopped from outside keeps
    the cells it finished)."""
    rows, facts = [], {}
    base = tempfile.mkdtemp(prefix="compile_times_")
    for dtype in dtypes:
        for model in models:
            runs = {m: {"cold_s": [], "warm_s": [], "cpu_s": [], "warm_cpu_s": []} for m in modes}
            errors: dict = {}
            for rep in range(args.reps):
                order = modes if rep % 2 == 0 else modes[::-1]
                for mode in order:
                    caches = tempfile.mkdtemp(prefix=f"{model}_{dtype}_{mode}_{rep}_", dir=base)
                    cold = run_child(model, dtype, mode, caches, args)
                    if "error" in cold:
                        errors[mode] = cold["error"]
                        continue
                    facts.update(device=cold["device"], torch=cold["torch"])
                    runs[mode]["cold_s"].append(cold["seconds"])
                    runs[mode]["cpu_s"].append(cold["cpu_s"])
                    if args.warm:
                        warm = run_child(model, dtype, mode, caches, args)
                        if "error" in warm:
                            errors[mode] = "warm: " + warm["error"]
                            continue
                        runs[mode]["warm_s"].append(warm["seconds"])
                        runs[mode]["warm_cpu_s"].append(warm["cpu_s"])
                    print(model, dtype, mode, rep, {k: v[-1] for k, v in runs[mode].items() if v},
                          flush=True)
            for mode in modes:
                row = {"model": model, "dtype": dtype, "mode": mode}
                for key, vals in runs[mode].items():
                    if vals:
                        row[key] = statistics.median(vals)
                        row[key + "_all"] = [round(v, 2) for v in vals]
                if mode in errors:
                    row["error"] = errors[mode]
                rows.append(row)
            if done is not None:
                done(rows, facts)
    return rows, facts


def _cell(row, key) -> str:
    if key not in row:
        return ""
    runs = row.get(key + "_all", [])
    return f"{row[key]:.2f}" + (f" ({', '.join(f'{v:.2f}' for v in runs)})" if len(runs) > 1
                                else "")


def table(rows) -> str:
    cols = ["cold_s", "cpu_s", "warm_s", "warm_cpu_s"]
    lines = ["| model | dtype | mode | " + " | ".join(cols) + " | error |",
             "|---|---|---|" + "---|" * (len(cols) + 1)]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['mode']} | " +
                     " | ".join(_cell(r, c) for c in cols) + f" | {r.get('error', '')} |")
    return "\n".join(lines)


def ratios(rows) -> list[str]:
    """pyfuser / Inductor medians per model and dtype, against issue 16's targets (cold at most
    1/3, warm at most 1/10)."""
    by = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    out = []
    for (model, dtype, mode), r in by.items():
        ind = by.get((model, dtype, "inductor"))
        if mode != "pyfuser" or ind is None:
            continue
        parts = [f"{k[:-2]} {r[k] / ind[k]:.2f}" for k in ("cold_s", "warm_s")
                 if k in r and k in ind]
        if parts:
            out.append(f"- {model} {dtype}: pyfuser / Inductor " + ", ".join(parts) +
                       " (targets: cold 0.33, warm 0.10)")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="bert,gpt2,llama")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--modes", default="inductor,pyfuser",
                   help=f"of {', '.join(MODES)} (aot_eager: Dynamo and AOTAutograd, no compiler)")
    p.add_argument("--size", default="", help="batch,seq,hidden,layers (default: the bench's)")
    p.add_argument("--reps", type=int, default=1, help="processes per cell (cold, and warm)")
    p.add_argument("--no-warm", dest="warm", action="store_false", help="cold processes only")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a child may take")
    p.add_argument("--dry-run", action="store_true", help="on the CPU (kernel interpreter)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.environ.get("OUT"), help="output directory (default $OUT)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        args.mode = args.modes
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"bench/compile_times.py: unknown mode {bad} (of {', '.join(MODES)})")
    import torch
    if args.dry_run or not torch.cuda.is_available():
        args.dry_run = True
        modes = [m for m in modes if m != "inductor"]
    start = time.perf_counter()

    def write(rows, facts) -> str:
        head = (f"{facts.get('device', '?')}, torch {facts.get('torch', '?')}, "
                f"{args.reps} process(es) a cell, size {args.size or 'the bench size'}, "
                f"{time.perf_counter() - start:.0f} s in all; seconds (every run's value)")
        text = "\n".join([head, "", table(rows), "", *ratios(rows)])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "bench_compile_times.md"), "w") as fh:
                fh.write(text + "\n")
            with open(os.path.join(args.out, "bench_compile_times.json"), "w") as fh:
                json.dump({"facts": facts, "rows": rows}, fh, indent=1)
        return text

    rows, facts = measure(args, [m for m in args.models.split(",") if m],
                          [d for d in args.dtypes.split(",") if d], modes, write)
    print(write(rows, facts))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
