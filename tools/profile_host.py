"""Where a model's forward spends its *host* time under the pyfuser backend (for finding why a
model's step is slower than Inductor's when the GPU is not the bottleneck).

    PYTHONPATH=. python3 tools/profile_host.py [--model bert] [--dtype bfloat16] [--top 35]
        [--step forward|train] [--nodes] [--regions] [--size batch,seq,hidden,layers]

Builds the model of bench/models.py (random weights), compiles it per mode, warms it up, then
prints per mode the host time of a forward (the call returning, no synchronization; median of
`--reps`) beside the wall time of a synchronized forward, and finally a cProfile of pyfuser's
forwards (of each pyfuser mode: pyfuser, pyfuser-cg): the `--top` functions by own time and by
cumulative time. Runs on the CPU too (the kernels then run in the interpreter, so only the
ratios between Python layers mean anything).
With `--nodes`, pyfuser's rewritten graphs are run node by node (an FX interpreter that times
each node's call alone, not the interpreter's handling of its arguments; no synchronization):
host µs per fused region and per aten op left in the
graph, per forward — what the graph's glue costs beside the regions. With `--regions`, each
distinct fused region is called alone in a loop with the arguments of its last call, through
each layer of the call path (the region object, `execute_fusion`, the fusion's program `run`)
and as its own nodes run eagerly: host µs per call of each.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _times(run, reps: int, sync) -> tuple[float, float]:
    host, wall = [], []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
    return statistics.median(host) * 1e3, statistics.median(wall) * 1e3


def time_nodes(run, reps: int, sync) -> list:
    """[(what, calls per forward, µs per call)] of every node of pyfuser's compiled graphs."""
    import torch
    from pyfuser.frontend.fx import compile_graph as CG
    from pyfuser.frontend.fx.region import FusedRegion
    acc = collections.defaultdict(lambda: [0, 0.0])

    def record(what, t):
        a = acc[what]
        a[0] += 1
        a[1] += time.perf_counter() - t

    class Timed(torch.fx.Interpreter):
        """Times each call itself (the interpreter's fetching of a node's arguments, a few µs,
        is left out)."""
        def call_function(self, target, args, kwargs):
            if isinstance(target, FusedRegion):
                what = "fused region"
            elif isinstance(target, torch._ops.OpOverload):
                what = str(target)
            else:
                what = f"{getattr(target, '__module__', None) or 'torch'}.{target.__name__}"
            t = time.perf_counter()
            r = target(*args, **kwargs)
            record(what, t)
            return r

        def call_method(self, target, args, kwargs):
            obj, *rest = args
            t = time.perf_counter()
            r = getattr(obj, target)(*rest, **kwargs)
            record(f"Tensor.{target}", t)
            return r

    graphs = CG.compiled_graphs()
    for g in graphs:
        g._forward = lambda *args, _g=g: Timed(_g.gm).run(*args)
    for _ in range(reps):
        run()
    sync()
    rows = [(w, c / reps, 1e6 * t / c) for w, (c, t) in acc.items()]
    rows.sort(key=lambda r: -r[1] * r[2])
    return rows


def last_region_calls(run, sync) -> dict:
    """id(region) -> (region, its arguments) of the last call of every fused region that one
    `run()` calls."""
    import pyfuser.frontend.fx.region as R
    last = {}
    real = R.FusedRegion.__call__
    R.FusedRegion.__call__ = lambda self, *a: (last.__setitem__(id(self), (self, a)),
                                               real(self, *a))[1]
    try:
        run()
    finally:
        R.FusedRegion.__call__ = real
    sync()
    return last


def time_regions(run, reps: int, sync) -> list:
    """[(ops, kernels, {path: µs per call})] per distinct fused region of pyfuser's graphs."""
    from pyfuser.frontend.fx import compile_graph as CG
    from pyfuser.runtime import dispatch
    regions = [r for g in CG.compiled_graphs() for r in g.regions]
    seen = {}
    for r in regions:
        key = (tuple(r.ops), id(r.fusion))
        seen.setdefault(key, r)
    last = last_region_calls(run, sync)
    out = []
    for r in seen.values():
        if id(r) not in last:
            continue
        args = last[id(r)][1]
        inputs = args if r.identity else r.fusion_inputs(args)
        progs = dispatch.programs(r.fusion)
        paths = {"region": lambda: r(*args),
                 "execute_fusion": lambda: dispatch.execute_fusion(r.fusion, inputs),
                 "progs.run": lambda: progs.run(inputs),
                 "eager nodes": lambda: r.eager(*args)}
        res = {}
        for name, f in paths.items():
            try:
                f()
            except Exception:  # noqa: BLE001 - e.g. eager nodes outside the autocast they ran in
                res[name] = float("nan")
                continue
            for _ in range(5):
                f()
            sync()
            t = time.perf_counter()
            for _ in range(reps):
                f()
            res[name] = 1e6 * (time.perf_counter() - t) / reps
            sync()
        out.append((r.ops, r.kernels(), res))
    return out


def profile_slow_regions(run, sync, n: int, top: int) -> None:
    """cProfile of 200 progs.run calls of each of the n regions whose calls are slowest: where
    a region's host time goes (its inputs, outputs and kernels printed first)."""
    from pyfuser.runtime import dispatch
    timed = []
    for r, args in last_region_calls(run, sync).values():
        inputs = args if r.identity else r.fusion_inputs(args)
        progs = dispatch.programs(r.fusion)
        for _ in range(3):
            progs.run(inputs)
        sync()
        t = time.perf_counter()
        for _ in range(20):
            progs.run(inputs)
        timed.append(((time.perf_counter() - t) / 20, r, progs, inputs))
        sync()
    timed.sort(key=lambda x: -x[0])
    for sec, r, progs, inputs in timed[:n]:
        outs = progs.run(inputs)
        print(f"--- region {r.__name__}: {sec * 1e6:.1f} µs a progs.run, {len(inputs)} inputs, "
              f"{len(outs)} outputs, {r.kernels()} kernels, program {type(progs).__name__}")
        print("    inputs:", [tuple(x.shape) if hasattr(x, "shape") else x for x in inputs][:12])
        print(f"    native runner: {progs.native!r}, programs {len(progs.runs)}, handed over "
              f"{len(progs.native_data)}, pending {len(progs.pending)}")
        if progs.native:
            print(f"    the runner's key of these inputs: {'none' if progs.native.key(inputs) is None else 'made'}")
        for key, steps in list(progs.pending.items()):
            try:
                print("    pending program's native form:", "None" if steps() is None else "ok")
            except Exception as e:  # noqa: BLE001 - a diagnostic
                print(f"    pending program's native form raised {type(e).__name__}: {e}")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            progs.run(inputs)
        sync()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
        text = s.getvalue()
        print(text[text.find("ncalls"):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert", choices=("bert", "gpt2", "llama", "resnet18"))
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--modes", default="eager,inductor,pyfuser")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--nodes", action="store_true", help="host time per node of pyfuser's graphs")
    ap.add_argument("--regions", action="store_true", help="host time per call path of each region")
    ap.add_argument("--slow-regions", type=int, default=0,
                    help="cProfile the N regions with the slowest progs.run calls (with --regions)")
    ap.add_argument("--step", default="forward", choices=("forward", "train"),
                    help="what is timed: an inference forward or a training step")
    ap.add_argument("--size", default="", help="batch,seq,hidden,layers (default: the bench's)")
    args = ap.parse_args(argv)

    import torch
    import models as BM
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        from pyfuser.runtime import native
        native.build()                 # an install step (make setup), as bench/models.py does
    TC = BM.load_corpus()
    size = BM.profile_size(TC, device, args.size)
    case = BM.Case(TC, args.model, args.dtype, size, device, dropout=None)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    modes = [m for m in args.modes.split(",") if m and (device == "cuda" or m != "inductor")]
    for mode in modes:
        torch._dynamo.reset()
        model, fn, opt = case.make(mode)
        run = (lambda: case.forward(model, fn)) if args.step == "forward" else \
            (lambda: case.train_step(model, fn, opt))
        for _ in range(3):
            run()
        host, wall = _times(run, args.reps, sync)
        print(f"{args.model} {args.dtype} {mode}: host {host:.2f} ms, wall {wall:.2f} ms per {args.step}")
        if not mode.startswith("pyfuser"):
            continue
        if args.regions and mode == "pyfuser":
            print("| ops | kernels | region µs | execute_fusion µs | progs.run µs | eager nodes µs |")
            print("|---|---|---|---|---|---|")
            timed = time_regions(run, 200, sync)
            for ops, k, res in timed:
                short = ",".join(o.split(".")[1] if o.startswith("aten.") else o for o in ops)
                print(f"| {short[:70]} | {k} | " + " | ".join(f"{v:.1f}" for v in res.values()) + " |")
            if args.slow_regions:
                profile_slow_regions(run, sync, args.slow_regions, args.top)
            if not args.nodes:
                continue
        if args.nodes and mode == "pyfuser":
            rows = time_nodes(run, args.reps, sync)
            total = sum(c * us for _, c, us in rows)
            print(f"--- pyfuser graph nodes: {total / 1e3:.2f} ms per {args.step} inside nodes")
            print(f"| node | calls per {args.step} | µs per call | µs per {args.step} |\n|---|---|---|---|")
            for w, c, us in rows[:args.top]:
                print(f"| {w} | {c:.1f} | {us:.1f} | {c * us:.0f} |")
            continue
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.reps):
            run()
        sync()
        prof.disable()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
            text = s.getvalue()
            print(f"--- {mode}, {args.reps} calls ({args.step}), by {key}")
            print(text[text.find("ncalls"):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
