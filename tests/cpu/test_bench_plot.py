"""bench/plot.py and bench/common.save_plot: % of the copy rate per workload, from tables or JSON."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
pytest.importorskip("matplotlib", reason="matplotlib (dev extra) draws the plots")

sys.path.insert(0, str(ROOT))
from bench.common import load_module_from_path  # noqa: E402

plot = load_module_from_path("bench_plot_under_test", ROOT / "bench" / "plot.py")

TABLES = """# Benchmarks

## Run A

### Pointwise (`bench/pointwise.py`)

| case | MB moved | pyfuser µs (%) | eager µs (%) | torch.compile µs (%) | pyfuser/compile |
|---|---|---|---|---|---|
| gelu | 201 | 52.3 (91%) | 277.9 (17%) | n/a | 0.98 |
| bias add | 201 | 51.9 (91%) | 77.2 (61%) | 52.8 (90%) | 0.98 |

### Seed 000 (`bench/graphs.py`)

| form | pyfuser µs (%) | eager runner µs (%) | TorchScript µs (%) | torch.compile µs (%) |
|---|---|---|---|---|
| mul_ | 831.4 (103%) | 1813.8 (47%) | 1444.2 (59%) | 828.6 (104%) |

| path | µs / call |
|---|---|
| native | 6.3 |
"""


def test_tables_and_series_from_markdown():
    tables = plot.parse_markdown(TABLES)
    assert len(tables) == 3 and tables[0].title == "Run A / Pointwise (`bench/pointwise.py`)"
    labels, data = plot.series_of(tables[0])
    assert labels == ["gelu", "bias add"] and list(data) == ["eager", "torch.compile", "pyfuser"]
    assert data["pyfuser"] == [91.0, 91.0] and data["eager"] == [17.0, 61.0]
    assert data["torch.compile"] == [None, 90.0]
    labels, data = plot.series_of(tables[1])
    assert data["eager"] == [47.0] and data["torch.compile"] == [104.0]   # "eager runner"
    assert plot.series_of(tables[2])[1] == {}
    rows = plot.rows_from_tables(tables[:2])
    assert [r["workload"] for r in rows] == ["pointwise: gelu", "pointwise: bias add",
                                             "graphs: mul_"]
    assert plot.parse_pct("12.3 (45%)") == 45.0 and plot.parse_pct("WRONG") is None


def test_dtype_column_joins_the_workload():
    t = plot.parse_markdown("| workload | dtype | eager | torch.compile | pyfuser | kernels |\n"
                            "|---|---|---|---|---|---|\n"
                            "| softmax 8192x3072 | bfloat16 | 40.1 (60%) | 30.2 (80%) | 29.0 (83%) | 1 |\n")
    labels, data = plot.series_of(t[0])
    assert labels == ["softmax 8192x3072 bfloat16"] and data["pyfuser"] == [83.0]


def test_plot_writes_svg_and_png_deterministically(tmp_path):
    rows = plot.rows_from_tables(plot.parse_markdown(TABLES)[:2])
    a, b, png = tmp_path / "a.svg", tmp_path / "b.svg", tmp_path / "c.png"
    plot.plot(rows, str(a), "title x")
    plot.plot(rows, str(b), "title x")
    plot.plot(rows, str(png), "title x")
    text = a.read_text()
    assert text == b.read_text()
    assert "graphs: mul_" in text and "title x" in text and "104%" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_plot_json_round_trip_and_cli(tmp_path, capsys):
    common = load_module_from_path("bench_common_under_test", ROOT / "bench" / "common.py")
    rows = [{"workload": "layer_norm 8192x3072 float32", "eager": 61.0, "torch.compile": 88.0,
             "pyfuser": 93.5}, {"workload": "softmax", "eager": 40.0, "torch.compile": None,
                                "pyfuser": 90.0}]
    written = common.save_plot("bench_x", "a title", rows, out_dir=str(tmp_path))
    assert [pathlib.Path(p).name for p in written] == ["bench_x.json", "bench_x.svg"]
    d = json.loads((tmp_path / "bench_x.json").read_text())
    assert d["rows"] == rows and d["title"] == "a title"
    out = tmp_path / "again.png"
    assert plot.main([str(tmp_path / "bench_x.json"), "-o", str(out)]) == 0
    assert out.exists() and "2 workloads" in capsys.readouterr().out
    md = tmp_path / "t.md"
    md.write_text(TABLES)
    assert plot.main([str(md), "--list"]) == 0
    listed = capsys.readouterr().out
    assert "0: Run A / Pointwise" in listed and "[eager, torch.compile, pyfuser]" in listed
    assert plot.main([str(md), "-o", str(tmp_path / "m.svg"), "--match", "seed 000"]) == 0
    assert "1 workloads" in capsys.readouterr().out


def test_docs_benchmarks_plot_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert "docs/img/benchmarks.svg" in readme and (ROOT / "docs/img/benchmarks.svg").exists()
    tables = plot.parse_markdown((ROOT / "docs" / "benchmarks.md").read_text())
    assert sum(len(plot.series_of(t)[1]) == 3 for t in tables) >= 2


def test_normalization_rows_plot_from_its_table_cells():
    norm = load_module_from_path("bench_normalization_under_test",
                                 ROOT / "bench" / "normalization.py")
    rows = [{"workload": "softmax 8192x3072", "dtype": "float32", "eager": "50.1 (61%)",
             "torch.compile": "35.2 (87%)", "pyfuser": "WRONG"},
            {"workload": "sum(0) 8192x3072", "dtype": "bfloat16", "eager": "20.0 (40%)",
             "pyfuser": "10.5 (77%)"}]
    assert norm.plot_rows(rows) == [
        {"workload": "softmax 8192x3072 float32", "eager": 61.0, "torch.compile": 87.0,
         "pyfuser": None},
        {"workload": "sum(0) 8192x3072 bfloat16", "eager": 40.0, "torch.compile": None,
         "pyfuser": 77.0}]
