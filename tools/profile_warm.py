"""Where a first compile's time goes, Dynamo and AOTAutograd included, for pyfuser, Inductor and
aot_eager, cold (empty caches) and warm (a new process, the caches of the cold one).

    PYTHONPATH=. python3 tools/profile_warm.py --models llama,gpt2 --modes pyfuser,pyfuser-gc
    PYTHONPATH=. python3 tools/profile_warm.py --models llama --reps 3     # medians of 3 pairs

Each measurement is a fresh process (`--child`) timing the first inference forward and the first
training step of a model of tests/cpu/train_corpus.py (what bench/models.py calls `cold_s` /
`warm_s`). Modes: `pyfuser` (its graph cache off: PYFUSER_GRAPH_CACHE=0), `pyfuser-gc`
(pyfuser with its graph cache, the default since the seventeenth session), `inductor`,
`aot_eager`. Phases are exclusive (time goes to the innermost phase running) and are measured in the main thread's CPU time
(`time.thread_time`: on a shared machine far steadier than wall time; compile threads are not
counted), the wall time of the whole is printed beside it:
- dynamo: Dynamo's own frame conversion (bytecode analysis, guards, graph building);
- aot.state: AOTAutograd's metadata pass (fakeified inputs, functionalized trace for metadata);
- aot.trace: AOTAutograd's joint / inference graph capture; aot.partition: the fw/bw split;
- aot.cache: Inductor's AOTAutogradCache lookup (a hit: its load);
- cache.key / cache.load / cache.store: pyfuser's graph cache (frontend/fx/graph_cache.py):
  the key, an entry's load and rebuild (not its graphs' compile_graph), the graphs' pickling;
- inductor: Inductor's compile (FX graph cache hit or C++ codegen and build);
- fx.*: pyfuser's compile_graph steps (rewrites and support, partition, lower, plan cache,
  prepare, rewrite); run: kernel runs in the CPU interpreter (not compile time);
- rest: the model's own Python, eager ops, autograd and what no phase covers.
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
PYFUSER_MODES = ("pyfuser", "pyfuser-gc")
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):            # pyfuser and bench; profile_compile beside this file
    if _path not in sys.path:
        sys.path.insert(0, _path)


def CpuPhases():
    """Exclusive main-thread CPU time per phase (other threads are not counted):
    tools/profile_compile.py's PhaseTimer on this thread's CPU clock."""
    from profile_compile import PhaseTimer
    return PhaseTimer(clock=time.thread_time, main_only=True)


def install(t, mode: str) -> None:
    import torch._dynamo.convert_frame as cf
    import torch._functorch._aot_autograd.graph_compile as gc
    import torch._functorch.aot_autograd as aa
    import torch._functorch.partitioners as parts
    t.wrap(cf, "_compile", "dynamo")
    t.wrap(aa, "create_aot_state", "aot.state")
    t.wrap(gc, "aot_stage1_graph_capture", "aot.trace")
    t.wrap(aa, "aot_stage1_graph_capture", "aot.trace")
    t.wrap(parts, "min_cut_rematerialization_partition", "aot.partition")
    t.wrap(parts, "default_partition", "aot.partition")
    from torch._functorch._aot_autograd import autograd_cache as ac
    t.wrap(ac.AOTAutogradCache, "try_load", "aot.cache")
    if mode == "inductor":
        import torch._inductor.compile_fx as cfx
        t.wrap(cfx, "min_cut_rematerialization_partition", "aot.partition")
        t.wrap(cfx, "compile_fx_inner", "inductor")
        return
    if mode not in PYFUSER_MODES:
        return
    from pyfuser.frontend.fx import backend
    t.wrap(backend, "_recomputing_partition", "aot.partition")
    try:
        from pyfuser.frontend.fx import graph_cache, graph_cache_entry
        t.wrap(graph_cache, "key_for", "cache.key")
        t.wrap(graph_cache, "_load", "cache.load")
        t.wrap(graph_cache_entry, "dump_graph", "cache.store")
        t.wrap(graph_cache_entry, "recompile", "cache.load")
    except ImportError:                 # before the graph cache
        pass
    from profile_compile import install_compile_graph
    install_compile_graph(t, prefix="fx.")


def child(args) -> dict:
    import torch
    from bench.models import Case, load_corpus
    TC = load_corpus()
    mode = args.modes
    import pyfuser
    backend = pyfuser.backend if mode in PYFUSER_MODES else mode
    x = torch.randn(16, 16, requires_grad=True)              # imports, first-use costs
    f = torch.compile(lambda v: torch.nn.functional.gelu(v * 2).sum(-1), backend=backend)
    f(x).sum().backward()
    torch._dynamo.reset()
    case = Case(TC, args.models, args.dtype, TC.SMALL, "cpu", 0.0)
    model = case.base.model
    fn = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    t = CpuPhases()
    install(t, mode)
    c0, w0 = time.thread_time(), time.perf_counter()
    case.forward(model, fn)
    case.train_step(model, fn, opt)
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    phases = dict(t.totals)
    phases["rest"] = cpu - sum(phases.values())
    return {"model": args.models, "mode": mode, "cpu_s": cpu, "wall_s": wall, "phases": phases}


def run_child(model, mode, caches, args) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, PYFUSER_CACHE_DIR=caches + "/pyfuser",
               TORCHINDUCTOR_CACHE_DIR=caches + "/inductor", TRITON_CACHE_DIR=caches + "/triton",
               PYFUSER_GRAPH_CACHE="1" if mode == "pyfuser-gc" else "0")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model, "--modes",
           mode, "--dtype", args.dtype]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise SystemExit(f"child failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="llama")
    p.add_argument("--modes", default="pyfuser,pyfuser-gc,inductor")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=1, help="cold + warm pairs (medians printed)")
    p.add_argument("--warm-reps", type=int, default=1, help="warm processes per cold one")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    out = []
    for model in filter(None, args.models.split(",")):
        for mode in filter(None, args.modes.split(",")):
            runs: dict = {"cold": [], "warm": []}
            for _ in range(args.reps):
                caches = tempfile.mkdtemp(prefix=f"pw_{model}_{mode}_")
                runs["cold"].append(run_child(model, mode, caches, args))
                for _ in range(args.warm_reps):
                    runs["warm"].append(run_child(model, mode, caches, args))
            for label, rs in runs.items():
                if not rs:                       # --warm-reps 0: cold processes only
                    continue
                keys = sorted({k for r in rs for k in r["phases"]},
                              key=lambda k: -statistics.median(r["phases"].get(k, 0) for r in rs))
                med = {k: statistics.median(r["phases"].get(k, 0.0) for r in rs) for k in keys}
                cpu = statistics.median(r["cpu_s"] for r in rs)
                wall = statistics.median(r["wall_s"] for r in rs)
                print(f"{model:6s} {mode:9s} {label}: main-thread CPU {cpu:.2f} s (wall {wall:.2f}"
                      f" s, {len(rs)} runs)\n    " +
                      ", ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)
                out.append({"model": model, "mode": mode, "label": label, "cpu_s": cpu,
                            "wall_s": wall, "phases": med,
                            "cpu_all": [r["cpu_s"] for r in rs]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
