"""bench/distributed.py on the CPU: the table of several runs (scaling and loss error computed
across runs, the newest row of a case kept) and a world-of-one dry run end to end."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import load_module_from_path  # noqa: E402

B = load_module_from_path("bench_distributed_under_test", ROOT / "bench" / "distributed.py",
                          fresh=True, register=False)


def _run(path, world, rows, date="2026-01-01"):
    setup = {"world": world, "device": f"{world} x GPU", "torch": "x", "size": [8, 16, 32, 2],
             "steps": 3, "warmup": 1, "date": date}
    path.write_text(json.dumps({"setup": setup, "rows": rows}))


def _row(mode, world, tps, losses, **kw):
    return {"model": "bert", "wrap": "ddp", "mode": mode, "world": world, "dtype": "float32",
            "step_ms": 1.0, "tokens_per_s": tps, "losses": losses, **kw}


def test_report_joins_runs(tmp_path):
    _run(tmp_path / "distributed_w1-20260101-000000.json", 1,
         [_row("eager", 1, 100.0, [2.0, 1.0]), _row("pyfuser", 1, 200.0, [2.0, 1.0])])
    _run(tmp_path / "distributed_w2-20260101-000100.json", 2,
         [_row("eager", 2, 150.0, [4.0, 2.0]), _row("pyfuser", 2, 300.0, [4.0, 2.2],
                                                    compiled=[3, 2], loaded=[2, 3], kernels=5)])
    # a newer world-1 run of pyfuser replaces the first one
    _run(tmp_path / "distributed_w1-20260101-000200.json", 1,
         [_row("pyfuser", 1, 250.0, [2.0, 1.0])])
    text = B.report(str(tmp_path))
    lines = [ln for ln in text.splitlines() if ln.startswith("| bert")]
    assert len(lines) == 4
    header = next(ln for ln in text.splitlines() if ln.startswith("| model"))
    head = [c.strip() for c in header.strip("|").split("|")]
    cells = {(ln.split("|")[3].strip(), ln.split("|")[4].strip()):
             dict(zip(head, [c.strip() for c in ln.strip("|").split("|")])) for ln in lines}
    assert cells[("eager", "2")]["scaling"] == "0.75"            # 150 / (2 x 100)
    assert cells[("pyfuser", "2")]["scaling"] == "0.60"          # 300 / (2 x 250): the newer run
    assert cells[("pyfuser", "1")]["tokens_per_s"] == "250"
    assert cells[("pyfuser", "2")]["loss_err"] == "0.10"         # 2.2 against eager's 2.0
    assert cells[("pyfuser", "2")]["compiled"] == "[3, 2]"
    assert cells[("eager", "1")]["loss_err"] == "0.00"


@pytest.mark.multiprocess
def test_dry_run_world_of_one(tmp_path):
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYFUSER_PROGRESS="off")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OUT"):
        env.pop(var, None)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "distributed.py"), "--dry-run", "--out", str(out),
         "--models", "bert", "--wraps", "ddp", "--modes", "eager,pyfuser_jit", "--steps", "1",
         "--warmup", "0", "--size", "2,8,32,1"],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (result,) = out.glob("distributed_w1-*.json")
    rows = {r["mode"]: r for r in json.loads(result.read_text())["rows"]}
    assert set(rows) == {"eager", "pyfuser_jit"}
    for r in rows.values():
        assert "error" not in r and r["step_ms"] > 0 and len(r["losses"]) == 2
    jit = rows["pyfuser_jit"]
    assert jit["compiled"][0] == jit["kernels"] > 0                # a world of one compiles all
    assert jit["losses"] == pytest.approx(rows["eager"]["losses"], rel=1e-5)
    assert "| bert | ddp | pyfuser_jit | 1 |" in (out / "distributed.md").read_text()


def test_speed_rows_relative_to_eager(tmp_path):
    rows = [dict(_row("eager", 2, 100.0, [1.0]), step_ms=10.0),
            dict(_row("pyfuser", 2, 100.0, [1.0]), step_ms=8.0),
            dict(_row("inductor", 2, 100.0, [1.0]), step_ms=20.0),
            {"model": "bert", "wrap": "ddp", "mode": "pyfuser_jit", "world": 2,
             "dtype": "float32", "error": "skipped: time budget"}]
    _run(tmp_path / "distributed_w2-20260101-000000.json", 2, rows)
    (row,) = B.speed_rows(str(tmp_path))
    assert row["workload"] == "bert ddp x2 float32"
    assert row["eager"] == 100.0 and row["pyfuser"] == 125.0 and row["torch.compile"] == 50.0
