"""The channels-last layout pass (pyfuser/frontend/fx/layout_channels_last.py) on the CPU
(kernel interpreter), forced with PYFUSER_CHANNELS_LAST=train (its default is off; `auto` is on
for CUDA graphs only; the layout semantics are the same without cuDNN): a conv-BN-ReLU-residual net and
ResNet-18, eval and train, match eager (values as close to a float64 oracle as eager's, output
and gradient strides eager's); every convolution reads NHWC operands; the only added copies
are the weights' and the first input's conversions (and, in a backward, the weight gradients'
copies back to eager's NCHW, inside fused regions); no region relayouts its outputs; batch
norm's reductions over (N, H, W) plan as outer reductions over the channels-innermost layout."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.fx import region as region_mod
from pyfuser.frontend.fx import layout_policy
from pyfuser.schedule import reduction as reduction_mod

import channels_last_cases as CL
import train_corpus as TC

pytestmark = pytest.mark.usefixtures("fresh_compile")


@pytest.fixture
def channels_last(monkeypatch):
    """The pass forced on; counts the outputs regions had to copy into another layout, and the
    reduction plans (scheduler, kind, axis groups)."""
    monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "train")
    seen = {"relayouts": 0, "plans": []}
    relayout = region_mod._relayout

    def counting(t, order):
        seen["relayouts"] += 1
        return relayout(t, order)
    monkeypatch.setattr(region_mod, "_relayout", counting)
    schedule = reduction_mod.schedule

    def recording(fusion, inputs, name="reduction", *a, **k):
        s = schedule(fusion, inputs, name, *a, **k)
        seen["plans"].append((name, s.params.kind, s.params.groups, s.params.reduced))
        return s
    monkeypatch.setattr(reduction_mod, "schedule", recording)
    return seen


def _graphs(kind=None):
    return [g for g in compiled_graphs() if kind is None or g.kind == kind]


def _assert_outer_batch_norm_plans(plans):
    """Batch norm statistics / gradients over (N, H, W) of an NHWC tensor: the reduced axes are
    outside, the channels innermost and kept: outer plans that read memory in order (the kept
    group, the channels, innermost), never an inner plan behind a transpose."""
    bn = [p for p in plans if p[2] and p[2][-1] == [1]]
    assert bn, plans
    assert all(kind == "outer" and reduced[-1] is False for _, kind, _, reduced in bn), bn


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_conv_bn_relu_residual_net(channels_last, train):
    model = CL.conv_net()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    CL.step_beside_eager(model, x, train)
    counts = dict(CL.assert_channels_last(_graphs()))
    assert channels_last["relayouts"] == 0
    if train:
        fw, bw = _graphs("forward")[0], _graphs("backward")[0]
        # 4 weights and the image; the 1x1 downsample's weight is NHWC already (1x1 kernel)
        assert len(fw.layout.converted) == 4 and not fw.layout.restored
        assert fw.layout.saved_channels_last > 0
        assert fw.layout.saved_converted == 4      # the backward reads the NHWC copies
        # the backward's convolution operands: the saved activations, weights and image arrive
        # NHWC (AOTAutograd compiled it with the forward's reported strides): no conversion;
        # the weight gradients and dx go back to NCHW (graph outputs)
        assert not bw.layout.converted and counts["backward"]["conversions"] == 0
        assert {why for _, why in bw.layout.restored} == {"a graph output keeps eager's strides"}
        assert len(bw.layout.restored) == 4         # the 3x3 weights' gradients and dx
        _assert_outer_batch_norm_plans(channels_last["plans"])
    else:
        (g,) = _graphs("inference")
        assert len(g.layout.converted) == 4 and not g.layout.restored


def test_a_view_the_new_strides_cannot_express_reads_eager_strides(channels_last):
    """flatten of an NHWC activation (a view in the graph, impossible on NHWC strides) reads a
    copy in eager's layout; the result is eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 5 * 5, 3))
    x = torch.randn(2, 3, 5, 5)
    CL.step_beside_eager(model, x, train=False)
    (g,) = _graphs("inference")
    assert g.layout is not None and g.layout.convolutions == 2
    assert [why for _, why in g.layout.restored] == ["aten.view.default reads eager's strides"]


def test_off_and_auto_on_cpu_leave_the_graph_alone(monkeypatch):
    model = CL.conv_net()
    x = torch.randn(2, 3, 8, 8)
    for knob in ("0", "auto", None):
        if knob is None:
            monkeypatch.delenv("PYFUSER_CHANNELS_LAST", raising=False)
        else:
            monkeypatch.setenv("PYFUSER_CHANNELS_LAST", knob)
        torch._dynamo.reset()
        pyfuser.frontend.fx.reset_compiled()
        CL.step_beside_eager(model, x, train=False)
        (g,) = _graphs("inference")
        assert g.layout is None, knob
        assert CL.layout_counts(g)["nhwc_convolutions"] == 0
    assert layout_policy.mode() == "off"        # the default (unset): off


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_auto_runs_on_cuda_graphs_without_training_batch_norms(monkeypatch, train):
    """`auto` as on CUDA (the device test stubbed): an eval forward goes NHWC; a training
    step's graphs (batch norms reducing over N, H, W: an outer normalization over NHWC, not
    split over blocks yet) stay NCHW."""
    monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "auto")
    monkeypatch.setattr(layout_policy, "_on_cuda", lambda convs: True)
    CL.step_beside_eager(CL.conv_net(), torch.randn(2, 3, 8, 8), train)
    graphs = _graphs()
    assert graphs
    if train:
        assert all(g.layout is None for g in graphs)
        assert all(CL.layout_counts(g)["nhwc_convolutions"] == 0 for g in graphs)
    else:
        (g,) = graphs
        assert g.layout is not None and len(g.layout.converted) == 4
        CL.assert_channels_last(graphs)


def test_dynamic_shapes_are_not_covered(channels_last):
    model = CL.conv_net()
    CL.step_beside_eager(model, torch.randn(2, 3, 8, 8), train=False,
                         compiled=pyfuser.compile(model, dynamic=True))
    (g,) = _graphs("inference")
    assert g.layout is None


def test_resnet18_eval(channels_last):
    case = TC.TRAIN_CASES["resnet18"]("cpu")
    CL.step_beside_eager(case.model, case.inputs["x"], train=False)
    counts = dict(CL.assert_channels_last(_graphs()))
    assert channels_last["relayouts"] == 0
    # 20 convolutions; 17 weights (the three 1x1 downsample weights are NHWC already) and the
    # image converted; the 17 fused regions run 17 kernels, as without the pass
    assert counts["inference"] == {"convolutions": 20, "nhwc_convolutions": 20,
                                   "conversions": 18, "other_copies": 0, "kernels": 17}


def test_resnet18_training_step(channels_last):
    """The training step of tests/cpu/test_compile_training.py with the pass on: loss,
    gradients, updated parameters and buffers as close to float64 as eager's."""
    case = TC.TRAIN_CASES["resnet18"]("cpu")
    runs, losses = TC.steps_beside_eager("resnet18", case, pyfuser.compile(case.model))
    TC.assert_as_close_as_eager(*losses, "loss")
    grads = [TC.grads(m) for m, _, _ in runs]
    for k in grads[1]:
        TC.assert_as_close_as_eager(grads[0][k], grads[1][k], grads[2][k], k)
        assert grads[0][k].stride() == grads[1][k].stride(), k
    after = [TC.params(m) for m, _, _ in runs]
    for k in after[1]:
        TC.assert_as_close_as_eager(after[0][k], after[1][k], after[2][k], k)
    counts = dict(CL.assert_channels_last(_graphs()))
    assert channels_last["relayouts"] == 0
    assert counts["forward"] == {"convolutions": 20, "nhwc_convolutions": 20,
                                 "conversions": 18, "other_copies": 0, "kernels": 19}
    # the backward: no conversion (the forward saved its NHWC weights and image); 19 kernels
    # without the pass, 17 more transpose the NHWC weight gradients back to eager's NCHW (the
    # graph's outputs; the 1x1 ones need none)
    assert counts["backward"] == {"convolutions": 20, "nhwc_convolutions": 20,
                                  "conversions": 0, "other_copies": 0, "kernels": 36}
    (fw,) = _graphs("forward")
    # 20 conv outputs, the ReLUs the convolutions read, the pool's output and indices; 17
    # weights and the image as their NHWC copies
    assert (fw.layout.saved_channels_last, fw.layout.saved_converted) == (48, 18)
    _assert_outer_batch_norm_plans(channels_last["plans"])


class _PatchEmbed(torch.nn.Module):
    """ViT's front: a strided convolution cutting patches, flattened and transposed to tokens,
    a class token in front (cat), a layer norm and a linear head on the class token."""

    def __init__(self, c=8):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, c, 4, stride=4)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, c))
        self.norm = torch.nn.LayerNorm(c)
        self.head = torch.nn.Linear(c, 3)

    def forward(self, x):
        t = self.proj(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1)
        return self.head(self.norm(t)[:, 0])


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_patch_embedding_flows_nhwc_into_tokens_without_copies_back(channels_last, train):
    """The NHWC convolution result, flattened and transposed, is a row-major token tensor
    (the flatten is a view of it); cat and layer norm take it as it is: no copy back."""
    torch.manual_seed(0)
    CL.step_beside_eager(_PatchEmbed(), torch.randn(2, 3, 8, 8), train)
    for g in _graphs():
        if g.layout is not None and g.layout.convolutions:
            assert not [r for r in g.layout.restored if "graph output" not in r[1]], g.layout
    CL.assert_channels_last(_graphs())
    assert channels_last["relayouts"] == 0


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_grouped_and_transposed_convolutions(channels_last, train):
    """A grouped convolution and a transposed one (weight [in, out, kh, kw]) run NHWC too; the
    model's 4-D output goes back to eager's NCHW (a copy fused into the last region)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1, groups=2),
                                torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.ConvTranspose2d(8, 4, 2, stride=2), torch.nn.ReLU())
    CL.step_beside_eager(model, torch.randn(2, 4, 6, 6), train)
    counts = dict(CL.assert_channels_last(_graphs()))
    assert all(c["nhwc_convolutions"] == 2 for c in counts.values()), counts
    g = _graphs("forward" if train else "inference")[0]
    assert [why for _, why in g.layout.restored] == ["a graph output keeps eager's strides"]
    assert channels_last["relayouts"] == 0


def test_bfloat16_autocast_eval(channels_last):
    """Under autocast the weights' bfloat16 casts fuse (a region run first) and the NHWC copies
    follow them; the result is eager's bits here (the same bfloat16 convolutions)."""
    model = CL.conv_net().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        got, want = pyfuser.compile(model)(x), model(x)
    assert got.dtype == want.dtype == torch.bfloat16 and got.stride() == want.stride()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    (g,) = _graphs("inference")
    assert CL.layout_counts(g)["nhwc_convolutions"] == 4 and len(g.layout.converted) == 4


def test_outer_split_cuts_nhwc_training_batch_norms(channels_last, monkeypatch):
    """PYFUSER_OUTER_SPLIT=1: a training batch norm over NHWC whose channels fill too few
    blocks for its rows (8 and 16 channels over 4608 and 1152 rows here; ResNet-18's 64 over
    25088 on a GPU) is refused by outer_persistent and cut (segment/split.py) into a reduction
    kernel, whose rows split over blocks, and a pointwise kernel; values, running statistics
    and gradients stay eager's."""
    from pyfuser.runtime import dispatch
    from pyfuser.segment import split
    monkeypatch.setenv("PYFUSER_OUTER_SPLIT", "1")
    copies = []
    runner = split.split_runner

    def recording(*a, **k):
        r = runner(*a, **k)
        if r is not None:
            copies.append(r.fusion)
        return r
    monkeypatch.setattr(split, "split_runner", recording)
    CL.step_beside_eager(CL.conv_net(), torch.randn(8, 3, 24, 24), True)
    cuts = [[s.scheduler for s in dispatch.last_report(c).segments if s.kind == "kernel"]
            for c in copies if dispatch.last_report(c) is not None]
    assert ["reduction", "pointwise"] in cuts, cuts
    assert all(c in (["reduction", "pointwise"], ["outer_persistent"]) for c in cuts), cuts
    CL.assert_channels_last(_graphs())
