"""bench/models.py's CPU smoke mode (--dry-run): a tiny Llama through eager and pyfuser's
torch.compile backend on the kernel interpreter, every step of a GPU run taken (cold and warm
compile, the check against eager, timings, the table, JSON and plot), so the GPU run does not
fail on something a CPU could have caught."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common import load_module_from_path  # noqa: E402


def _bench():
    return load_module_from_path("bench_models", os.path.join(ROOT, "bench", "models.py"),
                                 fresh=True, register=False)


@pytest.fixture
def bench(monkeypatch):
    m = _bench()
    for var in m.CACHE_VARS:          # the run points them at its own directories: put them back
        monkeypatch.setenv(var, os.environ.get(var, ""))
    yield m
    import torch
    torch._dynamo.reset()


def test_dry_run_writes_table_json_and_plot(bench, tmp_path):
    rc = bench.main(["--dry-run", "--models", "llama", "--size", "2,8,32,1", "--reps", "1",
                     "--warmup", "0", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_models.json").read_text())
    rows = {r["mode"]: r for r in data["rows"]}
    assert set(rows) == {"eager", "pyfuser"} and data["facts"]["layers"] == 1
    for r in rows.values():
        assert "error" not in r and r["fwd_ms"] > 0 and r["train_ms"] > 0
        assert r["check"].startswith("fwd ")
    pf = rows["pyfuser"]
    assert pf["cold_s"] > 0 and pf["warm_s"] > 0
    assert pf["trace_s"] > 0 and pf["trace_warm_s"] > 0       # the aot_eager baseline
    assert re.fullmatch(r"\d+i\+\d+f\+\d+b", pf["regions"]), pf["regions"]
    md = (tmp_path / "bench_models.md").read_text()
    assert "| llama | float32 | pyfuser |" in md
    assert "Compile time" in md and "- llama float32: cold " in md
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "bench_models_speed.svg").stat().st_size > 0


def test_ratios_and_speed_rows_compare_with_inductor_and_eager(bench):
    from bench.models_report import ratios, speed_rows
    rows = [{"model": "m", "dtype": "float32", "mode": "eager", "fwd_ms": 4.0, "train_ms": 9.0},
            {"model": "m", "dtype": "float32", "mode": "inductor", "fwd_ms": 2.0, "train_ms": 6.0,
             "cold_s": 30.0},
            {"model": "m", "dtype": "float32", "mode": "pyfuser", "fwd_ms": 1.0, "train_ms": 9.0,
             "cold_s": 10.0}]
    assert ratios(rows) == "- m float32: pyfuser / inductor fwd_ms 0.50, train_ms 1.50, " \
                                 "cold_s 0.33"
    speed = speed_rows(rows)
    assert [r["workload"] for r in speed] == ["m float32 fwd", "m float32 train"]
    assert speed[0] == {"workload": "m float32 fwd", "eager": 100.0, "torch.compile": 200.0,
                        "pyfuser": 400.0}
    assert speed[1]["pyfuser"] == 100.0
    cg = [dict(r, mode=r["mode"] + "-cg") for r in rows[1:]]
    assert ratios(rows + cg).splitlines()[1] == \
        "- m float32: pyfuser-cg / inductor-cg fwd_ms 0.50, train_ms 1.50, cold_s 0.33"
    assert speed_rows(rows + cg)[0]["pyfuser (CUDA graphs)"] == 400.0


def test_compile_summary_states_the_targets_whole_and_without_tracing(bench):
    from bench.models_report import compile_summary
    rows = [{"model": "m", "dtype": "float32", "mode": "inductor", "cold_s": 30.0, "warm_s": 5.0,
             "trace_s": 6.0, "trace_warm_s": 4.0},
            {"model": "m", "dtype": "float32", "mode": "pyfuser", "cold_s": 9.0, "warm_s": 4.5,
             "trace_s": 6.0, "trace_warm_s": 4.0}]
    text = compile_summary(rows)
    assert text == ("- m float32: cold 9.00 s vs Inductor 30.00 s = 0.30 (meets the target 0.33); "
                    "backend's own (minus aot_eager's 6.00 s) 3.00 s vs Inductor 24.00 s = 0.12; "
                    "warm 4.50 s vs Inductor 5.00 s = 0.90 (misses the target 0.10); backend's "
                    "own (minus aot_eager's 4.00 s) 0.50 s vs Inductor 1.00 s = 0.50")


def test_rounds_time_the_modes_interleaved(bench, tmp_path):
    """--rounds: after the blocked rows, the modes are timed again in alternation; the columns
    come from there, the blocked medians and each mode's spread over the rounds are kept."""
    rc = bench.main(["--dry-run", "--models", "llama", "--size", "2,8,32,1", "--reps", "2",
                     "--warmup", "0", "--no-compile-times", "--no-trace-baseline",
                     "--rounds", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_models.json").read_text())
    assert data["facts"]["rounds"] == 2
    for r in data["rows"]:
        assert "error" not in r and "rounds_error" not in r
        for step in ("fwd", "train"):
            assert r[f"{step}_ms"] > 0 and r[f"{step}_ms_block"] > 0
            lo, hi = (float(v) for v in r[f"{step}_spread"].split("-"))
            assert 0 < lo <= hi
    assert "(interleaved in 2 rounds)" in (tmp_path / "bench_models.md").read_text()


def test_interleaved_times_rotate_the_order_and_take_every_mode(bench):
    from bench.models_timing import interleaved_times
    calls = []

    class FakeCase:
        def make(self, mode):
            return mode, mode, None

        def forward(self, model, fn):
            calls.append(("fwd", model))

        def train_step(self, model, fn, opt):
            calls.append(("train", model))
    got = interleaved_times(FakeCase(), ["a", "b", "c"], 3, 6, "cpu")
    assert set(got) == {"a", "b", "c"}
    timed = [m for s, m in calls[6:] if s == "fwd"]      # after each mode's warm-up calls
    firsts = [timed[i] for i in range(0, len(timed), 3 * 3)]   # 2 calls + 1 warm-up per block
    assert firsts == ["a", "b", "c"]                      # each round starts with another mode
    assert all(v["fwd_ms"] >= 0 and "-" in v["train_spread"] for v in got.values())
