"""Held pure reductions (schedule/reduction_heuristics.held_plan): a pure inner reduction of
any dtype is planned persistent (its row's vectors spread over the team at once, in one
block's registers; at least 128 bytes of the row a team step) instead of streamed in
`unroll`-vector steps; online pairs and picks (cross-entropy) stay streamed;
$PYFUSER_RED_HOLD=0 / 1 never / always holds; fewer rows than SMs stay streamed. Checked
through the CPU interpreter of the kernel IR against eager, rows of 2 to 16384 and odd
lengths, with the CUDA compiled by NVRTC for sm_90. A fixture gives the tests a GPU of 2 SMs
($PYFUSER_SM_COUNT), so that a few rows are enough rows (the row-count test sets 132)."""
from __future__ import annotations

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.runtime import dispatch, nvrtc

from reduction_cases import check_close, fusion, logsumexp, reduce_op, var_mean

SUM, MAX = reduce_op("sum"), reduce_op("max")


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setenv("PYFUSER_SM_COUNT", "2")


def _plan(build, x):
    f = fusion(build, 2, x.dtype, [1])
    return f, api.plan_kernel(f, [x])


@pytest.mark.parametrize("n", [2, 7, 128, 1000, 3072, 16384])
@pytest.mark.parametrize("build,name", [(SUM, "sum"), (MAX, "max"), (var_mean, "var_mean")],
                         ids=["sum", "max", "var_mean"])
def test_float32_rows_are_held_and_match_eager(build, name, n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, generator=gen) * 4
    f, plan = _plan(build, x)
    assert plan.params.persistent and plan.params.cluster == 1 and not plan.params.stage, \
        plan.params
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    got = dispatch.execute_fusion(f, [x], "interpret")
    want = {"sum": lambda: [x.sum(1)], "max": lambda: [x.amax(1)],
            "var_mean": lambda: list(torch.var_mean(x, 1, correction=1))}[name]()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        check_close(g, w, name, n)


@pytest.mark.parametrize("build,name", [(SUM, "sum"), (MAX, "max"), (var_mean, "var_mean")],
                         ids=["sum", "max", "var_mean"])
def test_bfloat16_rows_are_held_and_check_no_bounds(build, name):
    """Held 2-byte rows (sums and maxima too, since their one pass checks no bounds) match
    eager; a whole row's held pure reduction is `full` (its loads read step by step in the
    first and only pass, none in a later one)."""
    x = (torch.randn(4, 3072) * 3).to(torch.bfloat16)
    f, plan = _plan(build, x)
    assert plan.params.persistent and plan.params.full, plan.params
    got = dispatch.execute_fusion(f, [x], "interpret")
    want = {"sum": lambda: [x.sum(1)], "max": lambda: [x.amax(1)],
            "var_mean": lambda: list(torch.var_mean(x, 1, correction=1))}[name]()
    for g, w in zip(got, want):
        check_close(g, w, name, 3072)


@pytest.mark.parametrize("dtype,n,threads", [(torch.float32, 32, 8), (torch.float32, 64, 8),
                                             (torch.float32, 128, 8), (torch.float32, 2048, 64),
                                             (torch.bfloat16, 32, 4), (torch.bfloat16, 64, 8),
                                             (torch.bfloat16, 256, 8), (torch.bfloat16, 3072, 64)],
                         ids=str)
def test_a_short_row_gets_threads_for_128_bytes_a_step(dtype, n, threads, monkeypatch):
    """A row's team is at least the threads a step needs to read 128 bytes in 16-byte vectors
    (8), at most its vectors (a bfloat16 row of 32: 4); longer rows keep about 8 vectors a
    thread. $PYFUSER_RED_TEAM_BYTES=0 turns the floor off (a row of 64 float32 back to 2
    threads of 8 vectors). The kernels compile for sm_90 and match eager."""
    x = (torch.randn(6, n) * 2).to(dtype)
    f, plan = _plan(SUM, x)
    p = plan.params
    assert p.persistent and p.bdimx == threads and p.bdimx * p.bdimy >= 32, p
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    check_close(dispatch.execute_fusion(f, [x], "interpret")[0], x.sum(1), "sum", n)
    if (dtype, n) == (torch.float32, 64):
        monkeypatch.setenv("PYFUSER_RED_TEAM_BYTES", "0")
        assert _plan(SUM, x)[1].params.bdimx == 2
        monkeypatch.setenv("PYFUSER_RED_TEAM_BYTES", "-1")
        with pytest.raises(ValueError, match="PYFUSER_RED_TEAM_BYTES"):
            _plan(SUM, x)


def test_a_layer_norm_keeps_its_team_and_is_as_accurate_with_the_floor(monkeypatch):
    """A layer norm of rows of 32 float32 (8 vectors) keeps its team of fewer than 8 threads:
    its Welford merges make the floor's extra combine rounds cost more than its loads gain
    (reduction_heuristics._merges_cheaply). Planned with the floor anyway (`pure=True`, as a
    held pure reduction is), 8 threads of 1 vector, it matches eager and is as close to float64
    as the default plan (a CLIP training step's gradients had seemed to drift with it:
    _team_floor's docstring)."""
    from reduction_cases import layer_norm
    from pyfuser.schedule import reduction as R
    g = torch.Generator().manual_seed(3)
    x = torch.randn(34, 32, generator=g) * 3 + torch.randn(34, 1, generator=g) * 5
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    want = torch.nn.functional.layer_norm(x.double(), [32], w.double(), b.double(), 1e-5)
    choose = R.choose
    shapes, errors = [], []
    for pure in (None, True):
        monkeypatch.setattr(R, "choose", lambda *a, **k: choose(*a, **{**k, "pure": pure}))
        f = fusion(layer_norm, 2, x.dtype, [1])
        p = api.plan_kernel(f, [x, w, b]).params
        assert p.persistent, p
        shapes.append((p.bdimx, p.steps))
        got = dispatch.execute_fusion(f, [x, w, b], "interpret")[0]
        check_close(got, torch.nn.functional.layer_norm(x, [32], w, b, 1e-5), "layer_norm", 32)
        errors.append((got.double() - want).abs().max().item())
    assert shapes[0][0] < 8 and shapes[1] == (8, 1), shapes
    assert errors[1] <= 2 * errors[0], errors


def test_an_rms_norm_gets_the_floor(monkeypatch):
    """An RMS norm's statistic is a plain sum: its rows of 256 bfloat16 (32 vectors) get the
    floor's 8 threads (4 with $PYFUSER_RED_TEAM_BYTES=0), and match eager."""
    x = (torch.randn(40, 256) * 2).to(torch.bfloat16)
    w = torch.randn(256).to(torch.bfloat16)
    from reduction_cases import rms_norm
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    teams = []
    for knob in ("0", "128"):
        monkeypatch.setenv("PYFUSER_RED_TEAM_BYTES", knob)
        f = fusion(rms_norm, 2, x.dtype, [1])
        p = api.plan_kernel(f, [x, w]).params
        assert p.persistent, p
        teams.append(p.bdimx)
        got = dispatch.execute_fusion(f, [x, w], "interpret")[0]
        check_close(got, want, "rms_norm", 256)
    assert teams == [4, 8], teams


def test_online_pairs_stay_streamed():
    x = torch.randn(4, 32000)
    assert not _plan(logsumexp, x)[1].params.persistent


def test_the_knob_turns_holding_off_and_on(monkeypatch):
    x32, x16 = torch.randn(4, 3072), torch.randn(4, 3072).to(torch.bfloat16)
    monkeypatch.setenv("PYFUSER_RED_HOLD", "0")
    assert not _plan(SUM, x32)[1].params.persistent
    assert not _plan(var_mean, x16)[1].params.persistent
    monkeypatch.setenv("PYFUSER_RED_HOLD", "1")
    f, plan = _plan(SUM, x16)
    assert plan.params.persistent
    got = dispatch.execute_fusion(f, [x16], "interpret")
    check_close(got[0], x16.sum(1), "sum", 3072)


def test_a_row_too_long_for_registers_streams():
    x = torch.randn(2, 1 << 17)
    p = _plan(SUM, x)[1].params
    assert not p.persistent and p.cluster == 1, p


def test_fewer_rows_than_sms_stream(monkeypatch):
    """A loss's total sum (one row) or a few rows keep the streamed plan, whose team widens and
    whose size class does not follow the row's length step by step (dynamic shapes)."""
    monkeypatch.setenv("PYFUSER_SM_COUNT", "132")
    x = torch.randn(131, 3072)
    assert not _plan(SUM, x)[1].params.persistent
    assert not _plan(var_mean, x)[1].params.persistent
    assert _plan(SUM, torch.randn(132, 3072))[1].params.persistent
    monkeypatch.setenv("PYFUSER_RED_HOLD", "1")
    assert _plan(SUM, torch.randn(1, 3072))[1].params.persistent


@pytest.mark.parametrize("hold", ["0", "1"])
@pytest.mark.parametrize("n", [3, 16, 100])
def test_a_welford_chunk_with_an_infinity_not_last_is_nan_as_eager(n, hold, monkeypatch):
    """Eager's Welford takes a row's elements one at a time: after an infinity the next element
    makes the mean NaN. A chunk's exact mean (its sum / its count) stayed infinite: a row of 3
    held in one thread, [-inf, a, b], gave a mean of -inf where eager's is NaN (fuzz_norms seed
    290623 with the rows held). Streamed chunks of several elements a thread (many short rows
    of 8-16) did the same. The
    infinity as the row's last element is where eager keeps it (a NaN here: docs/reductions.md,
    Numerics)."""
    monkeypatch.setenv("PYFUSER_RED_HOLD", hold)
    x = torch.randn(6, n)
    x[0, 0] = float("-inf")
    x[1, n // 2] = float("inf")
    x[2] = float("-inf")
    x[3, 0], x[3, 1] = float("inf"), float("-inf")
    f = fusion(var_mean, 2, x.dtype, [1])
    got = dispatch.execute_fusion(f, [x], "interpret")
    want = torch.var_mean(x, 1, correction=1)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()), (g, w)
        assert torch.equal(g.nan_to_num(), w.nan_to_num()) or \
            torch.allclose(g[4:], w[4:], rtol=1e-5, atol=1e-5)
    assert got[1][:4].isnan().all()
