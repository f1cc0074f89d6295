"""Every bad input gets a one-line error naming what and where: the CLI exits with status 2,
the Python API raises PyfuserError (never AttributeError or a stack of torch internals)."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.cli import main
from pyfuser.errors import PyfuserError
from pyfuser.frontend.torchscript import run_limits

SEED000 = "examples/seed000_mul.ir"
SMALL = "examples/seed003_bn_add_relu.ir"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("pyfuser: error: ")
    return err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command", ["run", "demo"])
def test_device_cuda_without_a_gpu(capsys, command):
    target = SMALL if command == "run" else "examples"
    assert main([command, target, "--device", "cuda"]) == 2
    line = _one_error_line(capsys)
    assert "--device cuda" in line and "no CUDA device" in line and "--device cpu" in line


@pytest.mark.parametrize("cap", ["-3", "0"])
def test_shrink_must_be_positive(capsys, cap):
    assert main(["run", SMALL, "--device", "cpu", "--shrink", cap]) == 2
    line = _one_error_line(capsys)
    assert f"--shrink {cap}" in line and SMALL in line and "positive" in line


def test_large_cpu_run_says_how_to_shrink(capsys):
    assert main(["run", SEED000, "--device", "cpu"]) == 2
    line = _one_error_line(capsys)
    assert SEED000 in line and "130,000,000 elements" in line
    assert "--shrink" in line and "--full-size" in line


def test_declared_shape_too_large_for_memory(capsys, tmp_path, monkeypatch):
    path = tmp_path / "huge.ir"
    path.write_text("graph(%x : Float(100000, 100000, strides=[100000, 1], requires_grad=0, "
                    "device=cpu)):\n  %y : Tensor = aten::relu(%x)\n  return (%y)\n")
    monkeypatch.setattr(run_limits, "available_bytes", lambda device: 2 * 10 ** 9)
    assert main(["run", str(path), "--device", "cpu", "--full-size"]) == 2
    line = _one_error_line(capsys)
    assert str(path) in line and "40.0 GB" in line and "2.0 GB free" in line
    assert "--shrink" in line and "%x" in line
    # with a cap the same graph runs
    capsys.readouterr()
    assert main(["run", str(path), "--device", "cpu", "--shrink", "8", "--json"]) == 0


def test_estimate_counts_strides_and_outputs():
    from pyfuser.frontend.torchscript import parse_ir
    g = parse_ir("graph(%x : Float(10, 10, strides=[20, 1], requires_grad=0, device=cpu),\n"
                 "      %n : int):\n  %y : Tensor = aten::relu(%x)\n  return (%y)\n")
    est = run_limits.estimate(g)
    assert est.input_bytes == (1 + 9 * 20 + 9) * 4
    assert est.need_bytes > 3 * est.input_bytes
    assert run_limits.estimate(g, shrink=2).input_bytes == 4 * 4


@pytest.mark.parametrize("api", [pyfuser.jit, pyfuser.fuse_graph])
@pytest.mark.parametrize("obj, words", [
    (5, "got int 5"), ([1, 2], "got list [1, 2]"), (None, "got NoneType None"),
    (object(), "got object"), (lambda x: x, "cannot script a lambda"),
    ("missing_file.ir", "no such file: missing_file.ir"),
])
def test_api_rejects_what_it_cannot_compile(api, obj, words):
    with pytest.raises(PyfuserError) as info:
        api(obj)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"pyfuser.{api.__name__}: ") and words in msg


def test_module_without_forward():
    with pytest.raises(PyfuserError, match="no forward method"):
        pyfuser.jit(torch.nn.Module())


def test_unscriptable_function_names_itself():
    def uses_numpy(x):
        import numpy
        return numpy.asarray(x)
    with pytest.raises(PyfuserError) as info:
        pyfuser.jit(uses_numpy)
    msg = str(info.value)
    assert "\n" not in msg and "uses_numpy" in msg and "torch.jit.trace" in msg
