"""The transpose scheduler on the CPU: which fusions it takes, its plan (tile vs rows, vector
width), its CUDA source compiled by NVRTC for sm_90, and its CPU interpreter against eager."""
import pytest
import torch

from pyfuser.codegen import api
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.shapes import bind
from pyfuser.schedule import transpose as TR


def plan_transpose(f, inputs):
    f.kernel_scheduler = "transpose"          # what the segmenter names for such a fusion
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "transpose"
    return plan


def interpret(plan, inputs, outputs):
    api.interpret(plan, inputs, outputs, bind(plan.fusion, inputs))


def permuted_copy(n, order, dtype=DataType.Float):
    """set(x) where x is declared with layout `order` (axes outermost first)."""
    f = Fusion()
    with f:
        so = [0] * n
        for rank, a in enumerate(order):
            so[a] = n - 1 - rank
        f.add_output(B.set_(B.define_tensor([-1] * n, dtype, stride_order=so)))
    return f


def permuted(shape, perm, dtype=torch.float32):
    """A tensor of logical `shape` whose storage is contiguous in the order `perm`."""
    src = torch.randn(*[shape[p] for p in perm]).to(dtype) if dtype.is_floating_point else \
        torch.randint(0, 100, [shape[p] for p in perm], dtype=dtype)
    return src.permute([perm.index(i) for i in range(len(perm))])


CASES = [((5, 37, 41), (0, 2, 1), "tile"), ((2, 12, 8, 4), (0, 2, 1, 3), "rows"),
         ((33, 65), (1, 0), "tile"), ((3, 4, 5, 6), (3, 1, 0, 2), "tile"),
         ((7, 1, 9), (2, 1, 0), "tile"), ((64, 128), (1, 0), "tile"), ((4, 6, 3), (1, 0, 2), "rows")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
@pytest.mark.parametrize("shape,perm,kind", CASES)
def test_plan_interpret_and_compile(shape, perm, kind, dtype):
    x = permuted(shape, perm, dtype)
    order = sorted(range(len(shape)), key=lambda a: -x.stride(a))
    f = permuted_copy(len(shape), order, DataType.from_torch(dtype) if hasattr(DataType, "from_torch")
                      else next(d for d in DataType if getattr(d, "torch", None) == dtype))
    assert TR.can_schedule(f) == (True, "")
    plan = plan_transpose(f, [x])
    assert plan.params.kind == kind
    (out,) = plan.allocate_outputs(bind(f, [x]), [x], x.device)
    out.view(torch.uint8).fill_(0x7F)
    interpret(plan, [x], [out])
    assert out.is_contiguous() and torch.equal(out, x.contiguous())
    cfg = plan.kernel.launch_config(None, [x, out])
    assert cfg.grid[0] >= 1 and cfg.block[0] * cfg.block[1] <= 1024
    nvrtc = pytest.importorskip("pyfuser.runtime.nvrtc")
    pytest.importorskip("cuda.bindings.nvrtc")
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90")


def test_seed_shape_plan_is_vectorized_rows():
    x = torch.randn(768, 128, 64).view(64, 12, 128, 64).permute(0, 2, 1, 3)
    f = permuted_copy(4, [0, 2, 1, 3])
    p = TR.schedule(f, [x])
    assert p.kind == "rows" and p.vec == 4 and p.index_type == "int"


def test_an_expanded_axis_is_a_batch_axis_of_a_rows_copy():
    """Grouped-query attention's `repeat_kv`: keys [B, S, KV, D] seen as [B, KV, S, D],
    expanded along a new axis and copied contiguous. The stride-0 axis has the smallest input
    stride; it was taken as the tile's read axis (a tile kernel 16x slower than a copy on an
    H100); the rows kernel copies D-long vectors along the rows instead."""
    v = torch.randn(2, 16, 3, 8).permute(0, 2, 1, 3)             # [B, KV, S, D], S outer
    x = v.unsqueeze(2).expand(2, 3, 2, 16, 8)
    order = sorted(range(5), key=lambda a: -x.stride(a))
    f = permuted_copy(5, order)
    plan = plan_transpose(f, [x])
    assert plan.params.kind == "rows" and plan.params.vec == 4
    (out,) = plan.allocate_outputs(bind(f, [x]), [x], x.device)
    interpret(plan, [x], [out])
    assert out.is_contiguous() and torch.equal(out, x.contiguous())
    nvrtc = pytest.importorskip("pyfuser.runtime.nvrtc")
    pytest.importorskip("cuda.bindings.nvrtc")
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90")


def test_misaligned_input_lowers_vector_width():
    x = torch.randn(2 * 12 * 8 * 4 + 1)[1:].view(2, 12, 8, 4).permute(0, 2, 1, 3)
    p = TR.schedule(permuted_copy(4, [0, 2, 1, 3]), [x])
    assert p.kind == "rows" and p.vec == 1


def test_refusals():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.set_(x))
    ok, why = TR.can_schedule(f)
    assert not ok and "not permuted" in why
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float, stride_order=[0, 1])
        f.add_output(B.elementwise("relu", B.set_(x)))
    ok, why = TR.can_schedule(f)
    assert not ok and "single copy" in why


def test_empty_tensor():
    x = torch.randn(0, 5).t()
    f = permuted_copy(2, [1, 0])
    plan = plan_transpose(f, [x])
    assert plan.kernel.launch_config(None, [x, torch.empty(5, 0)]).grid[0] == 0
    interpret(plan, [x], [torch.empty(5, 0)])


@pytest.mark.parametrize("block,unroll", [(64, 3), (32, 1), (128, 8)])
def test_rows_knobs_interpret(monkeypatch, block, unroll):
    """Any rows block / unroll covers every vector once (ragged last block included)."""
    monkeypatch.setenv("PYFUSER_TR_BLOCK", str(block))
    monkeypatch.setenv("PYFUSER_TR_UNROLL", str(unroll))
    x = permuted((3, 7, 5, 8), (0, 2, 1, 3))
    f = permuted_copy(4, [0, 2, 1, 3])
    plan = plan_transpose(f, [x])
    assert plan.params.kind == "rows" and (plan.params.block, plan.params.unroll) == (block, unroll)
    (out,) = plan.allocate_outputs(bind(f, [x]), [x], x.device)
    out.fill_(float("nan"))
    interpret(plan, [x], [out])
    assert torch.equal(out, x.contiguous())
    assert plan.kernel.launch_config(None, [x, out]).grid[0] == -(-x.numel() // plan.params.vec // (block * unroll))


@pytest.mark.parametrize("policy", ["cs", "ef", "el"])
@pytest.mark.parametrize("shape,perm,kind", [CASES[0], CASES[1]])
def test_cache_policies_compile_and_interpret(shape, perm, kind, policy, monkeypatch):
    """Loads and stores with each cache policy: named in the source, assembled by NVRTC for
    sm_90 (the prelude comes along), and the same copy."""
    monkeypatch.setenv("PYFUSER_LOAD_CACHE", policy)
    monkeypatch.setenv("PYFUSER_STORE_CACHE", policy)
    for dtype in (torch.float32, torch.float16):
        x = permuted(shape, perm, dtype)
        order = sorted(range(len(shape)), key=lambda a: -x.stride(a))
        dt = DataType.Float if dtype == torch.float32 else DataType.Half
        f = permuted_copy(len(shape), order, dt)
        plan = plan_transpose(f, [x])
        assert plan.params.kind == kind and plan.params.load_cache == policy
        src = plan.kernel.source
        assert "pf_ldc<PF_" in src and "pf_stc<PF_" in src
        (out,) = plan.allocate_outputs(bind(f, [x]), [x], x.device)
        interpret(plan, [x], [out])
        assert torch.equal(out, x.contiguous())
        nvrtc = pytest.importorskip("pyfuser.runtime.nvrtc")
        pytest.importorskip("cuda.bindings.nvrtc")
        nvrtc.compile_cuda(src, plan.kernel.name, "sm_90", use_disk_cache=False)


@pytest.mark.parametrize("shape,perm,kind", [((5, 37, 41), (0, 2, 1), "tile"),
                                             ((2, 12, 8, 4), (0, 2, 1, 3), "rows")])
@pytest.mark.parametrize("unused_first", [True, False])
def test_a_tensor_input_the_copy_does_not_read(shape, perm, kind, unused_first):
    """A fusion taking a tensor its copy does not read (AOTAutograd's functional `copy(dst,
    src)` of a permuted source: the lowering reads dst's shape and dtype only). The kernel's
    tensors are the fusion's tensor inputs then its output: the kernel read the first tensor
    input and wrote the second (DeepSeek-V3's key assembly: the unused destination read, the
    source input overwritten, the output never written)."""
    x = permuted(shape, perm)
    dst = torch.full(shape, 7.0)
    order = sorted(range(len(shape)), key=lambda a: -x.stride(a))
    so = [0] * len(shape)
    for rank, a in enumerate(order):
        so[a] = len(shape) - 1 - rank
    f = Fusion()
    with f:
        if unused_first:
            B.define_tensor([-1] * len(shape), DataType.Float)
        src = B.define_tensor([-1] * len(shape), DataType.Float, stride_order=so)
        if not unused_first:
            B.define_tensor([-1] * len(shape), DataType.Float)
        f.add_output(B.set_(src))
    inputs = [dst, x] if unused_first else [x, dst]
    before = [t.clone() for t in inputs]
    plan = plan_transpose(f, inputs)
    assert plan.params.kind == kind
    assert (plan.params.in_seg, plan.params.out_seg) == ((1, 2) if unused_first else (0, 2))
    (out,) = plan.allocate_outputs(bind(f, inputs), inputs, x.device)
    out.view(torch.uint8).fill_(0x7F)
    interpret(plan, inputs, [out])
    assert torch.equal(out, x.contiguous())
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))     # no input written
    assert plan.kernel.launch_config(None, inputs + [out]).grid[0] >= 1
    nvrtc = pytest.importorskip("pyfuser.runtime.nvrtc")
    pytest.importorskip("cuda.bindings.nvrtc")
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90")
