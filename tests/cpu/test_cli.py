"""The `pyfuser` command: show, run (--json), demo, and error reporting with exit code 2."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from pyfuser.cli import main, run_file

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"

SMALL = """graph(%x : Float(2, 3, strides=[3, 1], requires_grad=0, device=cuda:0),
      %n : int):
  %d : Device = prim::Constant[value="cuda:0"]()
  %z : Tensor = aten::zeros_like(%x, %n, %n, %d, %n, %n)
  %y : Tensor = aten::add(%x, %x, %n)
  %s : Tensor = aten::sum(%y)
  %m : int = aten::mul(%n, %n)
  return (%y, %s, %m)
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_show_prints_the_graph(tmp_path, capsys):
    path = write(tmp_path, "small.ir", SMALL)
    assert main(["show", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graph(%x : Float(2, 3, strides=[3, 1], requires_grad=0, device=cuda:0),")
    assert "  %y : Tensor = aten::add(%x, %x, %n)" in out and "return (%y, %s, %m)" in out


def test_run_json_on_cpu_maps_cuda_devices(tmp_path, capsys):
    text = SMALL.replace("aten::zeros_like(%x, %n, %n, %d, %n, %n)",
                         "aten::empty_like(%x, %none, %none, %d, %none, %none)")
    text = text.replace('  %d : Device', '  %none : NoneType = prim::Constant()\n  %d : Device')
    path = write(tmp_path, "small.ir", text)
    assert main(["run", path, "--device", "cpu", "--json", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"file", "outputs", "device"} <= set(report)
    assert report["device"] == "cpu" and report["file"] == path
    assert report["outputs"][0] == {"shape": [2, 3], "dtype": "float32"}
    assert report["outputs"][1] == {"shape": [], "dtype": "float32"}
    assert report["outputs"][2]["shape"] is None and report["outputs"][2]["dtype"] == "int"


def test_run_file_is_an_extensible_dict():
    report = run_file(str(EXAMPLES / "seed003_bn_add_relu.ir"), "cpu", 0)
    assert report["outputs"] == [{"shape": [8, 256, 56, 56], "dtype": "float32"}]
    report["groups"] = []                    # later stages add keys
    assert json.loads(json.dumps(report))["groups"] == []


def test_run_text_output(tmp_path, capsys):
    path = write(tmp_path, "small.ir", SMALL.replace("zeros_like(%x, %n, %n, %d, %n, %n)",
                                                     "neg(%x)"))
    assert main(["run", path, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "output 0: shape [2, 3] dtype float32" in out and "on cpu" in out


def test_parse_error_exit_2(tmp_path, capsys):
    path = write(tmp_path, "bad.ir", "graph(%x : Tensor):\n  %y : Tensor = aten::relu(%q)\n"
                                     "  return (%y)\n")
    assert main(["run", path, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyfuser: error: {path}:2:28: use of undefined value %q")
    assert "Traceback" not in err


def test_runner_error_exit_2(tmp_path, capsys):
    path = write(tmp_path, "bad.ir", "graph(%x : Float(2, 3)):\n  %y : Tensor = aten::nope(%x)\n"
                                     "  return (%y)\n")
    assert main(["run", path, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"pyfuser: error: {path}:2:3: cannot run aten::nope" in err


def test_missing_file_exit_2(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nope.ir")]) == 2
    assert "pyfuser: error:" in capsys.readouterr().err


def test_demo_runs_every_file_and_reports_failures(tmp_path, capsys):
    write(tmp_path, "a.ir", SMALL.replace("zeros_like(%x, %n, %n, %d, %n, %n)", "neg(%x)"))
    assert main(["demo", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "a.ir" in out and "1/1 examples ran" in out
    write(tmp_path, "b.ir", "graph(%x : Tensor):\n  return (%y)\n")
    assert main(["demo", str(tmp_path), "--device", "cpu"]) != 0
    captured = capsys.readouterr()
    assert "1/2 examples ran" in captured.out and "b.ir:2:11" in captured.err


def test_module_entry_point(tmp_path):
    path = write(tmp_path, "small.ir", SMALL)
    proc = subprocess.run([sys.executable, "-m", "pyfuser.cli", "show", path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "aten::zeros_like" in proc.stdout
    bad = write(tmp_path, "bad.ir", "graph(")
    proc = subprocess.run([sys.executable, "-m", "pyfuser.cli", "show", bad],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "pyfuser: error:" in proc.stderr
