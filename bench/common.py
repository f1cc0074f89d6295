"""Timing helpers for the benchmarks (GPU only).

- `bench_us(fn, flush=)`: median time of one call in microseconds, L2 flushed before each call.
  flush="write" (the default, the issues' method): triton.testing.do_bench, whose flush zeroes a
  256 MB buffer, so the timed call starts with L2 full of dirty lines it must write back (up to
  the L2 size of extra DRAM writes: several µs, a large share of a 20-50 µs kernel). flush="read":
  CUDA events after a flush that reads 512 MB, so L2 starts clean.
- `steady_us(fns)`: time per call of back-to-back calls (no flush) rotating over input sets that
  together exceed several times L2, queued behind a sleep kernel so host time is hidden: the
  throughput of a stream of such kernels, where each pays its predecessor's write-backs.
- `time_methods(fn, inputs, sets)`: {method: µs} for METHODS ("write", "read", "steady");
  `copy_methods(nbytes)`: the same for a plain copy of nbytes.
- `copy_rate()`: device-to-device copy bandwidth in bytes/s (read + write bytes), measured once.
- `count_kernels(fn)`: CUDA kernels one call launches, from torch.profiler (memcpy/memset excluded).
- `host_us_per_call(fn)`: host (CPU) time of one cached call: rounds of 128 calls issued while
  the GPU is kept busy, median.
- `markdown(rows, headers)`: a markdown table.
- `load_module_from_path(name, path)`: a Python file loaded by its path (the tests use it too);
  `load_test_module(name)`: tests/cpu/<name>.py that way.
- `save_plot(name, title, rows)`: with $OUT set, `$OUT/<name>.json` (the rows) and
  `$OUT/<name>.svg`, a plot of % of the copy rate per workload for eager, torch.compile and
  pyfuser (bench/plot.py; `python bench/plot.py $OUT/<name>.json -o x.png` redraws it).
"""
from __future__ import annotations

import collections
import functools
import json
import os
import statistics
import time

import torch



def load_module_from_path(name: str, path: str | os.PathLike, *, fresh: bool = False,
                          register: bool = True):
    """The Python file at `path` run as a module named `name`, for files not importable by name
    (the benchmarks, the tests' case files, a test file used from another one). `path` is used as
    given (it becomes the module's `__file__`).

    By default once per process: `sys.modules[name]` when it is there (whatever file it came
    from), else the file runs with its module put in `sys.modules[name]` first (dataclasses,
    pickle and torch.compile look a module up there). `fresh=True` runs the file again on every
    call and returns the new module: with `register=True` it replaces `sys.modules[name]`, with
    `register=False` sys.modules is neither read nor written (a private copy; a plain
    `import name` elsewhere still loads its own). Errors of the file propagate; a registered
    module stays in sys.modules as far as it ran."""
    import importlib.util
    import sys
    if not fresh:
        if not register:
            raise ValueError("a module loaded once per process is kept in sys.modules: "
                             "register=False needs fresh=True")
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_test_module(name: str):
    """tests/cpu/<name>.py loaded by path (the fuzzers' and the training corpus's code), once
    per process; tests/cpu goes on sys.path for its own imports (model_corpus)."""
    import sys
    if name in sys.modules:
        return sys.modules[name]
    cpu = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "cpu")
    if cpu not in sys.path:
        sys.path.insert(0, cpu)
    return load_module_from_path(name, os.path.join(cpu, name + ".py"))


def bench_us(fn, warmup_ms: float = 25, rep_ms: float = 100, flush: str = "write") -> float:
    fn()
    torch.cuda.synchronize()
    if flush == "read":
        return _events_us(fn, rep_ms, _read_flush)
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3
    except ImportError:
        return _events_us(fn, rep_ms)


@functools.lru_cache(maxsize=None)
def _flush_buffer(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes // 4, dtype=torch.int32, device="cuda")


def _write_flush() -> None:
    _flush_buffer(256 << 20).zero_()


def _read_flush() -> None:
    torch.amax(_flush_buffer(512 << 20))


METHODS = ("write", "read", "steady")


def time_methods(fn, inputs, sets) -> dict:
    """{method: µs per call}: fn(*inputs) with each flush, and fn(*s) back to back over `sets`
    (input lists, together several times L2: see input_sets)."""
    out = {m: bench_us(lambda: fn(*inputs), flush=m) for m in ("write", "read")}
    out["steady"] = steady_us([lambda s=s: fn(*s) for s in sets])
    return out


def copy_methods(nbytes: int) -> dict:
    """{method: µs} of a plain copy moving nbytes (same_size_copy_us), for each of METHODS."""
    return {m: same_size_copy_us(nbytes, m) for m in METHODS}


def _events_us(fn, rep_ms: float, flush=_write_flush) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    n = max(5, min(1000, int(rep_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(n):
        flush()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1e3


def steady_us(fns, calls: int = 48, rounds: int = 5) -> float:
    """Median over `rounds` of (GPU time of `calls` back-to-back calls) / calls, cycling through
    `fns` (one callable per input set; their data should exceed L2 several times). A sleep kernel
    queued first keeps the GPU busy while the host enqueues, so host overhead stays hidden; what
    the last len(fns) + 1 calls return is kept, so an output's memory is reused only after at
    least a whole rotation of input sets has gone through L2."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        keep = collections.deque(maxlen=len(fns) + 1)
        torch.cuda._sleep(20_000_000)          # ~10 ms at 2 GHz: longer than enqueueing `calls`
        start.record()
        for k in range(calls):
            keep.append(fns[k % len(fns)]())
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
        del keep
    return statistics.median(times) * 1e3


def input_sets(make, footprint_bytes: int, l2_bytes: int | None = None) -> list:
    """Enough independent results of make() (input lists) that together they are >= 4x L2."""
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    n = max(2, -(-4 * l2_bytes // max(footprint_bytes, 1)))
    return [make() for _ in range(n)]


def same_size_copy_us(nbytes: int, flush: str = "write") -> float:
    """Time of one float32 dst.copy_(src) moving `nbytes` (read + write). Small transfers do not
    reach the large-copy rate (launch, ramp-up, tail), so at a case's size this is the practical
    floor."""
    src = torch.randn(max(nbytes // 8, 1), device="cuda")
    dst = torch.empty_like(src)
    if flush == "steady":
        pairs = input_sets(lambda: (torch.randn_like(src), torch.empty_like(src)), nbytes)
        return steady_us([lambda d=d, s=s: d.copy_(s) for s, d in pairs])
    return bench_us(lambda: dst.copy_(src), flush=flush)


@functools.lru_cache(maxsize=None)
def copy_rate(flush: str = "write") -> float:
    """Bytes moved per second by a large (1 GiB source) copy, counting reads and writes, timed
    with `flush` ("write", "read" or "steady")."""
    nbytes = 2 << 30
    return nbytes / (same_size_copy_us(nbytes, flush) * 1e-6)


def compile_static(fn):
    """torch.compile of fn specialised to the shapes it is first called with.

    Dynamo caches by code object: calling one function at a second shape recompiles it with
    dynamic shapes, which is slower than what torch.compile gives a program that sees one shape.
    A reset before each compile and dynamic=False give every benchmark row its static kernels."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def count_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    n = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.lower()
            if not (name.startswith("memcpy") or name.startswith("memset")):
                n += 1
    return n


def host_us_per_call(fn, n: int = 128, rounds: int = 15) -> float:
    """CPU time of one call (µs): the median over `rounds` of n back-to-back calls, each round
    issued while a sleep kernel keeps the GPU busy. The calls only enqueue work, and n stays well
    under the launch queue's depth, so the figure is host time alone whatever the GPU is doing.
    (Rounds of 2000 calls on an idle GPU, the method before, gave the same figures on an H200
    host, 2026-11-22.)"""
    return host_us_interleaved({"fn": fn}, n, rounds)["fn"]


def host_us_interleaved(paths: dict, n: int = 128, rounds: int = 21) -> dict:
    """{name: CPU µs per call} for several paths timed as host_us_per_call does, but in turns:
    each round times every path once (n calls behind one sleep kernel each), the order rotating
    from round to round; the median round per path. Paths compared in one table are then
    exposed to the same drift of the host."""
    names = list(paths)
    for fn in paths.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            fn = paths[k]
            torch.cuda._sleep(40_000_000)     # ~20 ms at 2 GHz: longer than the n calls take
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[k].append(time.perf_counter() - t0)
            torch.cuda.synchronize()
    return {k: statistics.median(v) / n * 1e6 for k, v in times.items()}


def markdown(rows, headers) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _plot_module():
    """bench/plot.py, loaded by path (the scripts import this file as `common` or as
    `bench.common`)."""
    # registered (the default): its dataclasses look their module up in sys.modules
    return load_module_from_path("pyfuser_bench_plot",
                                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.py"))


def save_plot(name: str, title: str, rows, out_dir: str | None = None) -> list:
    """Write `<name>.json` and `<name>.svg` into `out_dir` (default $OUT; nothing without
    either). `rows` = [{"workload": str, "eager": %, "torch.compile": %, "pyfuser": %}], a
    series missing or None where it did not run. Returns the paths written; a plot that
    cannot be drawn (no matplotlib) is reported, never fatal: the tables are the record."""
    out_dir = out_dir or os.environ.get("OUT")
    if not out_dir or not rows:
        return []
    plot = _plot_module()
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump({"title": title, "series": list(plot.SERIES), "rows": rows}, f, indent=1)
    written = [base + ".json"]
    try:
        written.append(plot.plot(rows, base + ".svg", title))
    except Exception as e:  # noqa: BLE001 - the JSON keeps the data; say why there is no plot
        print(f"save_plot: no plot for {name}: {type(e).__name__}: {e}")
    return written
