"""The channels-last layout pass on CUDA (off by default; PYFUSER_CHANNELS_LAST=auto runs it on
graphs without training batch norms, =train on training graphs too): ResNet-18 (torchvision's when
installed) eval forward and training step match eager with cuDNN running every convolution on
NHWC operands, output and gradient strides eager's, no region relayouting its outputs, every
region's kernels launched on the GPU; the pass cuts the profiler's kernels per forward (cuDNN's
NCHW <-> NHWC transposes) against PYFUSER_CHANNELS_LAST=0; step times with and without it are
printed (pytest -s). The CPU counterpart: tests/cpu/test_compile_channels_last.py.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.frontend.fx import region as region_mod
from pyfuser.runtime import dispatch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import channels_last_cases as CL  # noqa: E402
import train_corpus as TC  # noqa: E402

pytestmark = pytest.mark.gpu
SIZE = dataclasses.replace(TC.SMALL, batch=8)        # 8 x 3 x 224 x 224 (not SMALL: 224 px)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "auto")
    monkeypatch.delenv("PYFUSER_OUTER_SPLIT", raising=False)
    # float32 convolutions without TF32, in eager's NCHW and the pass's NHWC alike: cuDNN picks
    # other algorithms per layout, and a TF32 one put the pass's float32 training 25x farther
    # from the float64 oracle than eager (running means, H200)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.fixture
def relayouts(monkeypatch):
    count = [0]
    orig = region_mod._relayout

    def counting(t, order):
        count[0] += 1
        return orig(t, order)
    monkeypatch.setattr(region_mod, "_relayout", counting)
    return count


def _assert_cuda_kernels():
    for g in compiled_graphs():
        for r in g.regions:
            report = dispatch.last_report(r.fusion)
            assert report is not None and report.eager_segments == 0, (r, report)
            assert all(s.backend == "cuda" for s in report.segments if s.kind == "kernel")


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=pytest.mark.xfail(
    reason="known (2026-11-30, H200): with PYFUSER_CHANNELS_LAST=train, ResNet-18's conv weight "
           "gradients 13x farther from the oracle than eager's; why is not found yet, so `1` "
           "leaves training graphs alone", strict=False))], ids=["eval", "train"])
def test_resnet18_channels_last_matches_eager(train, relayouts, monkeypatch):
    """eval: `auto` runs the pass; train: forced (PYFUSER_CHANNELS_LAST=1; auto
    leaves graphs with training batch norms NCHW, their outer normalizations over NHWC are not
    split over blocks yet)."""
    if train:
        monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "train")
    case = TC.TRAIN_CASES["resnet18"]("cuda", SIZE)
    # cuDNN picks its algorithms per layout and shape: eager's own error is the yardstick
    CL.step_beside_eager(case.model, case.inputs["x"], train, "cuda", factor=8)
    counts = dict(CL.assert_channels_last(compiled_graphs()))
    assert relayouts[0] == 0
    _assert_cuda_kernels()
    kinds = ["backward", "forward"] if train else ["inference"]
    assert sorted(counts) == kinds
    for kind in kinds:
        assert counts[kind]["convolutions"] == counts[kind]["nhwc_convolutions"] == 20, counts


@pytest.mark.parametrize("split", ["0", "1"], ids=["one_kernel_bn", "outer_split"])
def test_conv_net_channels_last_training_matches_eager(relayouts, monkeypatch, split):
    monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "train")
    monkeypatch.setenv("PYFUSER_OUTER_SPLIT", split)
    model = CL.conv_net().cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    CL.step_beside_eager(model, x, True, "cuda", factor=8)
    CL.assert_channels_last(compiled_graphs())
    assert relayouts[0] == 0
    _assert_cuda_kernels()


def _profiled_kernels(fn, x) -> tuple:
    """(kernels per forward, names of cuDNN layout transposes per forward) of 3 forwards."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    transposes = [n for n in names if "nchwToNhwc" in n or "nhwcToNchw" in n]
    return len(names) / 3, len(transposes) / 3


@pytest.mark.parametrize("step", ["eval", "train"])
def test_resnet18_step_times_with_and_without_the_pass(monkeypatch, step):
    """GPU time per eval forward / training step (CUDA events, median of 20) without the pass,
    with it (forced for train), and with it and PYFUSER_OUTER_SPLIT=1 (training batch norms
    over NHWC as split reductions and pointwise kernels): printed for the record (pytest -s),
    no assertion on speed."""
    import statistics
    case = TC.TRAIN_CASES["resnet18"]("cuda", SIZE)
    x = case.inputs["x"]
    got = {}
    for knob in ("0", "1", "1+split"):
        monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "0" if knob == "0" else "train")
        monkeypatch.setenv("PYFUSER_OUTER_SPLIT", "1" if "split" in knob else "0")
        torch._dynamo.reset()
        model = copy.deepcopy(case.model).train(step == "train")
        fn = pyfuser.compile(model)

        def run():
            if step == "eval":
                with torch.no_grad():
                    fn(x)
            else:
                case.loss(fn(x)).backward()
        times = []
        for i in range(25):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            torch.cuda.synchronize()
            if i >= 5:
                times.append(a.elapsed_time(b) * 1000)
        got[knob] = statistics.median(times)
    print(f"\nResNet-18 {step}, µs a step (wall, GPU-synchronized): NCHW {got['0']:.0f}, "
          f"channels-last {got['1']:.0f}, channels-last + PYFUSER_OUTER_SPLIT=1 "
          f"{got['1+split']:.0f}")


def test_resnet18_eval_forward_loses_cudnn_transposes(monkeypatch):
    """Kernels per eval forward with the pass and without (PYFUSER_CHANNELS_LAST=0): the
    pass adds one copy per converted weight and the image (18), and removes cuDNN's layout
    transposes around the convolutions; printed for the record (pytest -s)."""
    case = TC.TRAIN_CASES["resnet18"]("cuda", SIZE)
    model = case.model.eval()
    x = case.inputs["x"]
    got = {}
    for knob in ("0", "auto"):
        monkeypatch.setenv("PYFUSER_CHANNELS_LAST", knob)
        torch._dynamo.reset()
        got[knob] = _profiled_kernels(pyfuser.compile(copy.deepcopy(model)), x)
    print(f"\nResNet-18 eval forward, kernels (cuDNN transposes) per forward: "
          f"NCHW {got['0']}, channels-last {got['auto']}")
    assert got["auto"][1] < got["0"][1] or got["0"][1] == 0
