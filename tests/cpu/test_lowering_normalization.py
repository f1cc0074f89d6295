"""TorchScript reductions and normalizations through pyfuser.jit against eager, both CPU
executors: each runs fused (one group, kernels for every reduction domain, no fallback) and gives
eager's dtype, shape and values within the tolerances of docs/reductions.md."""
import pytest
import torch

import pyfuser

F = torch.nn.functional
MODES = ["evaluator", "interpret"]


class LayerNorm(torch.nn.Module):
    __constants__ = ["n"]

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, w, b):
        return F.layer_norm(x, [self.n], w, b, 1e-5)


class RMSNorm(torch.nn.Module):
    __constants__ = ["n"]

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, w):
        return F.rms_norm(x, [self.n], w)


def softmax_f32(x):
    return torch.softmax(x, -1, dtype=torch.float32)


def log_softmax0(x):
    return torch.log_softmax(x, 0)


def var_std(x):
    return torch.var(x, 1, keepdim=True), torch.std(x, [0], correction=0)


def var_mean(x):
    return torch.var_mean(x, -1)


def std_mean(x):
    return torch.std_mean(x, [0, 1], keepdim=True)


def amax_amin(x):
    return torch.amax(x, 1) - torch.amin(x, 1)


def max_values(x):
    return torch.max(x, 1)[0] + torch.min(x, 0, keepdim=True)[0].sum()


def logsumexp(x):
    return torch.logsumexp(x, 1)


def sum_to(x):
    return x.sum_to_size([1, x.size(1)]) * 2


def mean_half(x):
    return x.mean(-1)


def batch_norm_train(x, w, b):
    return F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)


def ce_mean(x, t):
    return F.cross_entropy(x, t)


def group_norm_silu(x, w, b):
    return F.silu(F.group_norm(x, 4, w, b, 1e-5))


def group_norm_plain(x):
    return F.group_norm(x, 3)


def native_group_norm(x, w, b):
    return torch.native_group_norm(x, w, b, x.shape[0], x.shape[1], x.shape[2] * x.shape[3],
                                   2, 1e-6)


def ce_none(x, t):
    return F.cross_entropy(x, t, reduction="none", ignore_index=2)


def ce_sum(x, t):
    return F.cross_entropy(x, t, reduction="sum")


def ce_probs(x, p):
    return F.cross_entropy(x, p)


def residual_layer_norm(x, r, w, b):
    return F.layer_norm(x + r, [x.size(-1)], w, b)


def _rows(dt=torch.float32, m=13, n=77, params=0):
    return lambda: [torch.randn(m, n).to(dt)] + [torch.randn(n).to(dt) for _ in range(params)]


CASES = [
    ("layer_norm", LayerNorm(77), _rows(params=2), 1e-5),
    ("layer_norm_bf16", LayerNorm(77), _rows(torch.bfloat16, params=2), 1.6e-2),
    ("rms_norm", RMSNorm(77), _rows(params=1), 1e-5),
    ("rms_norm_half", RMSNorm(77), _rows(torch.float16, params=1), 2e-3),
    ("softmax_f32_of_bf16", softmax_f32, _rows(torch.bfloat16), 1e-5),
    ("log_softmax_dim0", log_softmax0, _rows(), 1e-5),
    ("var_std", var_std, _rows(), 1e-5),
    ("var_mean", var_mean, _rows(), 1e-5),
    ("std_mean_keepdim", std_mean, _rows(), 1e-5),
    ("amax_amin", amax_amin, _rows(), 0),
    ("max_min_values", max_values, _rows(), 1e-5),
    ("logsumexp", logsumexp, lambda: [torch.cat([torch.full((1, 77), float("-inf")),
                                                 torch.randn(12, 77)])], 1e-5),
    ("sum_to_size", sum_to, _rows(), 1e-5),
    ("mean_half", mean_half, _rows(torch.float16), 2e-3),
    ("batch_norm_train", batch_norm_train,
     lambda: [torch.randn(4, 6, 5, 7), torch.randn(6), torch.randn(6)], 1e-5),
    ("cross_entropy", ce_mean, lambda: [torch.randn(13, 77), torch.randint(0, 77, (13,))], 1e-5),
    ("cross_entropy_none_ignore", ce_none,
     lambda: [torch.randn(13, 77), torch.tensor([2, 5] * 6 + [76])], 1e-5),
    ("cross_entropy_sum_bf16", ce_sum,
     lambda: [torch.randn(13, 77).bfloat16(), torch.randint(0, 77, (13,))], 1.6e-2),
    ("cross_entropy_probs", ce_probs,
     lambda: [torch.randn(13, 77), torch.softmax(torch.randn(13, 77), 1)], 1e-5),
    ("residual_layer_norm_symbolic_shape", residual_layer_norm, _rows(params=3), 1e-5),
    ("group_norm_silu", group_norm_silu,
     lambda: [torch.randn(3, 8, 5, 7), torch.randn(8), torch.randn(8)], 1e-5),
    ("group_norm_bf16", group_norm_silu,
     lambda: [torch.randn(2, 8, 6).bfloat16(), torch.randn(8).bfloat16(),
              torch.randn(8).bfloat16()], 1.6e-2),
    ("group_norm_5d_no_affine", group_norm_plain, lambda: [torch.randn(2, 6, 3, 4, 5)], 1e-5),
    ("native_group_norm_stats", native_group_norm,
     lambda: [torch.randn(2, 6, 4, 5), torch.randn(6), torch.randn(6)], 1e-5),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,fn,make,tol", CASES, ids=[c[0] for c in CASES])
def test_fused_and_equal_to_eager(name, fn, make, tol, mode):
    torch.manual_seed(0)
    args = make()
    f = pyfuser.jit(torch.jit.script(fn), cpu_executor=mode)
    got, want = f(*args), fn(*args)
    got = list(got) if isinstance(got, tuple) else [got]
    want = list(want) if isinstance(want, tuple) else [want]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)
    st = f.last_run
    tensor_fallbacks = [fb for fb in st.fallbacks if "an output is not a tensor" not in fb["reason"]]
    assert not tensor_fallbacks and st.eager_groups == 0 and st.eager_segments == 0, st
    assert st.groups == 1 and st.kernels >= 1


def test_grid_reduction_through_the_executor():
    """sum over the rows of a tall, narrow tensor: blocks split the rows (a grid reduction with
    workspaces), through pyfuser.jit's executor in both CPU modes."""
    def colsum(x):
        return x.sum(0) * 2
    x = torch.randn(4096, 64)
    for mode in MODES:
        f = pyfuser.jit(torch.jit.script(colsum), cpu_executor=mode)
        torch.testing.assert_close(f(x), colsum(x), rtol=1e-5, atol=1e-4)
    from pyfuser.codegen import api
    from pyfuser.segment.segmenter import segment
    from pyfuser.frontend.lowering import lower_graph
    from pyfuser.frontend.torchscript.from_torch import graph_from_function
    fusion = lower_graph(graph_from_function(torch.jit.script(colsum)), [x]).fusion
    seg = next(s for s in segment(fusion).segments if s.kind == "kernel")
    assert api.plan_kernel(seg.fusion, [x]).params.splits > 1


def test_cross_entropy_out_of_range_class_is_nan():
    """Eager raises for a class index out of range; the fused kernel gives NaN, never a number."""
    f = pyfuser.jit(torch.jit.script(ce_none), cpu_executor="interpret")
    x, t = torch.randn(3, 5), torch.tensor([1, 7, 2])
    out = f(x, t)
    assert torch.isnan(out[1]) and out[2] == 0 and not torch.isnan(out[0])


def bn_train_running(x, w, b, rm, rv):
    return torch.relu(F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,dt,channels_last", [
    ((4, 6, 5, 7), torch.float32, False), ((3, 5, 4, 4), torch.float32, True),
    ((2, 8, 3), torch.float32, False), ((4, 6, 5, 7), torch.bfloat16, False),
    ((4, 6, 5, 7), torch.float64, False)])
def test_batch_norm_training_updates_running_statistics(shape, dt, channels_last, mode):
    """Training batch norm with running statistics is one kernel that also updates the running
    mean and (unbiased) variance in place, as eager does; half / bfloat16 inputs with float
    statistics (mixed precision). Per-channel statistics are written by the kernel itself."""
    torch.manual_seed(3)
    x = torch.randn(*shape).to(dt)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    C = shape[1]
    pdt = torch.float32 if dt == torch.bfloat16 else dt
    w, b = torch.randn(C, dtype=pdt), torch.randn(C, dtype=pdt)
    rm, rv = torch.randn(C, dtype=pdt), torch.rand(C, dtype=pdt) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    f = pyfuser.jit(torch.jit.script(bn_train_running), cpu_executor=mode)
    got, want = f(x, w, b, rm, rv), bn_train_running(x, w, b, rm2, rv2)
    tol = 1.6e-2 if dt == torch.bfloat16 else 1e-5
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(rm, rm2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rv, rv2, rtol=1e-5, atol=1e-6)
    st = f.last_run
    assert st.groups == 1 and st.kernels == 1 and not st.fallbacks and st.eager_groups == 0, st


TRAINING_BATCH_NORM_IR = """graph(%x : Tensor, %w : Tensor, %b : Tensor, %rm : Tensor, %rv : Tensor):
  %t : bool = prim::Constant[value=1]()
  %m : float = prim::Constant[value=0.1]()
  %e : float = prim::Constant[value=1.0000000000000001e-05]()
  %y : Tensor = aten::batch_norm(%x, %w, %b, %rm, %rv, %t, %m, %e, %t)
  return (%y)"""


def training_batch_norm_fusion(x, w, b, rm, rv):
    """The Fusion of a training batch norm that updates its running statistics in place
    (TRAINING_BATCH_NORM_IR lowered for these example inputs)."""
    from pyfuser.frontend.lowering import lower_graph
    from pyfuser.frontend.torchscript import parse_ir
    return lower_graph(parse_ir(TRAINING_BATCH_NORM_IR), [x, w, b, rm, rv]).fusion


def test_running_statistics_written_by_the_kernel_itself():
    """The per-channel running statistics of an NCHW batch norm are stores of the kernel into
    the running tensors (no copy afterwards): the plan says so and the pointers drop restrict."""
    from pyfuser.codegen import api
    x, w, b = torch.randn(4, 6, 5, 7), torch.randn(6), torch.randn(6)
    rm, rv = torch.zeros(6), torch.ones(6)
    fusion = training_batch_norm_fusion(x, w, b, rm, rv)
    assert len(fusion.aliases) == 2
    plan = api.plan_kernel(fusion, [x, w, b, rm, rv])
    assert sorted(plan.inplace.values()) == [3, 4] and "__restrict__" in plan.kernel.source
    src = plan.kernel.source[plan.kernel.source.index('extern "C"'):]
    for j in (3, 4):
        assert f"const float* T{fusion.inputs[j].number}," in src.replace("\n", "")
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)


class _BN(torch.nn.Module):
    def __init__(self, momentum):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(6, momentum=momentum)

    def forward(self, x):
        return self.bn(x) * 2


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_module_in_training(momentum):
    """nn.BatchNorm2d in train mode, scripted: the momentum (or the cumulative average factor
    1 / num_batches_tracked, computed on the host) reaches the kernel as a scalar."""
    m = _BN(momentum).train()
    ref = _BN(momentum).train()
    ref.load_state_dict(m.state_dict())
    f = pyfuser.jit(torch.jit.script(m), cpu_executor="interpret")
    for step in range(3):
        x = torch.randn(4, 6, 5, 5) + step
        with torch.no_grad():
            torch.testing.assert_close(f(x), ref(x), rtol=1e-5, atol=1e-5)
        for (name, a), (_, e) in zip(m.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=name)
    st = f.last_run
    assert st.eager_groups == 0 and not [fb for fb in st.fallbacks
                                         if "batch_norm" in fb.get("kind", "")], st


@pytest.mark.parametrize("splits", [5, 13, 40])
def test_grid_combine_spreads_the_partials_over_the_block_rows(splits, monkeypatch):
    """The last block of a grid reduction reads the splits' partials, row ty of the block
    those of z = ty, ty + bdimy, ... (some rows none), then its rows meet in the shared-memory
    tree: sums, maxima and Welford triples equal eager's, the same bits on a second run, and
    NVRTC compiles the kernels."""
    from pyfuser.codegen import api
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.runtime import dispatch, nvrtc
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("PYFUSER_RED_SPLITS", str(splits))
    clear_cache()                      # plan here, with this knob (plans are kept per fusion)
    dispatch.clear_caches()
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])

    def f(x):
        v, m = torch.var_mean(x, 0)
        return x.sum(0), x.amax(0), v, m
    x = torch.randn(1000, 24)
    with torch.no_grad():
        fn = pyfuser.compile(f)
        got, again = fn(x), fn(x)
    for g, a, w in zip(got, again, f(x)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)
        assert torch.equal(g, a)
    grid = [p for p in plans if getattr(p.params, "splits", 1) == splits]
    assert grid and all(p.params.bdimy > 1 for p in grid)
    for p in grid:
        assert "z = ((nidx_t)threadIdx.y);" in p.kernel.source   # the rows share the partials
        assert nvrtc.compile_cuda(p.kernel.source, p.kernel.name, "sm_90") is not None


def test_grid_combine_of_bfloat16_welford_fits_shared_memory(monkeypatch):
    """The grid combine's tree reuses the block tree's shared arrays: a bfloat16 var_mean over
    the rows (vectors of 8, three float32 Welford arrays of 8 x 256) used them twice, 48 KB and
    more, and ptxas refused the kernel. It compiles, and equals eager."""
    from pyfuser.codegen import api
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.runtime import dispatch, nvrtc
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "6")
    clear_cache()
    dispatch.clear_caches()
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])
    x = torch.randn(1000, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        got = pyfuser.compile(lambda t: torch.var_mean(t, 0))(x)
    for g, w in zip(got, torch.var_mean(x, 0)):
        torch.testing.assert_close(g, w)
    (p,) = [p for p in plans if getattr(p.params, "splits", 1) == 6]
    assert p.params.vec == 8 and p.kernel.source.count("__shared__ float") == 2
    assert nvrtc.compile_cuda(p.kernel.source, p.kernel.name, "sm_90") is not None


@pytest.mark.parametrize("splits", [None, 4])
def test_grid_split_stores_per_column_values_once(splits, monkeypatch):
    """A per-column value computed before the grid combine (`t * 3 + 1`, a cross-entropy's
    targets of a transposed input) was stored by every block of blockIdx.z: the same element
    written by several blocks, which the interpreter's race check flags. Block 0 of the splits
    stores it now (the last block, values after the combine); equal to eager, with and without
    $PYFUSER_RED_SPLITS (the default splits 2100 x 7 too)."""
    from pyfuser.codegen import api
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.runtime import dispatch
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("PYFUSER_INTERP_RACECHECK", "1")
    if splits:
        monkeypatch.setenv("PYFUSER_RED_SPLITS", str(splits))
    clear_cache()
    dispatch.clear_caches()
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])

    def f(x, t):
        y = t * 3 + 1
        s = (x * y).sum(0)
        return y, s, s * y
    x, t = torch.randn(2100, 7), torch.arange(7.0)
    with torch.no_grad():
        got = pyfuser.compile(f)(x, t)
    for g, w in zip(got, f(x, t)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)
    (p,) = [p for p in plans if getattr(p.params, "splits", 1) > 1]
    assert "(((nidx_t)blockIdx.z) == 0)" in p.kernel.source


@pytest.mark.parametrize("device,want", [("cuda", torch.float32), ("cpu", torch.bfloat16),
                                         (None, None)], ids=str)
def test_native_layer_norm_statistics_follow_the_device(device, want):
    """native_layer_norm's mean and rstd of a bfloat16 input: float on CUDA, bfloat16 on the CPU
    (eager's dtypes); not given where the frontend does not name the device (TorchScript)."""
    from pyfuser.frontend.lowering.aten_reduction import _native_layer_norm
    from pyfuser.frontend.lowering.device import device_type, lowering_device
    from pyfuser.frontend.lowering.lower import tensor_input
    from pyfuser.ir.fusion import Fusion
    with Fusion(), lowering_device(device):
        x = tensor_input(torch.bfloat16, [4, 8], [8, 1], "x")
        y, mean, rstd = _native_layer_norm(x, [8], None, None, 1e-5)
    assert device_type() is None and y.dtype.torch is torch.bfloat16
    if want is None:
        assert mean is None and rstd is None
    else:
        assert mean.dtype.torch is want and rstd.dtype.torch is want and mean.ndim == 2


def test_native_layer_norm_statistics_of_bfloat16_through_torchscript():
    """A TorchScript group is lowered on its first call's inputs, which name the device: the
    bfloat16 statistics of native_layer_norm fuse with eager's dtype (they were left to eager)."""
    def fn(x, w, b):
        y, m, r = torch.native_layer_norm(x, [24], w, b, 1e-5)
        return y * 2.0, m, r
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen).to(torch.bfloat16) for s in ((6, 24), (24,), (24,)))
    f = pyfuser.jit(torch.jit.script(fn))
    with torch.no_grad():
        got = f(x, w, b)
    assert not f.last_run.fallbacks, f.last_run.fallbacks
    for g, e in zip(got, fn(x, w, b)):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e.float(), rtol=1.6e-2, atol=1e-2)
