"""The TorchScript fuser on CUDA at full size: seed 000 (as given, with `mul_`, with `add_`+`mul_`)
and seed 003 run through `pyfuser.jit` as one group and one kernel (counted by the fuser and by
torch.profiler over one call, inputs made before it), with the eager runner's results; other
input signatures on CUDA get their own kernels with the right result; `pyfuser run --device cuda
--json`."""
import json

import pytest
import torch

from pyfuser.cli import main
from pyfuser.frontend.torchscript import make_inputs, parse_ir, run_graph
from pyfuser.frontend.torchscript.fuse_api import jit
from pyfuser.frontend.torchscript.jit import eager_handler

SEED000 = ["examples/seed000_mul.ir", "examples/seed000_mul_inplace.ir",
           "examples/seed000_add_mul_inplace.ir"]
SEED003 = "examples/seed003_bn_add_relu.ir"


def _load(path):
    with open(path) as f:
        return parse_ir(f.read(), filename=path)


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _eager(g, inputs):
    return run_graph(g, _clone(inputs), device="cuda", node_handler=eager_handler)


def _kernel_names(fn) -> list:
    """Names of the CUDA kernels one call of `fn` launches (after a warm-up call); memcpy and
    memset are not kernels. Inputs are made by the caller before, so their fill/copy kernels
    are never in the profile."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        low = e.name.lower()
        if "memcpy" in low or "memset" in low:
            continue
        names.append(e.name)
    return names


def _pyfuser_kernels(names) -> list:
    return [n for n in names if n.startswith("pf_")]


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("path", SEED000)
def test_seed000_one_kernel_full_size(path):
    g = _load(path)
    f = jit(g)
    inputs = make_inputs(g, device="cuda", seed=0)
    assert tuple(inputs[0].shape) == (10000, 13000)
    ref = _eager(g, inputs)
    out = f(*inputs)
    assert out.dtype == ref[0].dtype == torch.int64 and out.is_cuda
    assert torch.equal(out, ref[0])
    stats = f.last_run
    assert stats.groups == 1 and stats.kernels == 1 and stats.fallbacks == []
    assert stats.eager_groups == 0
    names = _kernel_names(lambda: f(*inputs))
    assert len(names) == 1 and len(_pyfuser_kernels(names)) == 1, names
    assert f.last_run.kernels == 1


@pytest.mark.gpu
def test_seed003_one_kernel_full_size():
    g = _load(SEED003)
    f = jit(g)
    inputs = make_inputs(g, device="cuda", seed=0)
    assert tuple(inputs[0].shape) == (8, 256, 56, 56)
    ref = _eager(g, inputs)
    out = f(*inputs)
    torch.testing.assert_close(out, ref[0], rtol=1e-5, atol=1e-5)
    stats = f.last_run
    assert stats.groups == 1 and stats.kernels == 1 and stats.eager_groups == 0
    assert stats.fallbacks == []
    fused = _kernel_names(lambda: f(*inputs))
    # inference batch norms, add and relu: the whole graph is one kernel
    assert len(fused) == 1 and len(_pyfuser_kernels(fused)) == 1, fused


@pytest.mark.gpu
@pytest.mark.parametrize("path", SEED000)
def test_seed000_other_signatures_on_cuda(path):
    g = _load(path)
    f = jit(g)
    inputs = make_inputs(g, device="cuda", seed=1, size_override=512)
    assert torch.equal(f(*inputs), _eager(g, inputs)[0])
    assert f.last_run.kernels == 1

    # another dtype: %2 int64 instead of int32; a non-contiguous input of the same shape: each
    # its own lowering and kernel (twice: the checked call, then the plan)
    dtype = list(inputs)
    dtype[2] = inputs[2].to(torch.int64)
    strided = list(inputs)
    strided[1] = inputs[1].t().contiguous().t()
    assert not strided[1].is_contiguous()
    for other in (dtype, strided, inputs):
        for _ in range(2):
            out, ref = f(*_clone(other)), _eager(g, other)[0]
            assert out.dtype == ref.dtype and torch.equal(out, ref)
            assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1


def _fn(x, y):
    return torch.relu(x * y + 1.0)


@pytest.mark.gpu
def test_scripted_guard_failures_on_cuda():
    f = jit(torch.jit.script(_fn))
    x, y = torch.randn(1024, 768, device="cuda"), torch.randn(1024, 768, device="cuda")
    torch.testing.assert_close(f(x, y), _fn(x, y))
    assert f.last_run.kernels == 1
    xd, yd = x.double(), y.double()
    out = f(xd, yd)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _fn(xd, yd))
    assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1
    xs = torch.randn(768, 1024, device="cuda").t()
    torch.testing.assert_close(f(xs, y), _fn(xs, y))
    assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1
    x2, y2 = torch.randn(300, 77, device="cuda"), torch.randn(300, 77, device="cuda")
    torch.testing.assert_close(f(x2, y2), _fn(x2, y2))          # new size, same layout
    assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0


@pytest.mark.gpu
@pytest.mark.parametrize("path", [SEED003, SEED000[2]])
def test_run_json_on_cuda(capsys, path):
    rc = main(["run", path, "--device", "cuda", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert rep["groups"] == 1 and rep["kernels"] == 1 and rep["matches_eager"] is True
    assert rep["executor"] == "cuda"
    assert rep["host_segments"] == (1 if path == SEED003 else 0)   # seed 003: [256] params broadcast as views


def _size_and_dtype_reads(x, y):
    z = x * y + 1.0
    return torch.relu(z), z.size(0), z.dtype, z.size()


@pytest.mark.gpu
def test_size_and_dtype_reads_are_answered_on_the_host():
    """z, read only by size/dtype, is not a kernel output: one kernel writes relu(z) alone, and
    the sizes and dtype equal the scripted function's, for two sizes."""
    s = torch.jit.script(_size_and_dtype_reads)
    f = jit(s)
    for shape in [(4096, 1024), (1000, 1024)]:
        x, y = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
        got, want = f(x, y), s(x, y)
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
        assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0
    (runner,) = f.runners.values()
    assert len(runner.lowered.fusion.outputs) == 1


def _expand_of_contiguous(x):
    v = x.contiguous()
    e = v.expand(3, x.shape[0])
    return torch.addcmul(e, x, v, value=0.5), e, v.view(-1, 2)


@pytest.mark.gpu
def test_contiguous_of_a_contiguous_input_is_the_input_on_cuda():
    """Program fuzz seed 640300 on CUDA, through the cached fast path (several calls): the
    contiguous() of a contiguous input is the input, so the expand and the view returned are
    views of it with eager's strides; a transposed input's contiguous() is a copy."""
    f = jit(torch.jit.script(_expand_of_contiguous))
    x = torch.randn(4096, device="cuda")
    for _ in range(4):
        r, e, v = f(x)
        wr, we, wv = _expand_of_contiguous(x)
        torch.testing.assert_close(r, wr)
        assert e.stride() == we.stride() == (0, 1) and e.data_ptr() == x.data_ptr()
        assert v.data_ptr() == x.data_ptr() and torch.equal(v, wv)
        assert f.last_run.kernels == 1
    y = torch.randn(64, 64, device="cuda").t()[0]          # a strided vector: copied
    for _ in range(3):
        r, e, v = f(y)
        wr, we, wv = _expand_of_contiguous(y)
        torch.testing.assert_close(r, wr)
        assert torch.equal(e, we) and torch.equal(v, wv) and v.data_ptr() != y.data_ptr()
