"""Run-time guards: one lowering per input signature (dtype, rank, device, size-1 axes, stride
order), each with its own kernels; new sizes of a seen signature reuse it (no re-lowering); a
lowering that fails runs that signature eagerly (logged once); past MAX_VARIANTS signatures a
group runs new ones eagerly, saying why."""
import logging

import torch

from pyfuser.frontend.torchscript import parse_ir
from pyfuser.frontend.torchscript.fuse_api import jit
from pyfuser.frontend.torchscript.group_runner import MAX_VARIANTS


def _fn(x, y):
    return torch.relu(x * y + 1.0)


def _compiled():
    return jit(torch.jit.script(_fn))


def _runner(f):
    (runner,) = f.runners.values()
    return runner


def _check(f, x, y):
    out = f(x, y)
    want = _fn(x, y)
    assert out.dtype == want.dtype and out.shape == want.shape
    torch.testing.assert_close(out, want)
    assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1, f.last_run


def _lowerings(f) -> int:
    return sum(not isinstance(v, str) for v in _runner(f).variants.values())


def test_new_size_same_layout_reuses_the_lowering():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    lowered = _runner(f).lowered
    _check(f, torch.randn(7, 9), torch.randn(7, 9))
    assert _runner(f).lowered is lowered and _lowerings(f) == 1


def test_a_new_dtype_gets_its_own_kernel():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    x, y = torch.randn(3, 4).double(), torch.randn(3, 4).double()
    for _ in range(3):
        _check(f, x, y)
    assert _lowerings(f) == 2
    _check(f, torch.randn(3, 4), torch.randn(3, 4))       # the first one is still there
    assert _lowerings(f) == 2


def test_a_non_contiguous_input_gets_its_own_kernel():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    _check(f, torch.randn(4, 3).t(), torch.randn(3, 4))
    _check(f, torch.randn(5, 6), torch.randn(5, 6))
    assert _lowerings(f) == 2


def test_size_one_axis_and_size_n_are_two_signatures():
    for first, second in [((1, 4), (3, 4)), ((3, 4), (1, 4))]:
        f = _compiled()
        _check(f, torch.randn(first), torch.randn(3, 4))
        _check(f, torch.randn(second), torch.randn(3, 4))
        assert _lowerings(f) == 2


def test_a_new_rank_gets_its_own_kernel():
    f = _compiled()
    _check(f, torch.randn(3, 4), torch.randn(3, 4))
    _check(f, torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    assert _lowerings(f) == 2


def test_past_the_bound_new_signatures_run_eagerly_with_the_reason(caplog):
    caplog.set_level(logging.INFO, logger="pyfuser")
    f = _compiled()
    for rank in range(1, MAX_VARIANTS + 1):
        _check(f, torch.randn((2,) * rank), torch.randn((2,) * rank))
    x = torch.randn((2,) * (MAX_VARIANTS + 1))
    for _ in range(2):
        torch.testing.assert_close(f(x, x), _fn(x, x))
        assert f.last_run.eager_groups == 1 and f.last_run.kernels == 0
    assert "more than" in f.last_run.fallbacks[-1]["reason"]
    assert sum("more than" in r.getMessage() for r in caplog.records) == 1
    _check(f, torch.randn(3), torch.randn(3))             # seen signatures stay fused


def test_lowering_failure_runs_that_signature_eagerly(caplog):
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
    for _ in range(3):
        try:
            f(x)
        except Exception as e:      # eager raises on the bad rounding mode, as torch does
            assert "banana" in str(e) or "rounding" in str(e)
    runner = next(iter(f.runners.values()))
    (reason,) = runner.variants.values()
    assert "lowering failed" in reason
    assert sum("lowering failed" in r.getMessage() for r in caplog.records) == 1


def test_scalar_input_type_guard():
    def fn(x, s: float):
        return x * s + 1
    f = jit(torch.jit.script(fn))
    x = torch.randn(2, 3)
    for s in (0.5, 1.5, -0.0):
        torch.testing.assert_close(f(x, s), fn(x, s))
        assert f.last_run.eager_groups == 0


def test_inputs_that_passed_skip_the_signature_but_others_do_not(monkeypatch):
    """The guard's signature is computed once per (dtype, sizes, strides, device) seen; a seen
    key passes without it, a new layout is checked (and lowered for)."""
    from pyfuser.frontend.torchscript import group_runner as GR
    calls = []
    real = GR.signature
    monkeypatch.setattr(GR, "signature", lambda args: calls.append(1) or real(args))
    f = _compiled()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        _check(f, x, y)
    assert len(calls) == 1
    _check(f, torch.randn(3, 4), torch.randn(3, 4))        # same key, other tensors
    assert len(calls) == 1
    _check(f, torch.randn(5, 4), torch.randn(5, 4))        # new sizes: checked, passes
    assert len(calls) == 2
    xt = torch.randn(4, 3).t()                             # new layout: checked, lowered
    _check(f, xt, y)
    _check(f, xt, y)
    assert len(calls) == 3 and _lowerings(f) == 2
