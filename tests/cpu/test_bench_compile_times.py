"""bench/compile_times.py: compile times measured in fresh processes. One real child process on
the CPU (a one-layer BERT through pyfuser's backend on the kernel interpreter), and the parent's
bookkeeping (alternating order, medians, ratios, errors) with the child replaced."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common import load_module_from_path  # noqa: E402


def _tool():
    return load_module_from_path("bench_compile_times",
                                 os.path.join(ROOT, "bench", "compile_times.py"),
                                 fresh=True, register=False)


def test_a_cold_compile_in_a_child_process_writes_the_table(tmp_path):
    tool = _tool()
    rc = tool.main(["--dry-run", "--models", "bert", "--size", "2,8,32,1", "--no-warm",
                    "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_compile_times.json").read_text())
    (row,) = data["rows"]
    assert (row["model"], row["mode"]) == ("bert", "pyfuser") and "error" not in row
    assert row["cold_s"] > 0 and 0 < row["cpu_s"] and "warm_s" not in row
    assert data["facts"]["device"] == "cpu"
    assert "| bert | float32 | pyfuser | " in (tmp_path / "bench_compile_times.md").read_text()


def test_modes_alternate_and_cells_take_medians(monkeypatch):
    tool = _tool()
    calls = []
    times = {"inductor": iter([30.0, 3.0, 20.0, 2.0, 25.0, 4.0]),
             "pyfuser": iter([6.0, 0.5, 9.0, 0.4, 7.0, 0.6])}

    def fake(model, dtype, mode, caches, args):
        calls.append(mode)
        assert os.path.isdir(caches)
        return {"seconds": next(times[mode]), "cpu_s": 1.0, "device": "X", "torch": "t"}

    monkeypatch.setattr(tool, "run_child", fake)
    args = tool.parse_args(["--reps", "3"])
    rows, facts = tool.measure(args, ["m"], ["float32"], ["inductor", "pyfuser"])
    # cold then warm per mode; the order of the modes flips each repetition
    assert calls == ["inductor"] * 2 + ["pyfuser"] * 4 + ["inductor"] * 4 + ["pyfuser"] * 2
    ind, pf = rows
    assert ind["cold_s"] == 25.0 and ind["warm_s"] == 3.0 and ind["cold_s_all"] == [30, 20, 25]
    assert pf["cold_s"] == 7.0 and pf["warm_s"] == 0.5 and facts["device"] == "X"
    (line,) = tool.ratios(rows)
    assert "cold 0.28" in line and "warm 0.17" in line


def test_a_failed_child_is_an_error_in_its_row(monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool, "run_child", lambda *a: {"error": "exit 1: boom"})
    rows, _ = tool.measure(tool.parse_args(["--no-warm"]), ["m"], ["float32"], ["pyfuser"])
    assert rows[0]["error"] == "exit 1: boom" and "cold_s" not in rows[0]
    assert "boom" in tool.table(rows)
