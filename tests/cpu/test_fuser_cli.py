"""`pyfuser run --json` reports the fusion (groups, kernels, fallbacks, matches_eager)."""
import json
import shutil

from pyfuser.cli import main


def _run_json(capsys, *argv):
    rc = main(["run", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_run_seed003_json(capsys):
    rc, rep = _run_json(capsys, "examples/seed003_bn_add_relu.ir", "--device", "cpu",
                        "--shrink", "16")
    assert rc == 0
    assert rep["groups"] == 1 and rep["kernels"] == 1 and rep["host_segments"] == 1
    assert rep["matches_eager"] is True and rep["max_abs_err"] < 1e-4
    assert rep["fallbacks"] == []
    assert "prim::PyfuserGroup_0" in rep["fused_graph"]
    assert rep["outputs"] == [{"shape": [8, 16, 16, 16], "dtype": "float32"}]


def test_run_seed000_inplace_json(capsys):
    rc, rep = _run_json(capsys, "examples/seed000_add_mul_inplace.ir", "--device", "cpu",
                        "--shrink", "32")
    assert rc == 0 and rep["groups"] == 1 and rep["kernels"] == 1
    assert rep["matches_eager"] is True and rep["max_abs_err"] == 0
    assert rep["fallbacks"] == []


def test_run_text_and_bench_without_gpu(capsys):
    rc = main(["run", "examples/seed000_mul.ir", "--device", "cpu", "--shrink", "8", "--bench"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "groups: 1, kernels per call: 1" in out and "matches eager: True" in out
    assert "skipped" in out


def test_demo_on_a_small_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "evaluator")   # demo changes these: restore
    monkeypatch.setenv("PYFUSER_DUMP", "")
    shutil.copy("examples/seed000_mul_inplace.ir", tmp_path / "a.ir")
    assert main(["demo", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "sizes capped at 128" in out and "matches eager" in out
    assert "1 group(s), 1 kernel(s) per call (interpret" in out
    assert "1/1 examples ran and matched eager" in out
    assert main(["demo", str(tmp_path), "--device", "cpu", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "prim::PyfuserGroup_0" in out and "matches eager: True" in out


def test_demo_report_is_short_and_cuda_source_is_behind_options(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "evaluator")   # demo changes these: restore
    monkeypatch.setenv("PYFUSER_DUMP", "")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    ex = tmp_path / "examples"
    ex.mkdir()
    for name in ("seed000_mul.ir", "seed003_bn_add_relu.ir"):
        shutil.copy(f"examples/{name}", ex / name)
    assert main(["demo", str(ex), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) <= 6 and "2/2 examples ran and matched eager" in captured.out
    assert "__global__" not in captured.out + captured.err
    assert main(["demo", str(ex), "--device", "cpu", "--show-cuda"]) == 0
    assert "__global__" in capsys.readouterr().err
    cuda_dir = tmp_path / "cuda"
    assert main(["demo", str(ex), "--device", "cpu", "--cuda-dir", str(cuda_dir)]) == 0
    written = sorted(p.name for p in cuda_dir.glob("*.cu"))
    assert written and all("__global__" in (cuda_dir / n).read_text() for n in written)
    assert str(cuda_dir) in capsys.readouterr().out


def test_run_graph_that_writes_its_input(capsys, tmp_path):
    """Eager's reference runs on copies: a graph that writes its input in place is compared
    against the fused run on the same input values, not on values eager already changed."""
    path = tmp_path / "writes_input.ir"
    path.write_text("graph(%x : Float(64, strides=[1], requires_grad=0, device=cpu)):\n"
                    "  %one : int = prim::Constant[value=1]()\n"
                    "  %y : Tensor = aten::add_(%x, %x, %one)\n"
                    "  %z : Tensor = aten::mul(%y, %x)\n"
                    "  return (%z)\n")
    rc, rep = _run_json(capsys, str(path), "--device", "cpu")
    assert rc == 0 and rep["matches_eager"] is True and rep["max_abs_err"] == 0


TUPLE_OUTPUTS = """graph(%x : Float(4, 5, strides=[5, 1], requires_grad=0, device=cpu),
      %y : Float(4, 5, strides=[5, 1], requires_grad=0, device=cpu)):
  %1 : int = prim::Constant[value=1]()
  %a : Float(4, 5, strides=[5, 1], requires_grad=0, device=cpu) = aten::add(%x, %y, %1)
  %b : Float(4, 5, strides=[5, 1], requires_grad=0, device=cpu) = aten::mul(%a, %y)
  %t : (Tensor, Tensor) = prim::TupleConstruct(%a, %b)
  %l : Tensor[] = prim::ListConstruct(%b, %a)
  return (%t, %l, %1)
"""


def test_run_graph_with_tuple_and_list_outputs(capsys, tmp_path):
    path = tmp_path / "tuples.ir"
    path.write_text(TUPLE_OUTPUTS)
    rc, rep = _run_json(capsys, str(path), "--device", "cpu")
    assert rc == 0 and rep["matches_eager"] is True and rep["groups"] == 1
    assert rep["outputs"][0] == {"shape": None, "dtype": "tuple",
                                 "items": [{"shape": [4, 5], "dtype": "float32"}] * 2}
    assert main(["run", str(path), "--device", "cpu"]) == 0
    assert "output 0: tuple(shape [4, 5] dtype float32" in capsys.readouterr().out


def test_compare_looks_inside_tuples_lists_and_dicts():
    import torch
    from pyfuser.frontend.torchscript.fuse_run import compare
    a, b = torch.ones(3), torch.zeros(3)
    assert compare([(a, [b, 1])], [(a.clone(), [b.clone(), 1])]) == (True, 0.0)
    ok, err = compare([(a, b)], [(a, a)])
    assert not ok and err == 1.0
    assert compare([(a, b)], [(a,)]) == (False, float("inf"))
    assert compare([{"k": a}], [{"k": b}])[0] is False
    assert compare([[1, 2]], [[1, 2]]) == (True, 0.0)
    assert compare([1], [1.0])[0] is False          # an int output must stay an int
