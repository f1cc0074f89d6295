"""bench/graphs.py on the CPU (--dry-run): every column builds and checks against the eager runner,
a failing column shows `error: ...` in the table instead of stopping the run."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common import load_module_from_path  # noqa: E402


@pytest.fixture()
def graphs():
    return load_module_from_path("bench_graphs", os.path.join(ROOT, "bench", "graphs.py"),
                                 fresh=True, register=False)


def _no_compile(v, env):
    raise RuntimeError("torch.compile is not tried in this test | it is slow on the CPU")


def test_dry_run_table(graphs, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(graphs.COLUMNS, "compile", _no_compile)
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = graphs.main(["--dry-run", "--size", "8"])
    text = (tmp_path / "bench_graphs_dry_run.md").read_text()
    assert rc == 0, capsys.readouterr().out
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "form" not in ln]
    assert [r.split(" | ")[0] for r in rows] == ["| as given (add, mul)", "| mul_", "| add_ + mul_"]
    for r in rows:
        assert "error: RuntimeError: torch.compile is not tried in this test \\| it is slow" in r
        assert r.count("error") == 1                     # pyfuser, eager, TorchScript ran
    assert "dry run (speed not judged): pyfuser kernels per call (last_run): 1 / 1 / 1" in text
    assert "TorchScript fuser:" in text


def test_python_functions_match_the_graphs(graphs):
    import torch

    from pyfuser.frontend.torchscript import make_inputs, parse_ir, run_graph
    from pyfuser.frontend.torchscript.jit import eager_handler
    for v in graphs.variants():
        with open(v.path) as fh:
            g = parse_ir(fh.read())
        xs = graphs._int_inputs_1_to_100(make_inputs(g, device="cpu", size_override=16), "cpu")
        assert all(int(x.min()) >= 1 and int(x.max()) <= 100 for x in xs)
        ref = run_graph(g, xs, device="cpu", node_handler=eager_handler)[0]
        for fn in (v.fn, torch.jit.script(v.fn)):
            out = fn(*xs)
            assert out.dtype == ref.dtype and torch.equal(out, ref)


def test_pyfuser_failure_fails_soft(graphs, monkeypatch, tmp_path):
    def boom(v, env):
        raise ValueError("no kernel today")
    for name in ("compile", "torchscript"):
        monkeypatch.setitem(graphs.COLUMNS, name, _no_compile)
    monkeypatch.setitem(graphs.COLUMNS, "pyfuser", boom)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert graphs.main(["--dry-run", "--size", "4"]) == 1
    text = (tmp_path / "bench_graphs_dry_run.md").read_text()
    assert text.count("error: ValueError: no kernel today") == 3
    assert "FAIL: pyfuser did not run every form" in text
