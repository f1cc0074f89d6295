"""Sweeps of scheduler knobs x timing methods: which defaults to pick, and how much of a small
kernel's time is the benchmark's L2 flush rather than the kernel.

    PYTHONPATH=. python3 bench/sweep.py [SET ...]   # $OUT/bench_sweep.md if OUT is set

Sets (default: all): `cache` - load/store cache policies (schedule/cache_policy.py) on the
pointwise cases of bench/pointwise.py (seed 000 left out: 3.6 GB, DRAM-bound) and seed 002's
transpose; `bn` - 1-D / 2-D, block and unroll on the batch-norm graph; `copy` - pyfuser's copy
kernel (`set`) against torch's copy_ at the batch-norm graph's and GELU's byte counts; `1d` -
block and unroll of the 1-D schedule on GELU and SiLU-mul; `2d` - the 2-D schedule's block on the
batch-norm graph and the broadcast add; `outer` - splits, block and unroll of the outer
reduction on bfloat16 bias-gradient column sums (GPT-2's backward: 4096 rows of 768-3072).
Each variant (environment knobs, read when a new Fusion is planned) is timed three ways
(bench/common.py):
  write  - do_bench, L2 flushed by zeroing 256 MB before each call (the issues' method)
  read   - CUDA events, L2 flushed by reading 512 MB before each call (L2 starts clean)
  steady - back-to-back calls over rotating input sets (>= 4x L2), no flush
with eager, torch.compile and a plain copy of the same bytes timed the same three ways. Every
variant's result is checked against eager first.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pointwise as PWB  # noqa: E402
from common import METHODS, compile_static, copy_methods, copy_rate, input_sets, load_module_from_path, markdown, time_methods  # noqa: E402

_CACHE = [(f"{ld}/{st}", {"PYFUSER_LOAD_CACHE": ld, "PYFUSER_STORE_CACHE": st})
          for ld, st in (("plain", "plain"), ("cs", "plain"), ("ef", "plain"), ("plain", "cs"),
                         ("ef", "el"), ("cs", "cs"), ("ef", "ef"))]
_BN = [("default (2d b128)", {}), ("1d b128 u2", {"PYFUSER_PW_KIND": "1d"}),
       ("1d b128 u1", {"PYFUSER_PW_KIND": "1d", "PYFUSER_PW_UNROLL": "1"}),
       ("1d b256 u2", {"PYFUSER_PW_KIND": "1d", "PYFUSER_PW_BLOCK": "256"}),
       ("1d b128 u4", {"PYFUSER_PW_KIND": "1d", "PYFUSER_PW_UNROLL": "4"}),
       ("2d b64", {"PYFUSER_PW_KIND": "2d", "PYFUSER_PW_BLOCK": "64"}),
       ("2d b64 u2", {"PYFUSER_PW_KIND": "2d", "PYFUSER_PW_BLOCK": "64", "PYFUSER_PW_UNROLL": "2"}),
       ("2d b128 u2", {"PYFUSER_PW_KIND": "2d", "PYFUSER_PW_BLOCK": "128", "PYFUSER_PW_UNROLL": "2"}),
       ("2d b256", {"PYFUSER_PW_KIND": "2d", "PYFUSER_PW_BLOCK": "256"}),
       ("2d b128 ld ef", {"PYFUSER_PW_KIND": "2d", "PYFUSER_LOAD_CACHE": "ef"})]
_COPY = [("pf b128 u2", {}), ("pf b128 u1", {"PYFUSER_PW_UNROLL": "1"}),
         ("pf b128 u4", {"PYFUSER_PW_UNROLL": "4"}), ("pf b256 u2", {"PYFUSER_PW_BLOCK": "256"}),
         ("pf b512 u1", {"PYFUSER_PW_BLOCK": "512", "PYFUSER_PW_UNROLL": "1"}),
         ("pf b128 u8", {"PYFUSER_PW_UNROLL": "8"})]
_ONE_D = [("b128 u2", {}), ("b128 u1", {"PYFUSER_PW_UNROLL": "1"}),
          ("b128 u4", {"PYFUSER_PW_UNROLL": "4"}), ("b256 u1", {"PYFUSER_PW_BLOCK": "256",
                                                               "PYFUSER_PW_UNROLL": "1"}),
          ("b256 u2", {"PYFUSER_PW_BLOCK": "256"}), ("b64 u2", {"PYFUSER_PW_BLOCK": "64"})]
_TWO_D = [("2d default", {}), ("2d b64", {"PYFUSER_PW_BLOCK": "64"}),
          ("2d b128", {"PYFUSER_PW_BLOCK": "128"}), ("2d b256", {"PYFUSER_PW_BLOCK": "256"}),
          ("2d b512", {"PYFUSER_PW_BLOCK": "512"})]
_OUTER = [("default", {})] + [(f"splits {n}", {"PYFUSER_RED_SPLITS": str(n)})
                               for n in (16, 64, 96, 128)] + \
         [("bdimx 16", {"PYFUSER_RED_BDIMX": "16"}), ("bdimy 16", {"PYFUSER_RED_BDIMY": "16"}),
          ("unroll 2", {"PYFUSER_RED_UNROLL": "2"}), ("unroll 8", {"PYFUSER_RED_UNROLL": "8"})]
KNOBS = sorted({k for _, env in _CACHE + _BN + _COPY + _ONE_D + _TWO_D + _OUTER for k in env})


def _segment_cases():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "cpu", "segment_cases.py")
    return load_module_from_path("segment_cases", path, fresh=True)


def _def_copy():
    fs = PWB.Fusion()
    with PWB.FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=PWB.DataType.Float)
        fd.add_output(fd.ops.set(x))
    return fs


def _copy_case(mb: int):
    n = mb * 1000 * 1000 // 8
    return (f"copy f32 {mb} MB moved", _def_copy, lambda x: x.clone(),
            lambda: [torch.randn(n, device="cuda")], {})


def _def_column_sum():
    """A bfloat16 bias gradient: the float32 sum over the rows, cast back (GPT-2's backward)."""
    fs = PWB.Fusion()
    with PWB.FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True],
                             dtype=PWB.DataType.BFloat16)
        s = fd.ops.sum(fd.ops.cast(x, PWB.DataType.Float), [0])
        fd.add_output(fd.ops.cast(s, PWB.DataType.BFloat16))
    return fs


def _column_sum_case(rows: int, cols: int):
    return (f"bias grad sum(0) bf16 {rows}x{cols}", _def_column_sum,
            lambda x: x.float().sum(0).to(torch.bfloat16),
            lambda: [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)],
            {"rtol": 2e-2, "atol": 1e-1})


def _sets():
    """{set name: (cases, variants)}."""
    C = _segment_cases()
    pointwise = [c for c in PWB.CASES if not c[0].startswith("seed000")]
    transpose = ("seed002 transpose + views 768x128x64", lambda: C.transpose(C.FULL_TR),
                 lambda x: C.transpose_eager(x, C.FULL_TR),
                 lambda: [torch.randn(768, 128, 64, device="cuda")], {})
    bn = [c for c in pointwise if "BN" in c[0]]
    one_d = [c for c in pointwise if c[0].startswith(("GELU", "SiLU"))]
    return {"cache": (pointwise + [transpose], _CACHE), "bn": (bn, _BN),
            "copy": ([_copy_case(77), _copy_case(201)], _COPY), "1d": (one_d, _ONE_D),
            "2d": ([c for c in pointwise if c[0].startswith(("seed003", "broadcast"))], _TWO_D),
            "outer": ([_column_sum_case(4096, c) for c in (768, 2304, 3072)] +
                      [_column_sum_case(8192, 3072)], _OUTER)}


def run_case(variants, name, define, eager, make_inputs, tol):
    xs = make_inputs()
    ref = eager(*xs)
    nbytes = sum(t.nbytes for t in xs) + ref.nbytes
    sets = input_sets(make_inputs, nbytes - ref.nbytes)
    row = {"case": name, "MB": nbytes / 1e6, "copy": copy_methods(nbytes),
           "eager": time_methods(eager, xs, sets)}
    compiled = compile_static(eager)
    torch.testing.assert_close(compiled(*xs), ref, **tol)
    row["compile"] = time_methods(compiled, xs, sets)
    for label, env in variants:
        for k in KNOBS:
            os.environ.pop(k, None)
        os.environ.update(env)
        fs = define()
        torch.testing.assert_close(fs.execute(xs)[-1], ref, **tol)
        row[label] = time_methods(lambda *a: fs.execute(list(a)), xs, sets)
    for k in KNOBS:
        os.environ.pop(k, None)
    del xs, sets, ref
    torch.cuda.empty_cache()
    return row


def main() -> int:
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    rates = {m: copy_rate(m) for m in METHODS}
    sets = _sets()
    chosen = [a for a in sys.argv[1:] if a in sets] or list(sets)
    md = [f"## Sweeps x timing methods on {dev}", "",
          "Large-copy rate (1 GiB source, read+write) per method: " +
          ", ".join(f"{m} {rates[m] / 1e12:.2f} TB/s" for m in METHODS) +
          ". Cells: µs per call (% of that method's large-copy rate); 'copy' is torch's copy_ "
          "of the same bytes, the columns after torch.compile are pyfuser variants."]
    from pyfuser.progress import track
    work = [(set_name, case) for set_name in chosen for case in sets[set_name][0]]
    rows_of = {set_name: [] for set_name in chosen}
    for set_name, case in track(work, "sweep", name=lambda w: f"{w[0]}: {w[1][0]}"):
        t0 = time.perf_counter()
        rows_of[set_name].append(run_case(sets[set_name][1], *case))
        print(f"[{set_name}: {case[0]}] {time.perf_counter() - t0:.1f} s", flush=True)
    for set_name in chosen:
        cases, variants = sets[set_name]
        rows = rows_of[set_name]
        cols = ["copy", "eager", "compile"] + [label for label, _ in variants]
        for m in METHODS:
            table = []
            for r in rows:
                floor = r["MB"] * 1e6 / rates[m] * 1e6
                table.append([r["case"], f"{r['MB']:.0f}"] +
                             [f"{r[c][m]:.1f} ({100 * floor / r[c][m]:.0f}%)" for c in cols])
            md += ["", f"### {set_name}, {m}", "", markdown(table, ["case", "MB"] + cols)]
    text = "\n".join(md) + "\n"
    print("\n" + text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_sweep.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
