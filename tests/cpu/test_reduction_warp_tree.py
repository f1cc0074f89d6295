"""A row's team past a warp merges its warps' Welford partials as a tree in every warp where the
row is staged in shared memory, or where PYFUSER_RED_WARP_TREE=1 forces it, as these tests do
(other reductions and rows held in registers read them in order;
codegen/reduction_kernels.InnerKernel.combine_threads): every
thread must end with the same bits, since each one normalizes its own elements with its own copy
of the statistics. Checked through the CPU interpreter of the kernel IR on teams of 2 to 16
warps (Welford statistics bit for bit, layer norm and softmax against eager, sums and max over 16
warps exactly), and the generated CUDA compiles with NVRTC."""
from __future__ import annotations

import pytest
import torch

from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.runtime import dispatch

from reduction_cases import fusion, layer_norm, softmax

ew = B.elementwise


@pytest.fixture(autouse=True)
def _forced_tree(monkeypatch):
    """These small rows are held in registers, where the default reads in order: force the tree."""
    monkeypatch.setenv("PYFUSER_RED_WARP_TREE", "1")


def _norm_stats_fusion(x_cols):
    """y = (x - mean) * rsqrt(m2 / n + eps) with mean and that rsqrt as outputs too."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        avg, m2, _ = B.welford(x, [1])
        r = ew("rsqrt", ew("add", ew("div", m2, B.num_elements(x, [1])), 1e-5))
        keep = [False, True]
        y = ew("mul", ew("sub", x, B.broadcast(avg, keep)), B.broadcast(r, keep))
        f.add_output(y)
        f.add_output(avg)
        f.add_output(r)
    return f


@pytest.mark.parametrize("bdimx", [64, 128, 256, 512])
def test_every_thread_normalizes_with_the_same_welford_statistics(bdimx, monkeypatch):
    """The kernel's y equals (x - mean) * r computed from its own mean and r outputs, bit for
    bit, on every element: had any thread of the row merged the warps' Welford partials in
    another order, its elements would be off in the last bits."""
    monkeypatch.setenv("PYFUSER_RED_BDIMX", str(bdimx))
    dispatch.clear_caches()
    g = torch.Generator().manual_seed(bdimx)
    n = 4 * bdimx + 3                     # uneven counts: the merges' weights are not 1/2
    col = torch.arange(n)                 # each thread's vector at its own scale and offset, so
    scale = 10.0 ** ((col // 4 % 7) - 3).float()      # the merges round differently by order
    x = (torch.randn(6, n, generator=g) * scale + (col % 5).float() * 0.37).float()
    f = _norm_stats_fusion(x.shape[1])
    y, mean, r = dispatch.execute_fusion(f, [x])
    mean, r = mean[:, None], r[:, None]
    assert torch.equal(y, (x - mean) * r)
    var, m = torch.var_mean(x.double(), 1, correction=0, keepdim=True)
    torch.testing.assert_close(mean.double(), m, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.double(), torch.rsqrt(var + 1e-5), rtol=1e-5, atol=0)


@pytest.mark.parametrize("bdimx", [64, 256, 512])
@pytest.mark.parametrize("build", [softmax, layer_norm], ids=["softmax", "layer_norm"])
def test_wide_teams_match_eager(build, bdimx, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_BDIMX", str(bdimx))
    dispatch.clear_caches()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 3 * bdimx + 1, generator=g) * 4
    f = fusion(build, 2, torch.float32, [1])
    if build is softmax:
        (got,) = dispatch.execute_fusion(f, [x])
        want = torch.softmax(x, 1)
    else:
        w, b = torch.randn(x.shape[1], generator=g), torch.randn(x.shape[1], generator=g)
        got = dispatch.execute_fusion(f, [x, w, b])[0]
        want = torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, eps=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_sum_and_max_over_sixteen_warps_take_every_warps_partial(op, monkeypatch):
    """Each warp's partial counts once: a row whose only large value sits in the last warp's
    share, and a sum whose terms differ by warp."""
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "512")
    dispatch.clear_caches()
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.reduction(op, x, [1]))
    x = torch.zeros(3, 512 * 4)
    x[:, -1] = torch.tensor([5.0, -2.0, 7.0])
    x[1] += torch.arange(512 * 4) // (32 * 4)          # 0 .. 15, one value a warp's share
    (got,) = dispatch.execute_fusion(f, [x])
    want = x.sum(1) if op == "sum" else x.amax(1)
    assert torch.equal(got, want)


def test_the_warp_tree_compiles_with_nvrtc(monkeypatch):
    from pyfuser.runtime import nvrtc
    from pyfuser.runtime.prepare import meta_tensor, prepare_fusion
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "256")
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    dispatch.clear_caches()
    f = _norm_stats_fusion(4096)
    sources = []
    real = nvrtc.compile_async
    monkeypatch.setattr(nvrtc, "compile_async", lambda src, name, arch: (
        sources.append((src, name, arch)), real(src, name, arch))[1])
    assert prepare_fusion(f, [meta_tensor(torch.float32, (64, 4096), (4096, 1))], "cuda",
                          "sm_90") == 1
    (src, name, arch), = sources
    assert "tshf" in src and "% 8)]" in src        # every lane reads partial lane % 8
    nvrtc.compile_cuda(src, name, arch, use_disk_cache=False)


def test_the_knob_reads_the_warps_partials_in_order(monkeypatch):
    """PYFUSER_RED_WARP_TREE=0 (an A/B knob): every thread reads the 8 partials in order; the
    results are eager's within rounding, and every thread still has the same statistics."""
    monkeypatch.setenv("PYFUSER_RED_WARP_TREE", "0")
    test_every_thread_normalizes_with_the_same_welford_statistics(256, monkeypatch)


@pytest.mark.parametrize("rlen,bdimx", [(768, None), (4096, None), (2048, "256"), (65536, None)])
def test_equal_count_merges_weigh_one_half_with_the_divisions_bits(rlen, bdimx, monkeypatch):
    """Rows a whole number of the team's steps (the plan's `whole`): every thread holds as many
    elements, so the shuffle rounds' and trees' Welford merges weigh 1/2 without dividing
    (fewer divisions in the source), and the results are the division's bits: the same kernel
    with `whole` cleared gives identical outputs."""
    from pyfuser.codegen import api
    from pyfuser.schedule import reduction_heuristics as RH
    if bdimx:
        monkeypatch.setenv("PYFUSER_RED_BDIMX", bdimx)
    g = torch.Generator().manual_seed(rlen)
    col = torch.arange(rlen)
    scale = 10.0 ** ((col // 4 % 7) - 3).float()
    x = (torch.randn(4, rlen, generator=g) * scale + (col % 5).float() * 0.37).float()
    runs = []
    for whole in (True, False):
        dispatch.clear_caches()
        if not whole:
            real = RH._inner

            def inner(p, *a, **k):
                real(p, *a, **k)
                p.whole = False
            monkeypatch.setattr(RH, "_inner", inner)
        f = _norm_stats_fusion(rlen)
        plan = api.plan_kernel(f, [x])
        assert plan.params.whole is whole
        divisions = plan.kernel.source.count("/ pf_cast<float>(wn")
        runs.append((divisions, dispatch.execute_fusion(f, [x])))
    (d_whole, got), (d_div, want) = runs
    assert d_whole < d_div
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("knob,staged_tree,held_tree", [(None, True, False), ("0", False, False),
                                                        ("1", True, True)])
def test_the_tree_by_default_only_where_the_row_is_staged(knob, staged_tree, held_tree,
                                                           monkeypatch):
    """Rows held in registers read the warps' partials in order by default (the tree's extra
    registers cost a block an SM in batch_norm training on the H200: 84 -> 99 µs); rows staged in
    shared memory merge them as a tree. The knob forces either way."""
    from pyfuser.codegen import api
    if knob is None:
        monkeypatch.delenv("PYFUSER_RED_WARP_TREE")
    else:
        monkeypatch.setenv("PYFUSER_RED_WARP_TREE", knob)
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "256")
    x = torch.randn(4, 4096)
    for stage, want in (("1", staged_tree), ("0", held_tree)):
        monkeypatch.setenv("PYFUSER_RED_STAGE", stage)
        dispatch.clear_caches()
        plan = api.plan_kernel(_norm_stats_fusion(4096), [x])
        assert bool(plan.params.stage) is (stage == "1")
        assert ("tshf" in plan.kernel.source) is want
        assert torch.equal(*(lambda y, m, r: (y, (x - m[:, None]) * r[:, None]))(
            *dispatch.execute_fusion(_norm_stats_fusion(4096), [x])))
