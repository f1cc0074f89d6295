"""Run-time guards: one specialisation per group, eager fallback (logged once) on a mismatch,
no re-lowering for new sizes of the same layout, eager forever after a lowering failure."""
import logging

import torch

from pyfuser.frontend.torchscript import parse_ir
from pyfuser.frontend.torchscript.fuse_api import jit


def _fn(x, y):
    return torch.relu(x * y + 1.0)


def _compiled():
    return jit(torch.jit.script(_fn))


def _runner(f):
    (runner,) = f.runners.values()
    return runner


def _check(f, x, y):
    torch.testing.assert_close(f(x, y), _fn(x, y))


def test_new_size_same_layout_reuses_the_lowering(caplog):
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    lowered = _runner(f).lowered
    _check(f, torch.randn(7, 9), torch.randn(7, 9))
    assert _runner(f).lowered is lowered
    assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1


def test_dtype_mismatch_falls_back_and_logs_once(caplog):
    caplog.set_level(logging.INFO, logger="pyfuser")
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    x, y = torch.randn(3, 4).double(), torch.randn(3, 4).double()
    for _ in range(3):
        out = f(x, y)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, _fn(x, y))
    assert f.last_run.eager_groups == 1 and f.last_run.kernels == 0
    assert "dtype" in f.last_run.fallbacks[-1]["reason"]
    lines = [r for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(lines) == 1


def test_non_contiguous_input_falls_back():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    x = torch.randn(4, 3).t()
    _check(f, x, torch.randn(3, 4))
    assert f.last_run.eager_groups == 1
    assert "stride order" in f.last_run.fallbacks[-1]["reason"]
    _check(f, torch.randn(5, 6), torch.randn(5, 6))    # back on the fused path
    assert f.last_run.eager_groups == 0


def test_size_one_axis_vs_size_n():
    f = _compiled()
    _check(f, torch.randn(1, 4), torch.randn(3, 4))    # broadcast on the first call
    _check(f, torch.randn(3, 4), torch.randn(3, 4))    # size-n where size 1 was specialised
    assert f.last_run.eager_groups == 1
    assert "size-1" in f.last_run.fallbacks[-1]["reason"]
    g = _compiled()
    _check(g, torch.randn(3, 4), torch.randn(3, 4))
    _check(g, torch.randn(1, 4), torch.randn(3, 4))
    assert g.last_run.eager_groups == 1


def test_rank_mismatch_falls_back():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    _check(f, torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    assert "rank" in f.last_run.fallbacks[-1]["reason"]


def test_lowering_failure_runs_eagerly_forever(caplog):
    caplog.set_level(logging.INFO, logger="pyfuser")
    g = parse_ir("""graph(%x : Tensor):
  %r : str = prim::Constant[value="banana"]()
  %y : Tensor = aten::div(%x, %x, %r)
  return (%y)
""")
    f = jit(g)
    # div with an unknown rounding mode is lowerable by kind, but fails when lowered
    assert f.last_run.groups == 1
    x = torch.randn(2, 2)
    for _ in range(2):
        try:
            f(x)
        except Exception as e:      # eager raises on the bad rounding mode, as torch does
            assert "banana" in str(e) or "rounding" in str(e)
    runner = next(iter(f.runners.values()))
    assert runner.dead is not None and "lowering failed" in runner.dead
    assert sum("lowering failed" in r.getMessage() for r in caplog.records) == 1


def test_scalar_input_type_guard():
    def fn(x, s: float):
        return x * s + 1
    f = jit(torch.jit.script(fn))
    x = torch.randn(2, 3)
    torch.testing.assert_close(f(x, 0.5), fn(x, 0.5))
    torch.testing.assert_close(f(x, 1.5), fn(x, 1.5))
    assert f.last_run.eager_groups == 0


def test_inputs_that_passed_skip_the_signature_but_others_do_not(monkeypatch):
    """The guard's signature is computed once per (dtype, sizes, strides, device) seen; a seen
    key passes without it, a new layout is still checked (and falls back)."""
    from pyfuser.frontend.torchscript import jit as J
    calls = []
    real = J.signature
    monkeypatch.setattr(J, "signature", lambda args: calls.append(1) or real(args))
    f = _compiled()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        _check(f, x, y)
    assert len(calls) == 1 and f.last_run.kernels == 1
    _check(f, torch.randn(3, 4), torch.randn(3, 4))        # same key, other tensors
    assert len(calls) == 1
    _check(f, torch.randn(5, 4), torch.randn(5, 4))        # new sizes: checked, passes
    assert len(calls) == 2 and f.last_run.eager_groups == 0
    xt = torch.randn(4, 3).t()                             # new layout: checked, fails
    _check(f, xt, y)
    _check(f, xt, y)
    assert len(calls) == 4 and f.last_run.eager_groups == 1 and f.last_run.kernels == 0
