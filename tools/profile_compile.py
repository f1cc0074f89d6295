"""Where the torch.compile backend's compile time goes: cold (empty disk cache) and warm (a new
process, the disk cache of the cold one), per phase.

    PYTHONPATH=. python3 tools/profile_compile.py                      # bert, CPU sizes (SMALL)
    PYTHONPATH=. python3 tools/profile_compile.py --models bert,gpt2,llama --size 8,512,768,4
    PYTHONPATH=. python3 tools/profile_compile.py --threads 1          # NVRTC one after another
    PYTHONPATH=. python3 tools/profile_compile.py --dtype bfloat16     # under bfloat16 autocast

Each measurement runs in a fresh process (`--child`) with one PYFUSER_CACHE_DIR per model: the
first fills it (cold), the second reads it (warm). The child times the first inference forward
and the first training step of a model of tests/cpu/train_corpus.py compiled with
backend="pyfuser" (what bench/models.py calls `cold_s` / `warm_s`), with wrappers around the
functions of each phase; time is charged to the innermost phase running (exclusive times, so
they add up), the rest is Dynamo, AOTAutograd's tracing, torch and the model's own Python:
- fx.support / fx.partition / fx.lower / fx.rewrite: compile_graph's steps (fx/*.py);
- fx.plan_cache: regions' plans on disk (frontend/fx/plan_cache.py): keys, loads, restores,
  stores; fx.prepare: planning ahead of the first call (what segment / plan do not count);
- segment: the segmenter; signature: the executor's kernel cache key;
- plan: scheduling, kernel IR and CUDA source (codegen/api.plan_kernel);
- nvrtc: NVRTC compiles (per thread: summed over threads, so it may exceed its wall share;
  `nvrtc_wall` is the span the compiles covered); disk: CUBIN disk-cache reads and writes;
- launcher: loading CUBINs into the driver (GPU only);
- run: the kernels' runs (the CPU interpreter, or launches), eager fallbacks: not compile time.
The process's CPU time and the main thread's are printed beside the wall time: on a shared
machine the wall times of threads depend on the load, the CPU times much less.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class PhaseTimer:
    """Exclusive time per phase: wrapped functions push their phase; time goes to the innermost.
    `clock`: time.perf_counter (wall) or time.thread_time (this thread's CPU time). Threads
    other than the main one (the NVRTC pool) are summed per phase on their own, or, with
    `main_only`, not counted (their calls pass through unwrapped)."""

    def __init__(self, clock=time.perf_counter, main_only: bool = False):
        self.totals: dict = {}
        self.counts: dict = {}
        self.clock = clock
        self.main = threading.get_ident() if main_only else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self.spans: list = []

    def wrap(self, owner, attr: str, phase: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None or getattr(fn, "_phase_wrapped", False):
            return
        timer = self

        def wrapped(*a, **k):
            if timer.main is not None and threading.get_ident() != timer.main:
                return fn(*a, **k)
            stack = getattr(timer._local, "stack", None)
            if stack is None:
                stack = timer._local.stack = []
            t0 = timer.clock()
            stack.append([phase, 0.0])
            try:
                return fn(*a, **k)
            finally:
                t1 = timer.clock()
                _, inner = stack.pop()
                spent = t1 - t0
                with timer._lock:
                    timer.totals[phase] = timer.totals.get(phase, 0.0) + spent - inner
                    timer.counts[phase] = timer.counts.get(phase, 0) + 1
                    if phase == "nvrtc":
                        timer.spans.append((t0, t1))
                if stack:
                    stack[-1][1] += spent
        wrapped._phase_wrapped = True
        wrapped.__wrapped__ = fn
        setattr(owner, attr, wrapped)


def install_compile_graph(timer: PhaseTimer, prefix: str = "") -> None:
    """Phases of pyfuser's compile_graph (fx.*: support, partition, lower, rewrite, plan cache,
    prepare, the rest) and of the planning below it (`prefix` + segment / signature / plan),
    with the kernels' runs on the interpreter as "run" (tools/profile_warm.py shares this)."""
    from pyfuser.codegen import api
    from pyfuser.frontend.fx import compile_graph as CG
    from pyfuser.ir import evaluator
    from pyfuser.segment import segmenter
    for attr, phase in (("node_support", "fx.support"), ("partition", "fx.partition"),
                        ("lower_region", "fx.lower"), ("resolve_symints", "fx.lower"),
                        ("region_key", "fx.lower"), ("_rewrite", "fx.rewrite"),
                        ("compile_graph", "fx.other")):
        timer.wrap(CG, attr, phase)
    try:
        from pyfuser.frontend.fx import plan_cache
        for attr in ("load", "store"):
            timer.wrap(plan_cache, attr, "fx.plan_cache")
        timer.wrap(CG, "_prepare", "fx.prepare")
    except ImportError:                 # before the plan cache
        pass
    timer.wrap(segmenter, "segment", prefix + "segment")
    timer.wrap(api, "signature", prefix + "signature")
    timer.wrap(api, "plan_kernel", prefix + "plan")
    timer.wrap(api, "interpret", "run")
    timer.wrap(evaluator, "evaluate", "run")


def install(timer: PhaseTimer) -> None:
    from pyfuser.frontend.fx import backend
    from pyfuser.runtime import disk_cache, nvrtc
    timer.wrap(backend, "pyfuser_backend", "aot")
    install_compile_graph(timer)
    timer.wrap(nvrtc, "_compile", "nvrtc")
    timer.wrap(disk_cache, "load", "disk")
    timer.wrap(disk_cache, "store", "disk")
    from pyfuser.runtime import launch
    timer.wrap(launch.KernelLauncher, "__init__", "launcher")
    timer.wrap(launch.KernelLauncher, "launch", "run")


def child(args) -> dict:
    import torch
    from bench.models import Case, load_corpus
    from bench.models_timing import sync
    TC = load_corpus()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = TC.SMALL if device == "cpu" and not args.size else TC.BENCH
    if args.size:
        b, s, h, n = (int(v) for v in args.size.split(","))
        size = dataclasses.replace(size, batch=b, seq=s, hidden=h, layers=n)
    import pyfuser
    from pyfuser.runtime import nvrtc
    # imports and first-use costs out of the way, as bench/models.py does (warm_up_compilers)
    x = torch.randn(16, 16, device=device, requires_grad=True)
    f = torch.compile(lambda t: torch.nn.functional.gelu(t * 2).sum(-1), backend=pyfuser.backend)
    f(x).sum().backward()
    torch._dynamo.reset()
    case = Case(TC, args.model, args.dtype, size, device, 0.0)
    model, fn, opt = case.make("pyfuser")
    timer = PhaseTimer()
    install(timer)
    n0 = dict(nvrtc.stats)
    import resource
    r0, m0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    t0 = time.perf_counter()
    case.forward(model, fn)
    case.train_step(model, fn, opt)
    sync(device)
    total = time.perf_counter() - t0
    r1, m1 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    phases = dict(sorted(timer.totals.items(), key=lambda kv: -kv[1]))
    wall = 0.0
    if timer.spans:                      # union of the NVRTC compile intervals
        spans = sorted(timer.spans)
        lo, hi = spans[0]
        for a, b in spans[1:]:
            if a > hi:
                wall += hi - lo
                lo, hi = a, b
            else:
                hi = max(hi, b)
        wall += hi - lo
    return {"model": f"{args.model} {args.dtype}", "total_s": total, "cpu_s": cpu,
            "main_cpu_s": m1 - m0,
            "phases": phases, "counts": timer.counts,
            "nvrtc_wall": wall,
            "kernels_nvrtc": nvrtc.stats["nvrtc"] - n0["nvrtc"],
            "kernels_disk": nvrtc.stats["disk"] - n0["disk"]}


def run_child(model: str, cache: str, args) -> dict:
    env = dict(os.environ, PYFUSER_CACHE_DIR=cache, PYTHONPATH=ROOT)
    if args.threads is not None:
        env["PYFUSER_COMPILE_THREADS"] = str(args.threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model]
    if args.size:
        cmd += ["--size", args.size]
    cmd += ["--dtype", args.dtype]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise SystemExit(f"child failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def show(label: str, r: dict) -> str:
    ph = r["phases"]
    own = sum(v for k, v in ph.items() if k not in ("aot", "run"))
    rest = r["total_s"] - sum(ph.values())
    parts = ", ".join(f"{k} {v:.3f}" for k, v in ph.items())
    cpu = f" (CPU {r['cpu_s']:.2f} s, main thread {r['main_cpu_s']:.2f} s)" if "cpu_s" in r else ""
    return (f"{r['model']:8s} {label}: first calls {r['total_s']:.2f} s{cpu}; pyfuser's own "
            f"{own:.2f} s; AOTAutograd {ph.get('aot', 0):.2f} s; kernel runs {ph.get('run', 0):.2f}"
            f" s; Dynamo, torch and the rest {rest:.2f} s\n    {parts}\n    NVRTC kernels "
            f"{r['kernels_nvrtc']} (wall {r['nvrtc_wall']:.3f} s), from disk {r['kernels_disk']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="bert")
    p.add_argument("--size", default="", help="batch,seq,hidden,layers (default: SMALL on CPU)")
    p.add_argument("--threads", type=int, default=None, help="PYFUSER_COMPILE_THREADS")
    p.add_argument("--dtype", default="float32", help="float32, or bfloat16 (autocast)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args(argv)
    if args.child:
        args.model = args.models
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    results = []
    for model in filter(None, args.models.split(",")):
        cache = tempfile.mkdtemp(prefix=f"pyfuser_ct_{model}_")
        for label in ("cold", "warm"):
            r = run_child(model, cache, args)
            r["label"] = label
            results.append(r)
            print(show(label, r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
