"""Pointwise fusions through generated CUDA kernels, checked against the reference evaluator
(eager PyTorch on the same CUDA inputs). Outputs are poisoned before every run (the executor's
PYFUSER_POISON_OUTPUTS hook, plus a caching allocator full of NaN) and checked in full."""
import math
import zlib

import pytest
import torch

import op_cases as C
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate
from pyfuser.runtime import dispatch
from pyfuser.runtime.dispatch import execute_fusion, get_executor
from pyfuser.runtime.executor import FusionExecutor

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    if torch.cuda.is_available():
        junk = torch.full((64 * 1024 * 1024,), float("nan"), device="cuda")  # 256 MiB of NaN
        del junk                                                           # back to the allocator


def kernel_executors(fusion, mode="cuda"):
    """The executors of the fusion's kernel segments (the segmenter may peel views off)."""
    from pyfuser.segment.segmenter import segment
    return [get_executor(s.fusion, mode) for s in segment(fusion).segments if s.kind == "kernel"]


def run_kernel(fusion, inputs):
    """Run through dispatch; check one generated kernel did the work; (outputs, its executor)."""
    outs = execute_fusion(fusion, inputs)
    rep = dispatch.last_report(fusion)
    assert rep is not None and rep.kernels == 1 and rep.eager_segments == 0, rep
    assert all(s.backend == "cuda" for s in rep.segments if s.kind == "kernel"), \
        f"a kernel segment ran on the evaluator: {rep}"
    (ex,) = kernel_executors(fusion)
    assert ex is not None and ex.last_run.get("fallback") is None, ex and ex.last_run
    return outs, ex


# ---- every op of the op table, every dtype it accepts ----------------------------------------
@pytest.mark.parametrize("case", C.cases(), ids=C.case_id)
def test_op_table(case):
    name, dtype = case
    built = C.build(name, dtype)
    if built is None:
        pytest.skip(f"{name} does not take {dtype} (the builder refuses it, as eager does)")
    fusion, specs = built
    xs = C.inputs(name, specs, device="cuda", seed=zlib.crc32(C.case_id(case).encode()) % 1000)
    outs, ex = run_kernel(fusion, xs)
    torch.cuda.synchronize()
    assert ex.last_run["kernels"] == 1
    C.assert_same(outs, evaluate(fusion, xs), f"{name}/{dtype}")


# ---- layouts: broadcast, non-contiguous, size-1, empty, ranks 1..5 ---------------------------
def _fma_fusion(rank, bcast_axes, contiguity):
    f = Fusion()
    with f:
        a = B.define_tensor([-1] * rank, DataType.Float, contiguity=contiguity)
        b = B.define_tensor([1 if i in bcast_axes else -1 for i in range(rank)], DataType.Half)
        c = B.define_tensor([-1], DataType.Float)
        t = B.elementwise("mul", a, b)
        f.add_output(B.elementwise("add", t, c))
        f.add_output(B.elementwise("gt", a, 0.25))
    return f


def _layout(shape, kind, gen):
    """A float32 CUDA tensor of `shape` in the given memory layout (random values)."""
    rank = len(shape)
    if kind == "sliced":
        big = torch.randn([2 * s for s in shape], generator=gen).cuda()
        return big[tuple(slice(None, None, 2) for _ in shape)]
    x = torch.randn(shape, generator=gen).cuda()
    if kind == "transposed" and rank >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "expanded" and rank >= 2 and shape[0] > 0:
        return x[:1].expand(shape)                       # stride 0 on a non-broadcast axis
    return x


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced", "expanded"])
def test_layouts(seed, kind):
    gen = torch.Generator().manual_seed(seed)
    rank = 1 + seed % 5
    sizes = [1, 2, 3, 7, 31, 64, 129, 1000]
    shape = [sizes[int(i)] for i in torch.randint(0, len(sizes), (rank,), generator=gen)]
    if seed == 3:
        shape[-1] = 0                                   # empty
    while math.prod(shape) > 4_000_000:
        shape[shape.index(max(shape))] //= 4
    bcast = {i for i in range(rank) if torch.rand(1, generator=gen).item() < 0.4}
    f = _fma_fusion(rank, bcast, [False] * rank)
    a = _layout(shape, kind, gen)
    b = torch.randn([1 if i in bcast else s for i, s in enumerate(shape)], generator=gen).half().cuda()
    c = torch.randn(shape[-1:], generator=gen).cuda()
    outs, ex = run_kernel(f, [a, b, c])
    torch.cuda.synchronize()
    C.assert_same(outs, evaluate(f, [a, b, c]), f"shape={shape} bcast={bcast} kind={kind}")


def test_contiguous_promise_broken_is_never_silently_wrong():
    f = _fma_fusion(2, set(), [True, True])
    a = torch.randn(64, 48, device="cuda").t()          # not what the definition promised
    b = torch.randn(48, 64, device="cuda").half()
    c = torch.randn(64, device="cuda")
    try:
        outs = execute_fusion(f, [a, b, c])
    except Exception as e:  # noqa: BLE001 - a clear refusal is acceptable
        assert "contig" in str(e).lower() or "stride" in str(e).lower(), e
        return
    C.assert_same(outs, evaluate(f, [a, b, c]))


# ---- > 2^31 elements (64-bit indexing) ---------------------------------------------------------
def test_more_than_2_pow_31_elements():
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip("needs ~12 GiB of free GPU memory")
    f = Fusion()
    with f:
        a = B.define_tensor([-1, -1], DataType.Char)
        b = B.define_tensor([-1], DataType.Char)
        f.add_output(B.elementwise("add", a, b))
    rows, cols = 2**20 + 1, 2048                          # 2^31 + 2048 elements
    a = torch.randint(-50, 50, (rows, cols), dtype=torch.int8, device="cuda")
    b = torch.randint(-50, 50, (cols,), dtype=torch.int8, device="cuda")
    (out,), ex = run_kernel(f, [a, b])
    ref = a + b
    assert out.shape == ref.shape and torch.equal(out, ref)
    assert torch.equal(out[-1], ref[-1])                  # the tail past 2^31
    del out, ref, a, b
    torch.cuda.empty_cache()


# ---- caches -------------------------------------------------------------------------------------
def _relu_add():
    f = Fusion()
    with f:
        a = B.define_tensor([-1, -1], DataType.Float)
        b = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.elementwise("add", B.elementwise("relu", a), b))
    return f


def test_kernel_reused_across_sizes():
    f = _relu_add()
    for shape in [(16, 16), (1024, 32), (64, 4096), (4096, 1024), (48, 16)]:  # one vector class (sizes % 16 == 0)
        a, b = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
        (out,), ex = run_kernel(f, [a, b])
        C.assert_same([out], [torch.relu(a) + b], str(shape))
    assert ex.stats["compiled"] == 1 and ex.num_kernels_compiled() == 1
    for shape in [(1, 1), (0, 5), (1, 4097), (1000, 3), (7, 4099)]:  # other signatures
        a, b = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
        (out,), ex = run_kernel(f, [a, b])
        C.assert_same([out], [torch.relu(a) + b], str(shape))


def test_disk_cache_warm_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    f = _relu_add()
    x = [torch.randn(100, 100, device="cuda"), torch.randn(100, 100, device="cuda")]
    cold = FusionExecutor(f)
    cold.run(x)
    assert cold.stats["nvrtc"] == 1 and cold.stats["disk_hits"] == 0
    warm = FusionExecutor(f)                               # a new process would look like this
    (out,) = warm.run(x)
    assert warm.stats["nvrtc"] == 0 and warm.stats["disk_hits"] == 1
    assert warm.last_run["compile_time_s"] < cold.last_run["compile_time_s"]
    C.assert_same([out], [torch.relu(x[0]) + x[1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_misaligned_inputs(dtype):
    f = Fusion()
    with f:
        a = B.define_tensor([-1, -1], DataType.from_torch(dtype))
        b = B.define_tensor([-1, -1], DataType.from_torch(dtype))
        f.add_output(B.elementwise("mul", a, b))
    n, m = 257, 129

    def make(offset):
        base = torch.randint(1, 10, (n * m + 16,), device="cuda").to(dtype)
        return base[offset:offset + n * m].view(n, m)

    runs = [(0, 0), (1, 0), (0, 3), (1, 1), (0, 0), (5, 2)]
    for oa, ob in runs:
        a, b = make(oa), make(ob)
        (out,), ex = run_kernel(f, [a, b])
        C.assert_same([out], [a * b], f"offsets {oa},{ob}")
    assert ex.num_kernels_compiled() >= 1


def test_dispatch_falls_back_for_refused_fusions(monkeypatch):
    from pyfuser.schedule import registry
    f = _relu_add()
    monkeypatch.setattr(registry, "SCHEDULERS",
                        [registry.Scheduler("pointwise", lambda fusion: (False, "test refusal"), None)])
    dispatch.clear_caches()
    x = [torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda")]
    (out,) = execute_fusion(f, x)
    assert all(s.backend == "evaluator" for s in dispatch.last_report(f).segments
               if s.kind == "kernel")
    C.assert_same([out], [torch.relu(x[0]) + x[1]])
    dispatch.clear_caches()


# ---- a view between compute ops ---------------------------------------------------------------
@pytest.mark.parametrize("shape", [[64, 128, 3072], [64, -1, 3072]], ids=["const", "inferred"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "misaligned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_view_between_compute_ops(layout, dtype, shape):
    """relu(x).view(64, 128, 3072) * w at full size (the 128 given, or inferred from -1): x read
    at the view output's row-major index (16-byte vectors when x is dense row-major and aligned),
    else the general path; equal to eager either way."""
    dt = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}[dtype]
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], dt)
        w = B.define_tensor([-1], dt)
        f.add_output(B.elementwise("mul", B.reshape(B.elementwise("relu", x), shape), w))
    if layout == "contiguous":
        xs = torch.randn(8192, 3072, device="cuda", dtype=dtype)
    elif layout == "transposed":
        xs = torch.randn(3072, 8192, device="cuda", dtype=dtype).t()
    else:
        xs = torch.randn(8192 * 3072 + 1, device="cuda", dtype=dtype)[1:].view(8192, 3072)
    ws = torch.randn(3072, device="cuda", dtype=dtype)
    (out,), ex = run_kernel(f, [xs, ws])
    C.assert_same([out], [xs.relu().reshape(64, 128, 3072) * ws], layout)
    (plan,) = [e.plan for e in ex._plans.values()]
    xa = next(a for a in plan.schedule.accesses if not a.is_store and a.sizes == (8192, 3072))
    assert xa.linear == (layout != "transposed")
    assert (plan.schedule.params.vec > 1) == (layout == "contiguous")


def test_views_in_a_chain():
    """exp(neg(x).view(64, 128, 3072)).view(8192, 3072) * w: both views keep the row-major index;
    one vectorized kernel, equal to eager."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        w = B.define_tensor([-1], DataType.Float)
        v = B.elementwise("exp", B.reshape(B.elementwise("neg", x), [64, 128, 3072]))
        f.add_output(B.elementwise("mul", B.reshape(v, [8192, 3072]), w))
    xs = torch.randn(8192, 3072, device="cuda")
    ws = torch.randn(3072, device="cuda")
    (out,), ex = run_kernel(f, [xs, ws])
    C.assert_same([out], [(-xs).view(64, 128, 3072).exp().view(8192, 3072) * ws], "chain")
    (plan,) = [e.plan for e in ex._plans.values()]
    assert plan.schedule.params.vec == 4 and any(a.linear for a in plan.schedule.accesses)
