"""Whole-graph benchmark of seed 000 through the TorchScript fuser (one GPU, one run).

    PYTHONPATH=. python3 bench/graphs.py             # writes $OUT/bench_graphs.md if OUT is set
    PYTHONPATH=. python3 bench/graphs.py --dry-run   # everything on the CPU at small sizes

Seed 000 (`((int32(a) + b) * c).to(int64)`, 10000x13000) in three forms: as given (`add`,
`mul`), with `mul_`, with `add_` + `mul_` (examples/seed000_*.ir). Each form runs
  - pyfuser:       `pyfuser.jit(FILE.ir)` (the fused graph; groups run as CUDA kernels),
  - eager runner:  the unfused graph through pyfuser's eager runner (what `pyfuser run` compares to),
  - TorchScript:   `torch.jit.script` of the equivalent Python function (in-place ops and all),
                   called several times first so the profiling executor can fuse; what its
                   fuser did (fusion groups in the last optimized graph) is reported,
  - torch.compile: of the same Python function,
on the same inputs (`make_inputs` of the graph on the device, integer tensors then filled with
random 1..100, never zeros). Per form and column: median µs per call (bench/common.bench_us:
triton do_bench with L2 flush), the % of the measured copy rate it reaches (bytes that must move
= inputs read once + output written once, over the time, over the device-to-device copy rate),
CUDA kernels per call (torch.profiler, memcpy/memset excluded). Every result is checked against
the eager runner before it is timed. Any column that fails shows `error: ...` in its cell; the
table is always printed. Acceptance: pyfuser runs every form as one kernel, at the same speed
(spread of the medians under 5%).

`--dry-run` builds and checks everything on the CPU with sizes capped at `--size` (default 64):
timings are perf_counter medians, kernel counts come from pyfuser's own `last_run` only.
Time budget: `--budget` seconds (default 85); columns that would start after it are skipped.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)
import common  # noqa: E402

from pyfuser.frontend.torchscript import make_inputs, parse_ir, run_graph  # noqa: E402
from pyfuser.frontend.torchscript.fuse_api import jit  # noqa: E402
from pyfuser.frontend.torchscript.jit import eager_handler  # noqa: E402
from pyfuser.progress import Progress  # noqa: E402

TS_WARMUP = 10                      # calls before timing TorchScript (profiling executor)
SPREAD_OK = 0.05                    # acceptance: pyfuser medians within 5% of each other
METHODS = ["pyfuser", "eager", "torchscript", "compile"]
TITLES = {"pyfuser": "pyfuser", "eager": "eager runner", "torchscript": "TorchScript fuser",
          "compile": "torch.compile"}


# ---- the three forms of seed 000, as Python functions equivalent to the .ir files -----------
def seed000(a, b, c):
    t = a.to(torch.int32)
    return ((t + b) * c).to(torch.int64)


def seed000_mul_(a, b, c):
    t = a.to(torch.int32) + b
    t.mul_(c)
    return t.to(torch.int64)


def seed000_add_mul_(a, b, c):
    t = a.to(torch.int32)
    t.add_(b)
    t.mul_(c)
    return t.to(torch.int64)


class Variant:
    def __init__(self, name, path, fn):
        self.name, self.path, self.fn = name, os.path.join(ROOT, path), fn
        self.graph = None
        self.inputs = None
        self.ref = None
        self.floor_us = None
        self.nbytes = None
        self.results: dict = {}
        self.notes: list = []


def variants():
    return [Variant("as given (add, mul)", "examples/seed000_mul.ir", seed000),
            Variant("mul_", "examples/seed000_mul_inplace.ir", seed000_mul_),
            Variant("add_ + mul_", "examples/seed000_add_mul_inplace.ir", seed000_add_mul_)]


# ---- where it runs ------------------------------------------------------------------------
class Env:
    def __init__(self, dry_run: bool, size: int, budget_s: float):
        self.dry = dry_run
        self.dev = "cpu" if dry_run else "cuda"
        self.size = size if dry_run else None
        self.budget = budget_s
        self.t0 = time.perf_counter()
        self.cpu_mode = "interpret"
        self._rate = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def sync(self):
        if self.dev == "cuda":
            torch.cuda.synchronize()

    def time_us(self, fn) -> float:
        if self.dev == "cuda":
            return common.bench_us(fn)
        fn()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    def kernels(self, fn):
        return common.count_kernels(fn) if self.dev == "cuda" else None

    def rate(self) -> float:
        if self._rate is None:
            self._rate = common.copy_rate() if self.dev == "cuda" else _cpu_copy_rate()
        return self._rate

    def device_name(self) -> str:
        if self.dev == "cuda":
            return torch.cuda.get_device_name()
        return "CPU (dry run)"


def _cpu_copy_rate() -> float:
    src = torch.randn(1 << 22)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times)


# ---- helpers ------------------------------------------------------------------------------
def _short(e: BaseException, n: int = 110) -> str:
    text = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
    return msg if len(msg) <= n else msg[:n - 3] + "..."


def _cell_text(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _check(out, ref, what: str):
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{what}: got {type(out).__name__}, not a tensor")
    if out.dtype != ref.dtype or out.shape != ref.shape:
        raise AssertionError(f"{what}: wrong result: {out.dtype} {tuple(out.shape)} vs eager "
                             f"{ref.dtype} {tuple(ref.shape)}")
    if not torch.equal(out, ref):
        diff = int((out.long() - ref.long()).abs().max())
        raise AssertionError(f"{what}: wrong result (max abs diff {diff})")


def _int_inputs_1_to_100(inputs, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    for x in inputs:
        if isinstance(x, torch.Tensor) and not x.is_floating_point() and not x.is_complex() \
                and x.dtype != torch.bool:
            x.random_(1, 101, generator=gen)     # in place: keeps the declared strides
    return inputs


def _checksums(inputs) -> list:
    return [int(x.long().sum()) if isinstance(x, torch.Tensor) else x for x in inputs]


def _walk(block):
    for n in block.nodes():
        yield n
        for b in n.blocks():
            yield from _walk(b)


FUSION_KINDS = ("prim::TensorExprGroup", "prim::CudaFusionGroup", "prim::FusionGroup",
                "prim::StaticSubgraph")


def _ts_fusion_note() -> str:
    """What TorchScript's fuser made of the last executed graph, and its settings."""
    parts = []
    try:
        g = torch.jit.last_executed_optimized_graph()
        kinds: dict = {}
        for n in _walk(g):
            if n.kind() in FUSION_KINDS:
                kinds[n.kind()] = kinds.get(n.kind(), 0) + 1
        parts.append(", ".join(f"{v}x {k}" for k, v in kinds.items()) if kinds
                     else "no fusion group in the optimized graph")
    except Exception as e:  # noqa: BLE001
        parts.append(f"optimized graph unavailable ({_short(e, 60)})")
    settings = []
    for label, name in (("NNC", "_jit_texpr_fuser_enabled"), ("gpu", "_jit_can_fuse_on_gpu"),
                        ("cpu", "_jit_can_fuse_on_cpu")):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            try:
                settings.append(f"{label}={'on' if fn() else 'off'}")
            except Exception:  # noqa: BLE001
                pass
    if settings:
        parts.append("(" + " ".join(settings) + ")")
    return " ".join(parts)


# ---- the columns --------------------------------------------------------------------------
def col_pyfuser(v, env):
    f = jit(v.path, cpu_executor=env.cpu_mode)
    call = lambda: f.run(v.inputs, device=env.dev)[0]  # noqa: E731
    _check(call(), v.ref, "pyfuser")
    env.sync()
    lr = f.last_run
    groups, self_k, eager_groups = lr.groups, lr.kernels, lr.eager_groups
    note = f"{groups} group(s), {self_k} kernel(s) by last_run"
    if lr.host_segments:
        note += f", {lr.host_segments} host segment(s)"
    if eager_groups or lr.fallbacks:
        note += f"; EAGER: {[fb['reason'] for fb in lr.fallbacks]}"
    us = env.time_us(call)
    k = env.kernels(call)
    return {"us": us, "kernels": k, "self_kernels": self_k, "groups": groups,
            "eager_groups": eager_groups, "note": note}


def col_eager(v, env):
    call = lambda: run_graph(v.graph, v.inputs, device=env.dev,  # noqa: E731
                             node_handler=eager_handler)[0]
    note = "the reference"
    try:                     # the Python function the other columns compile is the same graph
        _check(v.fn(*v.inputs), v.ref, "Python function")
    except Exception as e:  # noqa: BLE001
        note = f"Python function differs from the graph: {_short(e)}"
    return {"us": env.time_us(call), "kernels": env.kernels(call), "note": note}


def col_torchscript(v, env):
    sf = torch.jit.script(v.fn)
    out = None
    for _ in range(TS_WARMUP):
        out = sf(*v.inputs)
    env.sync()
    note = _ts_fusion_note()
    _check(out, v.ref, "TorchScript")
    call = lambda: sf(*v.inputs)  # noqa: E731
    return {"us": env.time_us(call), "kernels": env.kernels(call), "note": note}


def col_compile(v, env):
    cf = torch.compile(v.fn)
    t0 = time.perf_counter()
    out = cf(*v.inputs)
    env.sync()
    ct = time.perf_counter() - t0
    _check(out, v.ref, "torch.compile")
    call = lambda: cf(*v.inputs)  # noqa: E731
    return {"us": env.time_us(call), "kernels": env.kernels(call),
            "note": f"first call (compile) {ct:.1f} s"}


COLUMNS = {"pyfuser": col_pyfuser, "eager": col_eager, "torchscript": col_torchscript,
           "compile": col_compile}
# seconds a column may still need when it starts: skipped if the budget has less left
RESERVE_S = {"pyfuser": 3, "eager": 2, "torchscript": 4, "compile": 15}


# ---- setup --------------------------------------------------------------------------------
def prepare(vs, env):
    """Graphs, inputs (shared by forms with the same input types), eager references."""
    shared: dict = {}
    for v in vs:
        try:
            with open(v.path, encoding="utf-8") as fh:
                v.graph = parse_ir(fh.read(), filename=v.path)
            key = tuple(str(x.type) for x in v.graph.inputs)
            if key not in shared:
                xs = make_inputs(v.graph, device=env.dev, seed=0, size_override=env.size)
                shared[key] = _int_inputs_1_to_100(xs, env.dev)
            v.inputs = shared[key]
            try:
                v.ref = run_graph(v.graph, v.inputs, device=env.dev, node_handler=eager_handler)[0]
            except Exception as e:  # noqa: BLE001 - fall back to the Python function
                v.notes.append(f"eager runner failed ({_short(e)}); reference = Python function")
                v.ref = v.fn(*v.inputs)
            env.sync()
            v.nbytes = sum(x.numel() * x.element_size() for x in v.inputs
                           if isinstance(x, torch.Tensor)) + v.ref.numel() * v.ref.element_size()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            v.notes.append(f"setup failed: {_short(e)}")
            v.inputs = None
    return shared


def run_all(vs, env):
    with Progress(len(METHODS) * len(vs), "graphs") as progress:
        for method in METHODS:               # column by column: pyfuser's numbers come first
            for v in vs:
                progress.start(f"{v.name}: {TITLES[method]}")
                _run_cell(v, method, env)
                progress.finish()


def _run_cell(v, method, env):
    """One column of one form: its timing into v.results[method]."""
    t0 = time.perf_counter()
    if v.inputs is None or v.ref is None:
        v.results[method] = {"error": "no inputs (setup failed)"}
        return
    left = env.budget - env.elapsed()
    if left < RESERVE_S[method]:
        v.results[method] = {"error": f"skipped: time budget ({env.budget:.0f} s) spent"}
        return
    try:
        v.results[method] = COLUMNS[method](v, env)
    except Exception as e:  # noqa: BLE001 - one failing column never hides the others
        traceback.print_exc()
        v.results[method] = {"error": _short(e)}
    r = v.results[method]
    print(f"[{v.name}] {TITLES[method]}: "
          + (f"{r['us']:.1f} µs, kernels {r.get('kernels')}" if "us" in r
             else f"error: {r['error']}")
          + f" ({time.perf_counter() - t0:.1f} s, total {env.elapsed():.1f} s)", flush=True)
    if env.dev == "cuda":
        torch.cuda.empty_cache()


# ---- report -------------------------------------------------------------------------------
def _time_cell(r, floor_us) -> str:
    if "error" in r:
        return _cell_text(r["error"] if r["error"].startswith("skipped") else f"error: {r['error']}")
    us = r["us"]
    pct = f" ({100 * floor_us / us:.0f}%)" if floor_us and us > 0 else ""
    return f"{us:.1f}{pct}"


def _k(r) -> str:
    if "error" in r:
        return "-"
    return "n/a" if r.get("kernels") is None else str(r["kernels"])


def acceptance(vs, env) -> tuple:
    rs = [v.results.get("pyfuser", {}) for v in vs]
    if any("us" not in r for r in rs):
        return False, "FAIL: pyfuser did not run every form (see the table)"
    ks = [r["kernels"] if r["kernels"] is not None else r["self_kernels"] for r in rs]
    one = all(k == 1 for k in ks) and all(r["groups"] == 1 and r["eager_groups"] == 0 for r in rs)
    us = [r["us"] for r in rs]
    spread = (max(us) - min(us)) / min(us)
    src = "profiler" if env.dev == "cuda" else "last_run"
    text = (f"pyfuser kernels per call ({src}): {' / '.join(map(str, ks))}; medians "
            f"{' / '.join(f'{u:.1f}' for u in us)} µs, spread {100 * spread:.1f}%")
    if env.dry:
        return one, ("dry run (speed not judged): " if one else "FAIL: ") + text
    ok = one and spread <= SPREAD_OK
    return ok, ("PASS: " if ok else "FAIL: ") + text + f" (limit {100 * SPREAD_OK:.0f}%)"


def report(vs, env) -> tuple:
    rate = env.rate()
    rows, notes = [], []
    for v in vs:
        floor = v.nbytes / rate * 1e6 if v.nbytes else None
        v.floor_us = floor
        rs = [v.results.get(m, {"error": "not run"}) for m in METHODS]
        mb = v.nbytes / 1e6 if v.nbytes else None
        rows.append([v.name, ("-" if mb is None else f"{mb:.0f}" if mb >= 10 else f"{mb:.3f}"),
                     f"{floor:.1f}" if floor else "-"]
                    + [_time_cell(r, floor) for r in rs]
                    + [" / ".join(_k(r) for r in rs)])
        for n in v.notes:
            notes.append(f"- {v.name}: {n}")
        for m, r in zip(METHODS, rs):
            if r.get("note"):
                notes.append(f"- {v.name}, {TITLES[m]}: {r['note']}")
    plot_rows = []
    for v in vs:
        pct = {}
        for m, col in (("eager", "eager"), ("compile", "torch.compile"), ("pyfuser", "pyfuser")):
            r = v.results.get(m, {})
            pct[col] = round(100 * v.floor_us / r["us"], 1) \
                if v.floor_us and r.get("us", 0) > 0 else None
        plot_rows.append({"workload": v.name, **pct})
    common.save_plot("bench_graphs_dry_run" if env.dry else "bench_graphs",
                     f"{env.device_name()}, bench/graphs.py: % of the copy rate", plot_rows)
    ok, verdict = acceptance(vs, env)
    shape = "x".join(map(str, vs[0].inputs[0].shape)) if vs and vs[0].inputs else "?"
    md = [f"## Seed 000 graph forms on {env.device_name()}", "",
          f"torch {torch.__version__}; inputs {shape} (int64, int64, int32; integers 1..100); "
          f"copy rate (device-to-device, read+write bytes): {rate / 1e12:.3f} TB/s. Times are "
          "medians per call in µs" + (" (perf_counter, dry run on the CPU)" if env.dry else
                                      " (do_bench, L2 flushed)")
          + "; in parentheses the % of the copy rate reached (copy floor / time). Kernels per "
          "call: torch.profiler CUDA kernels (memcpy/memset excluded)"
          + ("; n/a on the CPU" if env.dry else "") + ".", "",
          common.markdown(rows, ["form", "MB moved", "copy floor µs", "pyfuser µs (%)",
                                 "eager runner µs (%)", "TorchScript µs (%)",
                                 "torch.compile µs (%)", "kernels pyf/eager/TS/compile"]),
          "", f"**Acceptance** (one kernel per form, same speed): {verdict}", ""]
    if notes:
        md += ["### Notes", ""] + notes + [""]
    md.append(f"Total run time: {env.elapsed():.1f} s.")
    return "\n".join(md) + "\n", ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="build and check everything on the CPU at small sizes")
    p.add_argument("--size", type=int, default=64, help="size cap of the dry run (default 64)")
    p.add_argument("--budget", type=float, default=85.0,
                   help="seconds; columns that would start later are skipped (default 85)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("bench/graphs.py: no CUDA device; use --dry-run to check it on the CPU",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    env = Env(args.dry_run, args.size, args.budget)
    vs = variants()
    text, ok, failed = "", False, False
    try:
        try:
            print(f"device: {env.device_name()}; copy rate {env.rate() / 1e12:.3f} TB/s", flush=True)
        except Exception as e:  # noqa: BLE001 - report() tries again and shows the error
            print(f"copy rate: error: {_short(e)}")
        shared = prepare(vs, env)
        before = {k: _checksums(xs) for k, xs in shared.items()}
        run_all(vs, env)
        for k, xs in shared.items():
            if _checksums(xs) != before[k]:
                vs[0].notes.append("an input tensor CHANGED during the run (a column mutated it)")
                failed = True
        try:
            text, ok = report(vs, env)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            text = f"## Seed 000 graph forms\n\nreport failed: {_short(e)}\n"
    except Exception as e:  # noqa: BLE001 - always print something
        traceback.print_exc()
        text = f"## Seed 000 graph forms\n\nbenchmark failed: {_short(e)}\n"
    for v in vs:
        for m in ("pyfuser", "eager"):
            if "error" in v.results.get(m, {"error": ""}):
                failed = True
    print("\n" + text)
    if os.environ.get("OUT"):
        name = "bench_graphs_dry_run.md" if args.dry_run else "bench_graphs.md"
        try:
            os.makedirs(os.environ["OUT"], exist_ok=True)
            with open(os.path.join(os.environ["OUT"], name), "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as e:
            print(f"cannot write {name}: {e}", file=sys.stderr)
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
