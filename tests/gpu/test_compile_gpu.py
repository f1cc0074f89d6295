"""The torch.compile backend on CUDA: training steps of HF BERT / GPT-2 / Llama and ResNet-18
match eager (float32 against a float64 oracle, bfloat16 autocast loosely), fused regions run as
CUDA kernels, random numbers are the CPU interpreter's bits and follow torch's CUDA generator,
and dynamic shapes reuse graphs and kernels."""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.ir import builder as B
from pyfuser.ir import philox
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch, rng

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import train_corpus as TC  # noqa: E402
from train_corpus import assert_as_close_as_eager  # noqa: E402

GPU_SIZE = dataclasses.replace(TC.SMALL, batch=4, seq=64, hidden=128, heads=4, vocab=512)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "resnet18", "t5", "vit", "swin",
                                  "wav2vec2", "electra", "clip"])
def test_training_step_on_cuda_matches_eager(name):
    """Swin (roll), Wav2Vec2 (group norm's and weight norm's backward), ELECTRA (BCE with
    logits), CLIP (lookups split from a layer norm): the eighteenth session's lowerings."""
    case = TC.TRAIN_CASES[name]("cuda", GPU_SIZE if name in ("bert", "gpt2", "llama", "t5", "vit")
                                else TC.SMALL)
    runs, losses = TC.steps_beside_eager(name, case, pyfuser.compile(case.model))
    assert_as_close_as_eager(*losses, "loss")
    grads = [TC.grads(m) for m, _, _ in runs]
    for k in grads[1]:
        # cuBLAS / cuDNN pick their algorithms per shape: eager's own error is the yardstick
        assert_as_close_as_eager(grads[0][k], grads[1][k], grads[2][k], k, factor=8)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions and all(r.eager_calls == 0 for r in regions)
    for r in regions:                   # every region's kernels launched on the GPU
        report = dispatch.last_report(r.fusion)
        assert report is not None and report.eager_segments == 0, (r, report)
        assert all(s.backend == "cuda" for s in report.segments if s.kind == "kernel"), report


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_bf16_autocast_training_step_on_cuda(name):
    case = TC.TRAIN_CASES[name]("cuda", GPU_SIZE)
    ref = copy.deepcopy(case.model)
    cm = pyfuser.compile(case.model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = case.loss(cm(**case.inputs))
        want = case.loss(ref(**case.inputs))
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss.float(), want.float(), rtol=2e-2, atol=2e-2)
    g, rg = TC.grads(case.model), TC.grads(ref)
    for k in rg:
        cos = F.cosine_similarity(g[k].flatten().float(), rg[k].flatten().float(), dim=0)
        assert cos > 0.98 or rg[k].abs().max() < 1e-6, (k, cos)


def _rand_fusion(shape, ops=2):
    f = Fusion()
    with f:
        x = B.define_tensor([-1] * len(shape), DataType.Float)
        us = [B.rand([d.extent for d in x.logical], DataType.Float) for _ in range(ops)]
        f.add_output(B.elementwise("mul", x, B.elementwise("lt", us[0], 0.7)))
        for u in us:
            f.add_output(u)
    return f


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 1000), (4, 333, 77), (8192, 4096)])
def test_gpu_kernel_draws_the_cpu_interpreters_bits(shape):
    f, g = _rand_fusion(shape), _rand_fusion(shape)
    x = torch.randn(shape)
    with rng.fixed(0xDEADBEEF12345, 1 << 33):
        gpu = dispatch.execute_fusion(f, [x.cuda()])
    assert dispatch.run_summary(f)["launched"] == 1
    n = x.numel()
    idx = torch.arange(n)
    for k in range(2):
        want = philox.uniform(0xDEADBEEF12345, 1 << 33, k, idx, 24).view(shape)
        assert torch.equal(gpu[1 + k].cpu(), want)
    if n <= 1 << 20:                      # the interpreter at full size where it is quick
        with rng.fixed(0xDEADBEEF12345, 1 << 33):
            cpu = dispatch.execute_fusion(g, [x])
        for a, b in zip(gpu, cpu):
            assert torch.equal(a.cpu(), b)


def _rand_norm_fusion(shape, dtype):
    """u = rand (dtype), y = x * (u < 0.75), the row sums of y and y minus them: a reduction
    kernel drawing random numbers (one Philox block per four lanes when vectorized)."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1] * len(shape), DataType.Float)
        u = B.rand([d.extent for d in x.logical], dtype)
        y = B.elementwise("mul", x, B.elementwise("lt", u, 0.75))
        f.add_output(B.elementwise("sub", y, B.reduction("sum", y, [-1], keepdim=True)))
        f.add_output(u)
    return f


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype", [((512, 768), DataType.BFloat16),
                                         ((64, 1000), DataType.Float),
                                         ((6, 4096), DataType.Float)])
def test_gpu_reduction_kernel_draws_the_reference_numbers(shape, dtype):
    f = _rand_norm_fusion(shape, dtype)
    x = torch.randn(shape)
    with rng.fixed(77, 12):
        gpu = dispatch.execute_fusion(f, [x.cuda()])
    report = dispatch.last_report(f)
    assert report.launched == 1 and report.segments[-1].scheduler == "inner_persistent", report
    digits = {DataType.Float: 24, DataType.BFloat16: 8}[dtype]
    want = philox.uniform(77, 12, 0, torch.arange(x.numel()), digits).view(shape)
    assert torch.equal(gpu[1].cpu().float(), want)
    y = x * (want < 0.75)
    torch.testing.assert_close(gpu[0].cpu(), y - y.sum(-1, keepdim=True), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_dropout_backward_uses_the_forwards_mask_on_cuda():
    """The mask drawn in the forward kernel is the one the backward applies: x.grad is the
    output's nonzero pattern times 1 / (1 - p); torch.manual_seed repeats the run exactly."""
    def f(x):
        return F.dropout(torch.tanh(x), 0.3, True) * 1.5
    cf = pyfuser.compile(f)
    x0 = torch.randn(256, 1000, device="cuda") + 3.0          # tanh(x) != 0 everywhere
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        x = x0.clone().requires_grad_()
        y = cf(x)
        y.backward(torch.ones_like(y))
        runs.append((y.detach(), x.grad))
    (y, g), (y2, g2) = runs
    assert torch.equal(y, y2) and torch.equal(g, g2)
    keep = y != 0
    want = keep * (1.5 / 0.7) * (1 - torch.tanh(x0) ** 2)
    torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)
    assert abs(keep.float().mean().item() - 0.7) < 5 * math.sqrt(0.21 / keep.numel())
    fused = {op for gr in compiled_graphs() for r in gr.regions for op in r.ops}
    assert {"aten.native_dropout.default", "aten.native_dropout_backward.default"} <= fused


@pytest.mark.gpu
def test_dropout_follows_the_cuda_generator():
    def f(x):
        return F.dropout(x, 0.2, True) * 2, F.dropout(x, 0.5, True)
    cf = pyfuser.compile(f)
    x = torch.randn(512, 1024, device="cuda")
    gen = torch.cuda.default_generators[x.device.index]
    torch.cuda.manual_seed(11)
    before = gen.get_offset()
    a = cf(x)
    after = gen.get_offset()
    torch.cuda.manual_seed(11)
    b = cf(x)
    c = cf(x)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0])
    # two random ops: 4 of the generator's offset each, whichever kernels they land in
    assert after - before == 8
    keep = (a[0] != 0).float().mean().item()
    assert abs(keep - 0.8) < 5 * math.sqrt(0.16 / x.numel())


@pytest.mark.gpu
def test_dynamic_shapes_on_cuda_reuse_kernels(plans, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "1")
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "8")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                                torch.nn.LayerNorm(64)).cuda()
    ref = copy.deepcopy(model)
    cm = pyfuser.compile(model, dynamic=True)
    seen = []
    for b in (48, 80, 112, 144):
        x = torch.randn(b, 32, 64, device="cuda")
        out = cm(x)
        torch.testing.assert_close(out, ref(x), rtol=1e-4, atol=1e-4)
        out.sum().backward()
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[1:] == [seen[0]] * 3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layer_norm_of_half_parameters_fuses_its_training_forward(dtype):
    """A half / bfloat16 LayerNorm (no autocast) on CUDA: the training forward's saved mean and
    rstd are float (eager's dtype on CUDA), the forward fuses with them, the step matches eager."""
    region = TC.half_layer_norm_step(dtype, "cuda", (64, 768))
    assert TC.statistics_dtypes(region) == [torch.float32, torch.float32]
