"""Online (max, sum of exp) pairs on the GPU at the benchmark's sizes (bench/normalization.py):
softmax, log_softmax, logsumexp and cross-entropy through pyfuser.jit against eager, rows of
-inf / +inf / NaN included; kernel counts (one per normalization, cross-entropy 2 with a mean);
bit-identical results from run to run."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
import reduction_cases as RC  # noqa: E402
import pyfuser  # noqa: E402

pytestmark = pytest.mark.gpu
F = torch.nn.functional


def softmax(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def logsumexp(x):
    return torch.logsumexp(x, 1)


def ce_mean(x, t):
    return F.cross_entropy(x, t)


def ce_none(x, t):
    return F.cross_entropy(x, t, reduction="none")


def _bits(t):
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def _check(fn, args, kernels):
    f = pyfuser.jit(torch.jit.script(fn))
    got, want = f(*args), fn(*args)
    RC.check_close(got.cpu(), want.cpu(), fn.__name__, args[0].shape[-1], fn.__name__)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got == float("inf"), want == float("inf"))
    assert f.last_run.kernels == kernels and not f.last_run.fallbacks
    assert torch.equal(_bits(f(*args)), _bits(got))          # deterministic: the same bits


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(8192, 3072), (32768, 256), (1024, 65536)], ids=str)
@pytest.mark.parametrize("fn", [softmax, log_softmax, logsumexp], ids=lambda f: f.__name__)
def test_normalizations_with_special_rows(fn, shape, dt):
    x = torch.randn(*shape, device="cuda", dtype=dt)
    x[:10] = RC.special_rows(10, shape[1], dt).cuda()
    _check(fn, [x], 1)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn,kernels", [(ce_mean, 2), (ce_none, 1)], ids=lambda x: getattr(x, "__name__", str(x)))
def test_cross_entropy_4096x32000(fn, kernels, dt):
    x = torch.randn(4096, 32000, device="cuda", dtype=dt)
    t = torch.randint(0, 32000, (4096,), device="cuda")
    if fn is ce_none:
        x[:10] = RC.special_rows(10, 32000, dt).cuda()
    _check(fn, [x, t], kernels)


@pytest.mark.parametrize("cluster", ["8", "16"])
def test_clusters_wider_than_the_portable_size(cluster, monkeypatch):
    """$PYFUSER_RED_CLUSTER=16 (wider than the portable 8 blocks): the launcher allows
    non-portable cluster sizes for such a kernel (runtime/launch._allow_wide_clusters), and the
    row's 16 ranks combine to eager's result."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    x = torch.randn(64, 65536, device="cuda")
    x[:10] = RC.special_rows(10, 65536, torch.float32).cuda()
    _check(softmax, [x], 1)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-5)


def rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [softmax, log_softmax, layer_norm, rms_norm], ids=lambda f: f.__name__)
def test_rows_staged_in_shared_memory_equal_rows_in_registers(fn, dt, monkeypatch):
    """A row's cluster staging its loads in shared memory (cp.async, the default) computes in the
    same order as the same plan holding them in registers ($PYFUSER_RED_STAGE=0): the same bits,
    equal to eager. The warps' Welford partials merge as a tree in both ($PYFUSER_RED_WARP_TREE=1:
    by default only staged rows take the tree, so a layer norm's last bits differ by default)."""
    from pyfuser.codegen import api
    from pyfuser.runtime import dispatch
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("PYFUSER_RED_WARP_TREE", "1")
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])
    x = torch.randn(1024, 65536, device="cuda", dtype=dt)
    x[:10] = RC.special_rows(10, 65536, dt).cuda()
    out = {}
    for stage in ("1", "0"):
        monkeypatch.setenv("PYFUSER_RED_STAGE", stage)
        dispatch.clear_caches()
        n = len(plans)
        f = pyfuser.jit(torch.jit.script(fn))
        out[stage] = f(x)
        assert f.last_run.kernels == 1 and not f.last_run.fallbacks
        assert [(p.params.stage, p.params.cluster > 1) for p in plans[n:]] == [(stage == "1", True)]
    RC.check_close(out["1"].cpu(), fn(x).cpu(), fn.__name__, 65536, fn.__name__)
    assert torch.equal(_bits(out["1"]), _bits(out["0"]))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(8192, 3072), (1024, 65536), (64, 1000)], ids=str)
def test_softmax_quotient_by_the_rows_reciprocal_equals_the_division(dt, shape, monkeypatch):
    """Softmax's output as the row's reciprocal times a corrected product (`div_rcp`, the
    default) gives the bits of the division an element ($PYFUSER_RED_SHIFTED_DIV=0) wherever
    the float32 quotient is normal, tiny numerators (the scaled remainder) and special rows
    included; below 2^-126 at most a subnormal's unit of the output's last place apart.
    (With an unscaled remainder, float32 quotients of numerators under 2^-100 differed in
    their last bit.)"""
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    from pyfuser.codegen import api
    from pyfuser.runtime import dispatch
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])
    gen = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(shape, generator=gen) * 4).to(dt).cuda()
    x[:10] = RC.special_rows(10, shape[1], dt).cuda()
    x[10] = torch.linspace(-120, 0, shape[1]).to(dt)          # numerators down to 2^-126
    out = {}
    for knob in ("1", "0"):
        monkeypatch.setenv("PYFUSER_RED_SHIFTED_DIV", knob)
        dispatch.clear_caches()
        n = len(plans)
        f = pyfuser.jit(torch.jit.script(softmax))
        out[knob] = f(x)
        assert f.last_run.kernels == 1 and not f.last_run.fallbacks
        assert [("pf_div_rcp(" in p.kernel.source.split('extern "C"')[1]) for p in plans[n:]] \
            == [knob == "1"]
    RC.check_close(out["1"].cpu(), softmax(x).cpu(), "softmax", shape[1], "softmax")
    a, b = out["1"].cpu(), out["0"].cpu()
    assert torch.equal(a.isnan(), b.isnan())
    normal = b.float().abs() > 2.0 ** -126                  # so was the float32 quotient
    assert torch.equal(_bits(a)[normal], _bits(b)[normal])
    ulp = 2.0 ** (-149 if dt == torch.float32 else -133)
    assert ((a.float() - b.float()).abs()[~normal & ~b.isnan()] <= ulp).all()


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [softmax, layer_norm, rms_norm], ids=lambda f: f.__name__)
def test_rows_staged_past_48_kb_a_block(fn, dt, monkeypatch):
    """A row over a cluster of 2 blocks staging 64-128 KB each (dynamic shared memory past the
    static 48 KB: codegen/kernel_shared.py; the launch raises the function's limit) equals
    eager, special rows included."""
    from pyfuser.runtime import dispatch
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STAGE_BYTES", str(128 * 1024))
    dispatch.clear_caches()
    x = torch.randn(264, 65536, device="cuda", dtype=dt)
    x[:10] = RC.special_rows(10, 65536, dt).cuda()
    _check(fn, [x], 1)
    dispatch.clear_caches()
