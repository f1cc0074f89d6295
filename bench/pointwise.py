"""Pointwise benchmark: pyfuser vs eager vs torch.compile vs the copy-bandwidth floor (one GPU).

    PYTHONPATH=. python3 bench/pointwise.py            # writes $OUT/bench_pointwise.md if OUT is set
    PYTHONPATH=. python3 bench/pointwise.py --host-only   # just the host overhead per cached call

Per case and timing method (bench/common.py: "write" = do_bench with its L2 flush by zeroing,
the issues' method; "read" = L2 flushed by reading, so it starts clean; "steady" = back-to-back
calls over rotating inputs): median time per call, % of the measured device-to-device copy rate
(bytes that must move / time, over that method's large-copy rate), pyfuser/torch.compile time
ratio (< 1: pyfuser faster), CUDA kernels per call (torch.profiler). Then: cold compile time (disk cache
off, first call of a new fusion), warm start from a hot disk cache (new fusion object, so new
executor), and host overhead per cached call of a tiny 3-input fusion. Every pyfuser result is
checked against eager before it is timed; a wrong result aborts that case with a message.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (METHODS, compile_static, copy_methods, copy_rate, count_kernels,  # noqa: E402
                    host_us_interleaved, host_us_per_call, input_sets, markdown, save_plot,
                    time_methods)

from pyfuser import DataType, Fusion, FusionDefinition  # noqa: E402
from pyfuser.runtime import dispatch  # noqa: E402
from pyfuser.progress import track  # noqa: E402
from pyfuser.runtime.dispatch import get_executor as _get_executor  # noqa: E402


def get_executor(fusion, mode="cuda"):
    """The executor of the fusion's single kernel segment (the segmenter may peel views off)."""
    from pyfuser.segment.segmenter import segment
    exs = [_get_executor(s.fusion, mode) for s in segment(fusion).segments if s.kind == "kernel"]
    if len(exs) != 1:
        raise AssertionError(f"expected one kernel segment, got {len(exs)}")
    return exs[0]

F = torch.nn.functional


# ---- the cases: (name, pyfuser definition, eager function, input maker, tolerances) ----------
def def_seed000():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Int)
        b = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Int)
        c = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Int32)
        t = fd.ops.add(fd.ops.cast(a, dtype=DataType.Int32), b)
        fd.add_output(fd.ops.cast(fd.ops.mul(t, c), dtype=DataType.Int))
    return fs


def eager_seed000(a, b, c):
    return ((a.to(torch.int32) + b) * c).to(torch.int64)


def in_seed000():
    r = lambda dt: torch.randint(1, 101, (10000, 13000), device="cuda", dtype=dt)  # noqa: E731
    return [r(torch.int64), r(torch.int64), r(torch.int32)]


def def_gelu():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        e = fd.ops.erf(fd.ops.mul(x, 0.707107))
        fd.add_output(fd.ops.mul(fd.ops.mul(x, 0.5), fd.ops.add(e, 1.0)))
    return fs


def eager_gelu(x):
    return x * 0.5 * (1 + torch.erf(x * 0.707107))


def in_gelu():
    return [torch.randn(8192, 3072, device="cuda")]


BN_SHAPE, EPS, ALPHA = (8, 256, 56, 56), 1e-5, 0.5


def def_bn():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        xs = [fd.define_tensor(symbolic_sizes=[-1] * 4, contiguous=[True] * 4, dtype=DataType.Float)
              for _ in range(2)]
        ps = [fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
              for _ in range(8)]

        def bn(x, mean, var, w, b):
            bc = [fd.ops.broadcast(p, [True, False, True, True]) for p in (mean, var, w, b)]
            inv = fd.ops.rsqrt(fd.ops.add(bc[1], EPS))
            return fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(x, bc[0]), inv), bc[2]), bc[3])

        y = fd.ops.add_alpha(bn(xs[0], *ps[:4]), bn(xs[1], *ps[4:]), ALPHA)
        fd.add_output(fd.ops.relu(y))
    return fs


def eager_bn(x1, x2, m1, v1, w1, b1, m2, v2, w2, b2):
    y1 = F.batch_norm(x1, m1, v1, w1, b1, training=False, eps=EPS)
    y2 = F.batch_norm(x2, m2, v2, w2, b2, training=False, eps=EPS)
    return torch.relu(torch.add(y1, y2, alpha=ALPHA))


def in_bn():
    c = BN_SHAPE[1]
    xs = [torch.randn(BN_SHAPE, device="cuda") for _ in range(2)]
    ps = []
    for _ in range(2):
        ps += [torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5,
               torch.randn(c, device="cuda"), torch.randn(c, device="cuda")]
    return xs + ps


def def_bcast_add():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        b = fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(a, b))
    return fs


def eager_bcast_add(a, b):
    return a + b


def in_bcast_add():
    return [torch.randn(8192, 3072, device="cuda"), torch.randn(3072, device="cuda")]


def def_silu_mul():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.BFloat16)
        b = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.mul(fd.ops.silu(a), b))
    return fs


def eager_silu_mul(a, b):
    return F.silu(a) * b


def in_silu_mul():
    return [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2)]


CASES = [
    ("seed000 int64 10000x13000", def_seed000, eager_seed000, in_seed000, {}),
    ("GELU erf f32 8192x3072", def_gelu, eager_gelu, in_gelu, {"rtol": 1e-5, "atol": 1e-5}),
    ("seed003 2xBN+add+relu 8x256x56x56", def_bn, eager_bn, in_bn, {"rtol": 1e-4, "atol": 1e-4}),
    ("broadcast add 8192x3072+3072", def_bcast_add, eager_bcast_add, in_bcast_add, {}),
    ("SiLU-mul bf16 8192x8192", def_silu_mul, eager_silu_mul, in_silu_mul,
     {"rtol": 1.6e-2, "atol": 1e-2}),
]


def _bytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in list(inputs) + list(outputs))


def _check(name, got, want, tol):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{name}: pyfuser gave {got.dtype} {tuple(got.shape)}, eager "
                             f"{want.dtype} {tuple(want.shape)}")
    torch.testing.assert_close(got, want, **tol)


def run_case(name, define, eager, make_inputs, tol, rates):
    xs = make_inputs()
    fs = define()
    (out,) = fs.execute(xs)
    ref = eager(*xs)
    torch.cuda.synchronize()
    _check(name, out, ref, tol)
    ex = get_executor(fs.ir_fusion, "cuda")
    if ex is None or ex.last_run.get("fallback"):
        raise AssertionError(f"{name}: pyfuser did not run a kernel (fallback to the evaluator)")
    nbytes = _bytes(xs, [out])
    sets = input_sets(make_inputs, _bytes(xs, []))
    row = {"case": name, "MB": nbytes / 1e6,
           "floor": {m: nbytes / rates[m] * 1e6 for m in METHODS},
           "copy_same": copy_methods(nbytes)}
    row["pyfuser"] = time_methods(lambda *a: fs.execute(list(a)), xs, sets)
    row["eager"] = time_methods(eager, xs, sets)
    row["k_pyfuser"] = count_kernels(lambda: fs.execute(xs))
    row["k_eager"] = count_kernels(lambda: eager(*xs))
    try:
        compiled = compile_static(eager)
        got = compiled(*xs)
        torch.cuda.synchronize()
        torch.testing.assert_close(got, ref, **tol)
        row["compile"] = time_methods(compiled, xs, sets)
        row["k_compile"] = count_kernels(lambda: compiled(*xs))
    except Exception as e:  # noqa: BLE001 - report and keep going
        print(f"[{name}] torch.compile failed: {type(e).__name__}: {e}")
        row["compile"], row["k_compile"] = {m: float("nan") for m in METHODS}, "-"
    del xs, out, ref, sets
    torch.cuda.empty_cache()
    return row


def _first_call_ms(fs, xs) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fs.execute(xs)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def compile_times(name, define, make_inputs, tmp):
    """(cold first call ms, NVRTC ms, warm start from disk ms, cached call us)."""
    xs = make_inputs()
    os.environ["PYFUSER_DISABLE_DISK_CACHE"] = "1"
    fs = define()
    cold = _first_call_ms(fs, xs)
    nvrtc_ms = get_executor(fs.ir_fusion, "cuda").last_run["compile_time_s"] * 1e3
    os.environ.pop("PYFUSER_DISABLE_DISK_CACHE")
    os.environ["PYFUSER_CACHE_DIR"] = tmp
    define().execute(xs)                                 # fills the disk cache
    dispatch.clear_caches()
    fs = define()
    warm = _first_call_ms(fs, xs)
    ex = get_executor(fs.ir_fusion, "cuda")
    assert ex.stats["disk_hits"] == 1 and ex.stats["nvrtc"] == 0, ex.stats
    del xs
    torch.cuda.empty_cache()
    return cold, nvrtc_ms, warm


def _mul_add_ts(a, b, c):
    return a + b * c


def _mul_add_fusion(native: bool, xs):
    """a + b * c on three 1-D float32 inputs, run twice on xs with the native runner on or off
    (the choice is made when a fusion's recorded program is first hit; the runner must be built:
    `python -m pyfuser.runtime.native`)."""
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a, b, c = (fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
                   for _ in range(3))
        fd.add_output(fd.ops.add(a, fd.ops.mul(b, c)))
    old = os.environ.get("PYFUSER_NATIVE")
    os.environ["PYFUSER_NATIVE"] = "1" if native else "0"
    try:
        if native:
            from pyfuser.runtime import native as N
            N.build()
        fs.execute(xs)
        fs.execute(xs)
    finally:
        if old is None:
            del os.environ["PYFUSER_NATIVE"]
        else:
            os.environ["PYFUSER_NATIVE"] = old
    return fs


def host_overhead():
    """Rows (path, µs per call). The main paths and the parts are timed interleaved (one round
    of each in turn, rounds rotating), so that drift of the host over the run (seen: up to 1.9x
    between processes on one machine) does not favour one path; the other launch modes after."""
    xs = [torch.randn(1024, device="cuda") for _ in range(3)]
    f = lambda a, b, c: a + b * c  # noqa: E731
    fused = {}
    for native in (True, False):
        fs = fused[native] = _mul_add_fusion(native, xs)
        torch.testing.assert_close(fs.execute(xs)[0], f(*xs))
        assert bool(dispatch.programs(fs.ir_fusion).native) == native, \
            "native runner: " + ("missing" if native else "used")
    ex = get_executor(fused[False].ir_fusion, "cuda")
    torch.testing.assert_close(ex.run(xs)[0], f(*xs))
    (out,) = ex.run(xs)
    preps = [p for e in ex._plans.values() if e.launcher is not None for p in e.launcher._preps]
    ptrs = [x.data_ptr() for x in xs] + [out.data_ptr()]
    x0 = xs[0]
    paths = {"pyfuser Fusion.execute (native runner)": lambda: fused[True].execute(xs),
             "pyfuser Fusion.execute (Python path, PYFUSER_NATIVE=0)":
                 lambda: fused[False].execute(xs),
             "pyfuser FusionExecutor.run (ctypes)": lambda: ex.run(xs)}
    import pyfuser
    jitted = pyfuser.jit(torch.jit.script(_mul_add_ts))
    torch.testing.assert_close(jitted(*xs), f(*xs))
    assert jitted.last_run.kernels == 1, jitted.last_run
    paths["pyfuser.jit of the scripted function (one group)"] = lambda: jitted(*xs)
    try:
        compiled = torch.compile(f)
        torch.testing.assert_close(compiled(*xs), f(*xs))
        paths["torch.compile wrapper"] = lambda: compiled(*xs)
    except Exception as e:  # noqa: BLE001 - report the others anyway
        print(f"[host overhead] torch.compile failed: {type(e).__name__}: {e}")
    paths.update({
        "eager (2 kernels)": lambda: f(*xs),
        "part: key of 3 inputs (dtype, shape, strides, alignment, device)": lambda: ex.key_of(xs),
        "part: output allocation (new_empty_strided)":
            lambda: x0.new_empty_strided((1024,), (1,)),
        "part: prepared launch, fixed pointers (ctypes cuLaunchKernelEx)":
            lambda: preps[-1].go(ptrs),
        "part of that: the bare cuLaunchKernelEx call (ctypes, all arguments prebuilt)":
            _bare_launch(preps[-1]),
        "part of that: torch's current-stream query":
            lambda: torch._C._cuda_getCurrentRawStream(0),
        "scale: one eager op (torch.add)": lambda: torch.add(x0, x0)})
    rows = list(host_us_interleaved(paths).items())
    from pyfuser.runtime.launch import LAUNCH_MODES
    for mode in LAUNCH_MODES[1:]:
        for entry in ex._plans.values():
            if entry.launcher is not None:
                entry.launcher.mode = mode
        torch.testing.assert_close(ex.run(xs)[0], f(*xs))    # every mode passes the right values
        rows.append((f"pyfuser FusionExecutor.run ({mode}; timed alone)",
                     host_us_per_call(lambda: ex.run(xs))))
    return rows


def _bare_launch(prep):
    """libcuda's cuLaunchKernelEx with the config and parameters prep's last launch packed."""
    import ctypes
    import functools
    from pyfuser.runtime import driver
    raw = driver.raw_driver()
    V = ctypes.c_void_p
    return functools.partial(raw.launch_ex, V(ctypes.addressof(prep.buf)), V(prep.fn_int),
                             V(prep.ptrs_addr or None), None)


def host_only() -> int:
    """`--host-only`: just the host-overhead table (writes $OUT/bench_pointwise_host.md)."""
    hrows = [(n, f"{us:.1f}") for n, us in host_overhead()]
    text = "\n".join([f"### Host overhead per cached call on {torch.cuda.get_device_name()} "
                      "(3 inputs x 1024 float32; CPU time of 128 calls issued while the GPU is busy)", "",
                      markdown(hrows, ["path", "µs / call"])]) + "\n"
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_pointwise_host.md"), "w") as f:
            f.write(text)
    return 0


PLOT_SERIES = (("eager", "eager"), ("torch.compile", "compile"), ("pyfuser", "pyfuser"))


def _pct_or_none(us, floor):
    """% of the copy rate of a time (None where it did not run: NaN)."""
    return round(100 * floor / us, 1) if us == us and us > 0 else None


def main() -> int:
    """`--cases A,B`: run only the cases whose name contains A or B (case-insensitive).
    `--host-only`: only the host overhead per cached call."""
    global CASES
    if "--host-only" in sys.argv:
        return host_only()
    if "--cases" in sys.argv:
        want = [w.lower() for w in sys.argv[sys.argv.index("--cases") + 1].split(",") if w]
        CASES = [c for c in CASES if any(w in c[0].lower() for w in want)]
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    rates = {m: copy_rate(m) for m in METHODS}
    print(f"device: {dev}; copy rate (read+write) " +
          ", ".join(f"{m} {r / 1e12:.2f} TB/s" for m, r in rates.items()))
    rows, failures = [], []
    for name, define, eager, make_inputs, tol in track(CASES, "pointwise", name=lambda c: c[0]):
        t0 = time.perf_counter()
        try:
            rows.append(run_case(name, define, eager, make_inputs, tol, rates))
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            traceback.print_exc()
            failures.append(f"{name}: {type(e).__name__}: {e}")
            print(f"[{name}] ABORTED: {e}")
        print(f"[{name}] {time.perf_counter() - t0:.1f} s")
        torch.cuda.empty_cache()

    def pct(us, floor):
        return f"{us:.1f} ({100 * floor / us:.0f}%)" if us == us else "n/a"

    md = [f"## Pointwise benchmark on {dev}", "",
          "Large-copy rate (1 GiB source, read+write bytes) per timing method: " +
          ", ".join(f"{m} {r / 1e12:.2f} TB/s" for m, r in rates.items()) + ". Times are "
          "medians per call in µs; in parentheses the % of that method's large-copy rate; ratio = "
          "pyfuser / torch.compile time (< 1: pyfuser faster). 'same-size copy' is torch's "
          "dst.copy_(src) moving the same bytes. write: do_bench, L2 flushed by zeroing 256 MB "
          "(the issue's method); read: L2 flushed by reading 512 MB; steady: back-to-back calls "
          "over rotating inputs (bench/common.py)."]
    for m in METHODS:
        table = [(r["case"], f"{r['MB']:.0f}", f"{r['floor'][m]:.1f}",
                  pct(r["copy_same"][m], r["floor"][m]), pct(r["pyfuser"][m], r["floor"][m]),
                  pct(r["eager"][m], r["floor"][m]), pct(r["compile"][m], r["floor"][m]),
                  f"{r['pyfuser'][m] / r['compile'][m]:.2f}" if r["compile"][m] == r["compile"][m]
                  else "n/a",
                  f"{r['k_pyfuser']} / {r['k_eager']} / {r['k_compile']}") for r in rows]
        md += ["", f"### {m}", "",
               markdown(table, ["case", "MB moved", "copy floor µs", "same-size copy µs (%)",
                                "pyfuser µs (%)", "eager µs (%)", "torch.compile µs (%)",
                                "pyfuser/compile", "kernels pyf/eager/compile"])]

    for m in METHODS:          # $OUT/bench_pointwise_<method>.svg (+ .json): % of the copy rate
        save_plot(f"bench_pointwise_{m}", f"{dev}, bench/pointwise.py, {m}: % of the copy rate",
                  [{"workload": r["case"], **{col: _pct_or_none(r[key][m], r["floor"][m])
                                              for col, key in PLOT_SERIES}} for r in rows])

    ctimes = []
    tmp = tempfile.mkdtemp(prefix="pyfuser_bench_cache_")
    for name, define, _, make_inputs, _ in track(CASES, "compile times", name=lambda c: c[0]):
        try:
            cold, nv, warm = compile_times(name, define, make_inputs, tmp)
            ctimes.append((name, f"{cold:.0f}", f"{nv:.0f}", f"{warm:.1f}"))
        except Exception as e:  # noqa: BLE001
            failures.append(f"compile time {name}: {type(e).__name__}: {e}")
    md += ["", "### Compile times (first call of a new fusion, incl. scheduling and launch)", "",
           markdown(ctimes, ["case", "cold, disk cache off (ms)", "of which NVRTC (ms)",
                             "warm start from disk cache (ms)"])]
    try:
        hrows = [(n, f"{us:.1f}") for n, us in host_overhead()]
        md += ["", "### Host overhead per cached call (3 inputs x 1024 float32; CPU time of 128 calls "
               "issued while the GPU is busy)", "", markdown(hrows, ["path", "µs / call"])]
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        failures.append(f"host overhead: {type(e).__name__}: {e}")
    if failures:
        md += ["", "### Failures", ""] + [f"- {f}" for f in failures]
    text = "\n".join(md) + "\n"
    print("\n" + text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_pointwise.md"), "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
