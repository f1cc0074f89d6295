"""Seed 002 on the GPU: bookend views should cost nothing.

Rows: GELU with bookend views, GELU without views, GELU with a view between its ops (stays in
the kernel), the transpose with bookend views; pyfuser,
torch.compile and a same-size copy each timed three ways (bench/common.py: "write" = do_bench
with its zeroing L2 flush, the issue's method; "read" = L2 flushed by reading; "steady" =
back-to-back calls over rotating inputs), eager with the first, with achieved bandwidth as % of
that method's large-copy rate; also pyfuser's kernel time alone (profiler, L2 flushed) and its
host time per cached call (CPU time, GPU not awaited). Prints a markdown table; writes it to
$OUT/bench_views.md when OUT is set. Targets: GELU views vs no views within 3%, GELU >= 92% of
copy bandwidth, transpose >= 80%.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import (METHODS, bench_us, compile_static, copy_methods, copy_rate,  # noqa: E402
                          host_us_per_call, input_sets, load_module_from_path, markdown,
                          save_plot, time_methods)
from pyfuser.progress import track  # noqa: E402

# registered: torch.compile imports the module its functions live in
C = load_module_from_path("segment_cases", os.path.join(
    os.path.dirname(__file__), "..", "tests", "cpu", "segment_cases.py"), fresh=True)


def _compiled(fn):
    try:
        return compile_static(fn)
    except Exception:  # noqa: BLE001 - torch.compile may be unavailable
        return None


def _kernel_us(fn, n: int = 10) -> float:
    """GPU time of pyfuser's kernels (pf_*) per call, from torch.profiler, with L2 flushed before
    each call as bench_us does (a warm-L2 figure would flatter kernels whose data fits in L2)."""
    try:
        import torch.profiler as P
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        fn()
        torch.cuda.synchronize()
        with P.profile(activities=[P.ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        return sum(e.device_time_total for e in prof.key_averages() if e.key.startswith("pf_")) / n
    except Exception:  # noqa: BLE001 - profiler optional
        return float("nan")


def main() -> None:
    torch.manual_seed(0)
    rates = {m: copy_rate(m) for m in METHODS}
    x = torch.randn(8192, 3072, device="cuda")
    x3 = x.view(64, 128, 3072).clone()
    xt = torch.randn(768, 128, 64, device="cuda")
    cases = [
        ("gelu + bookend views", C.gelu(C.FULL_GELU), [x],
         lambda t: C.gelu_eager(t, C.FULL_GELU), lambda: [torch.randn_like(x)]),
        ("gelu, no views", C.gelu(C.FULL_GELU, views=False), [x3],
         lambda t: C.gelu_eager(t, views=False), lambda: [torch.randn_like(x3)]),
        ("gelu, view between ops", C.gelu_mid_view(C.FULL_GELU), [x],
         lambda t: C.gelu_mid_view_eager(t, C.FULL_GELU), lambda: [torch.randn_like(x)]),
        ("transpose + bookend views", C.transpose(C.FULL_TR), [xt],
         lambda t: C.transpose_eager(t, C.FULL_TR), lambda: [torch.randn_like(xt)]),
    ]
    rows, results, plot_rows = [], {}, []
    for name, fs, ins, eager, make in track(cases, "views", name=lambda c: c[0]):
        out = fs.execute(ins)[-1]
        torch.testing.assert_close(out, eager(*ins))
        nbytes = 2 * ins[0].nbytes
        sets = input_sets(make, ins[0].nbytes)
        comp = _compiled(eager)
        us = time_methods(lambda *a: fs.execute(list(a)), ins, sets)
        comp_us = time_methods(comp, ins, sets) if comp is not None else \
            {m: float("nan") for m in METHODS}
        copy_us = copy_methods(nbytes)
        pct = {m: 100 * nbytes / (us[m] * 1e-6) / rates[m] for m in METHODS}
        results[name] = (us, pct)
        eager_us = bench_us(lambda: eager(*ins))
        gpu_us = _kernel_us(lambda: fs.execute(ins))
        host_us = host_us_per_call(lambda: fs.execute(ins))
        rate_pct = lambda t: round(100 * nbytes / (t * 1e-6) / rates["write"], 1) \
            if t == t and t > 0 else None  # noqa: E731
        plot_rows.append({"workload": name, "eager": rate_pct(eager_us),
                          "torch.compile": rate_pct(comp_us["write"]),
                          "pyfuser": round(pct["write"], 1)})

        def trio(d, fmt="{:.1f}"):
            return " / ".join(fmt.format(d[m]) for m in METHODS)
        rows.append([name, trio(us), trio(pct, "{:.0f}%"), trio(copy_us), trio(comp_us),
                     f"{eager_us:.1f}", f"{gpu_us:.1f}", f"{host_us:.1f}",
                     str(fs.last_run.kernels), str(fs.last_run.host_segments)])
    ratio = {m: results["gelu + bookend views"][0][m] / results["gelu, no views"][0][m]
             for m in METHODS}
    mid = {m: results["gelu, view between ops"][0][m] / results["gelu, no views"][0][m]
           for m in METHODS}
    table = markdown(rows, ["case", "pyfuser µs (write / read / steady)",
                            "% of copy rate (w / r / s)", "same-size copy µs (w / r / s)",
                            "torch.compile µs (w / r / s)", "eager µs (write)",
                            "its kernels µs (profiler, write flush)", "host µs / call",
                            "kernels", "host segments"])
    text = (f"{table}\n\nlarge-copy rate: " +
            ", ".join(f"{m} {rates[m] / 1e9:.0f} GB/s" for m in METHODS) +
            "; gelu views / no views = " + " / ".join(f"{ratio[m]:.3f}" for m in METHODS) +
            " (target <= 1.03); view between ops / no views = " +
            " / ".join(f"{mid[m]:.3f}" for m in METHODS) +
            "; targets: gelu >= 92%, transpose >= 80% of the copy rate. write: "
            "do_bench, L2 flushed by zeroing (the issue's method); read: L2 flushed by reading; "
            "steady: back-to-back over rotating inputs (bench/common.py)\n")
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_views.md"), "w") as f:
            f.write(text)
    save_plot("bench_views", f"{torch.cuda.get_device_name()}, bench/views.py, write: "
              "% of the copy rate", plot_rows)


if __name__ == "__main__":
    main()
