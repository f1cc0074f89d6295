"""Reduction and normalization kernels on the GPU: every builder of reduction_cases over inner,
outer and mixed axes and several layouts, against eager (the reference evaluator on the same CUDA
inputs); bit-identical results from run to run (no atomics in any combine); the CPU interpreter
of the same kernel agrees with the GPU within rounding; TorchScript models with layer_norm,
softmax and RMSNorm run as one kernel per normalization."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
import reduction_cases as RC  # noqa: E402
from pyfuser.ir.evaluator import evaluate  # noqa: E402
from pyfuser.runtime import dispatch  # noqa: E402
from pyfuser.runtime.dispatch import execute_fusion  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [((37, 300), [1]), ((300, 37), [0]), ((6, 5, 7), [0, 2]), ((64, 1031), [1]),
          ((4, 3, 5, 6), [1, 2]), ((256, 3072), [1]), ((2048, 64), [0]), ((16, 65536), [1]),
          ((3, 5), [0, 1]), ((129, 1), [0])]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")


def run(builder, shape, axes, dt, layout="contiguous"):
    f = RC.fusion(builder, len(shape), dt, axes)
    gen = torch.Generator().manual_seed(len(shape) * 1000 + sum(shape))
    xs = [x.cuda() for x in RC.inputs_for(f, shape, dt, axes, layout, gen)]
    outs = execute_fusion(f, xs)
    rep = dispatch.last_report(f)
    assert rep.eager_segments == 0 and rep.launched >= 1, rep
    want = evaluate(f, xs)
    n = 1
    for a in axes:
        n *= shape[a]
    for i, (g, w) in enumerate(zip(outs, want)):
        RC.check_close(g, w, builder.__name__, n, f"{builder.__name__} {shape} {axes} {dt} "
                       f"{layout} output {i}")
    return f, xs, outs


@pytest.mark.parametrize("shape,axes", SHAPES, ids=[f"{s}-{a}" for s, a in SHAPES])
@pytest.mark.parametrize("builder", RC.FLOAT_BUILDERS, ids=lambda b: b.__name__)
def test_float32(builder, shape, axes):
    run(builder, shape, axes, torch.float32)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,axes", [SHAPES[0], SHAPES[1], SHAPES[5], SHAPES[7]],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.mean, RC.softmax, RC.layer_norm,
                                     RC.rms_norm, RC.var_mean], ids=lambda b: b.__name__)
def test_other_dtypes(builder, shape, axes, dt):
    run(builder, shape, axes, dt)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.softmax, RC.layer_norm],
                         ids=lambda b: b.__name__)
def test_layouts(builder, layout):
    run(builder, (96, 515), [1], torch.float32, layout)


@pytest.mark.parametrize("dt", [torch.int32, torch.int64])
@pytest.mark.parametrize("builder", RC.INT_BUILDERS, ids=lambda b: b.__name__)
def test_integers(builder, dt):
    run(builder, (37, 300), [1], dt)
    run(builder, (300, 37), [0], dt)


@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.softmax, RC.layer_norm, RC.welford],
                         ids=lambda b: b.__name__)
def test_bit_identical_runs(builder):
    f, xs, first = run(builder, (512, 3000), [1], torch.float32)
    for _ in range(3):
        again = execute_fusion(f, xs)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.softmax, RC.layer_norm],
                         ids=lambda b: b.__name__)
def test_interpreter_agrees_with_the_gpu(builder):
    f, xs, gpu = run(builder, (64, 1031), [1], torch.float32)
    cpu = execute_fusion(f, [x.cpu() for x in xs], mode="interpret")
    for g, c in zip(gpu, cpu):
        torch.testing.assert_close(g.cpu(), c, rtol=1e-6, atol=1e-6)


def _block(x, w, b, g):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
    a = torch.softmax(h * 0.125, -1)
    r = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    return r + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torchscript_normalizations_are_one_kernel_each(dtype):
    import pyfuser
    f = pyfuser.jit(torch.jit.script(_block))
    x = torch.randn(64, 768, device="cuda", dtype=dtype)
    w, b, g = (torch.randn(768, device="cuda", dtype=dtype) for _ in range(3))
    out = f(x, w, b, g)
    want = _block(x, w, b, g)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    st = f.last_run
    assert st.eager_groups == 0 and st.eager_segments == 0, st
    assert st.kernels <= 3, st          # layer_norm, softmax, RMSNorm(+ residual): at most one each


def _bn_train(x, w, b, rm, rv):
    return torch.relu(torch.nn.functional.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5))


@pytest.mark.parametrize("shape,channels_last", [((32, 64, 28, 28), False), ((8, 256, 7, 7), False),
                                                 ((16, 32, 14, 14), True), ((4, 512, 1, 1), False)])
def test_batch_norm_training_updates_running_statistics(shape, channels_last):
    """One kernel computes y and writes the running statistics in place (per-channel stores of
    the kernel, or copies after it), the same as eager's cuDNN / native kernels within rounding;
    three calls in a row (the running statistics feed the next call)."""
    import pyfuser
    torch.manual_seed(0)
    C = shape[1]
    w, b = torch.randn(C, device="cuda"), torch.randn(C, device="cuda")
    rm, rv = torch.randn(C, device="cuda"), torch.rand(C, device="cuda") + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    f = pyfuser.jit(torch.jit.script(_bn_train))
    for _ in range(3):
        x = torch.randn(*shape, device="cuda")
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        torch.testing.assert_close(f(x, w, b, rm, rv), _bn_train(x, w, b, rm2, rv2),
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(rm, rm2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rv, rv2, rtol=1e-5, atol=1e-5)
        assert f.last_run.kernels == 1 and not f.last_run.fallbacks, f.last_run


def _gn_silu(x, w, b):
    return torch.nn.functional.silu(torch.nn.functional.group_norm(x, 32, w, b, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_norm(dtype):
    import pyfuser
    x = torch.randn(4, 128, 32, 32, device="cuda", dtype=dtype)
    w, b = (torch.randn(128, device="cuda", dtype=dtype) for _ in range(2))
    f = pyfuser.jit(torch.jit.script(_gn_silu))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(f(x, w, b), _gn_silu(x, w, b), rtol=tol, atol=tol)
    assert f.last_run.eager_groups == 0 and f.last_run.eager_segments == 0, f.last_run
