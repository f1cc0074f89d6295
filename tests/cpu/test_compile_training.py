"""Training through the torch.compile backend on the CPU (kernels through the interpreter):
backward graphs fuse (activation derivatives, softmax / layer norm / batch norm backward, the
broadcast-gradient sums), batch norm's running statistics are eager's (other mutations:
test_compile_mutations.py; losses: test_compile_training_losses.py), and a training step of
small HF models (train_corpus.py: BERT, GPT-2, Llama, T5, ViT, BLOOM, OPT, Falcon, DistilBERT,
Mistral, Qwen2, Gemma, Phi, DeBERTa-v2, ConvNeXt, Swin, CLIP, Wav2Vec2, Whisper's encoder,
MobileBERT, ELECTRA; GPT-NeoX and BART, ~7 and ~15 s, in test_model_zoo.py) and a ResNet-18
matches eager within float tolerance (measured against eager in float64: pyfuser's error is at
most a few times eager's own float32 error)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

import train_corpus as TC
from compile_checks import assert_input_copies_fused, assert_ran_as_sm90_kernels, check_fn, graphs
from train_corpus import assert_as_close_as_eager


pytestmark = pytest.mark.usefixtures("fresh_compile")


def _fused_ops(kind):
    return {op for g in graphs(kind) for r in g.regions for op in r.ops}


@pytest.mark.parametrize("act,op", [
    (lambda x: F.gelu(x), "gelu_backward"),
    (lambda x: F.gelu(x, approximate="tanh"), "gelu_backward"),
    (torch.tanh, "tanh_backward"),
    (torch.sigmoid, "sigmoid_backward"),
    (F.silu, "silu_backward"),
    (torch.relu, "threshold_backward"),
    (F.relu6, "hardtanh_backward"),
    (lambda x: F.hardtanh(x, -0.3, 0.7), "hardtanh_backward"),
    (F.softplus, "softplus_backward"),
    (lambda x: F.softplus(x, beta=2.0, threshold=1.0), "softplus_backward"),
])
def test_activation_backward_fuses(act, op):
    check_fn(lambda x, b: act(x + b) * 3, (8, 33), (33,))
    ops = _fused_ops("backward")
    assert f"aten.{op}.default" in ops
    assert "aten.sum.dim_IntList" in ops          # the broadcast bias' gradient, in the region


@pytest.mark.parametrize("fn,ops", [
    (lambda x: torch.softmax(x, -1), ["_softmax_backward_data.default"]),
    # decomposed by the backend (grad - exp(out) * sum(grad)): the partitioner may recompute out
    (lambda x: torch.log_softmax(x, -1), ["exp.default", "sum.dim_IntList"]),
])
def test_softmax_backward_fuses(fn, ops):
    check_fn(lambda x: fn(x * 2), (6, 17))
    fused = _fused_ops("backward")
    assert all(f"aten.{op}" in fused for op in ops), fused
    assert not [n for g in graphs("backward") for n in g.unsupported]


def _norm_beside_eager(norm, x):
    """A normalization module (its affine parameters drawn at random) through pyfuser, in eager
    and in float64 eager on `x`, then backward of sum(out * sin(out)): the forward, dx and the
    parameters' gradients as close to float64 eager as eager is."""
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    m32, m64 = copy.deepcopy(norm), copy.deepcopy(norm).double()
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
    outs = [pyfuser.compile(norm)(xs[0]), m32(xs[1]), m64(xs[2])]
    assert_as_close_as_eager(*outs, "forward")
    for o in outs:
        (o * o.detach().sin()).sum().backward()
    assert_as_close_as_eager(xs[0].grad, xs[1].grad, xs[2].grad, "dx")
    for (name, p), p32, p64 in zip(norm.named_parameters(), m32.parameters(), m64.parameters()):
        assert_as_close_as_eager(p.grad, p32.grad, p64.grad, name)


def _kernel_schedulers(op: str) -> tuple:
    """(the first backward graph's region holding `op`, its kernels' schedulers in order)."""
    region = next(r for r in graphs("backward")[0].regions if op in r.ops)
    report = pyfuser.runtime.dispatch.last_report(region.fusion)
    return region, [s.scheduler for s in report.segments if s.kind == "kernel"]


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_fuses(affine):
    torch.manual_seed(0)
    _norm_beside_eager(torch.nn.LayerNorm(24, elementwise_affine=affine), torch.randn(5, 7, 24))
    region, schedulers = _kernel_schedulers("aten.native_layer_norm_backward.default")
    # dx (two row sums) and dweight / dbias (sums over the rows) in one inner-outer persistent
    # kernel; without affine parameters dx alone, one inner persistent kernel
    assert region.kernels() == 1
    assert schedulers == ["inner_outer_persistent" if affine else "inner_persistent"]


@pytest.mark.parametrize("shape,groups,affine,dtype", [
    ((2, 8, 6, 6), 4, True, torch.float32), ((3, 6, 5), 3, False, torch.float32),
    ((2, 4), 2, True, torch.float32), ((2, 12, 3, 2, 2), 3, True, torch.float32),
    ((2, 8, 5, 5), 2, True, torch.bfloat16)], ids=str)
def test_group_norm_backward_fuses(shape, groups, affine, dtype):
    """native_group_norm_backward (dx over each (n, group), dweight / dbias over N and the
    spatial axes) runs as kernels (it ran eagerly: Wav2Vec2's feature encoder): the gradients
    as close to float64 eager as eager's own."""
    torch.manual_seed(0)
    _norm_beside_eager(torch.nn.GroupNorm(groups, shape[1], affine=affine).to(dtype),
                       torch.randn(*shape).to(dtype))
    (bw,) = graphs("backward")
    assert not bw.unsupported, bw.report()
    _, schedulers = _kernel_schedulers("aten.native_group_norm_backward.default")
    # dx: two sums over each group (one kernel); dweight / dbias: sums over N and the spatial
    # axes (another)
    assert sorted(schedulers) == (["inner_persistent", "reduction"] if affine
                                  else ["inner_persistent"])


@pytest.mark.parametrize("dim,shape", [(0, (8, 4, 3)), (2, (8, 4, 3)), (0, (6, 5)), (1, (5, 7))],
                         ids=str)
def test_weight_norm_forward_and_backward_fuse(dim, shape):
    """torch._weight_norm (_weight_norm_interface and its backward: Wav2Vec2's positional
    convolution; they ran eagerly) runs as kernels: w, grad_v and grad_g as close to float64
    eager as float32 eager is."""
    torch.manual_seed(0)
    v = torch.randn(*shape)
    gshape = [1] * len(shape)
    gshape[dim] = shape[dim]
    g = torch.randn(*gshape)

    def f(v, g):
        return torch._weight_norm(v, g, dim) * 2.0
    ins = [[v.clone().requires_grad_(), g.clone().requires_grad_()] for _ in range(2)] + \
        [[v.double().requires_grad_(), g.double().requires_grad_()]]
    outs = [pyfuser.compile(f)(*ins[0]), f(*ins[1]), f(*ins[2])]
    assert_as_close_as_eager(*outs, "w")
    for o in outs:
        (o * o.detach().cos()).sum().backward()
    for i, name in enumerate(("grad_v", "grad_g")):
        assert_as_close_as_eager(*(x[i].grad for x in ins), name)
    assert "aten._weight_norm_interface.default" in _fused_ops("forward")
    assert "aten._weight_norm_interface_backward.default" in _fused_ops("backward")
    assert not any(g.unsupported for g in compiled_graphs()), [g.report() for g in compiled_graphs()]


def test_layer_norm_of_a_transposed_input_plus_a_lookup_runs_as_kernels(monkeypatch):
    """CLIP's and Whisper's embeddings: a convolution's output read transposed ([B, C, T] as
    [B, T, C]) plus a position embedding, then a layer norm over C. inner_persistent refuses
    the layout (C is not innermost in memory) and outer_persistent the lookup (its index
    changes along T, the innermost axis), so the region ran on the reference evaluator; the
    segment is now cut (segment/split.py) into the lookup's pointwise kernel and an
    outer_persistent normalization, and forward and backward match eager."""
    from pyfuser.runtime import dispatch
    from pyfuser.schedule import registry
    from pyfuser.segment import split
    copies, chosen = [], []
    runner, select = split.split_runner, registry.select

    def recording(*a, **k):
        r = runner(*a, **k)
        if r is not None:
            copies.append(r.fusion)
        return r

    def selecting(*a, **k):
        s = select(*a, **k)
        chosen.append(s.name)
        return s
    monkeypatch.setattr(split, "split_runner", recording)
    monkeypatch.setattr(registry, "select", selecting)
    ids = torch.tensor([0, 3, 1, 2, 4])

    def f(conv_out, table, w, b):
        x = conv_out.transpose(1, 2) + F.embedding(ids, table)
        return F.layer_norm(x, (x.shape[-1],), w, b)
    check_fn(f, (2, 32, 5), (5, 32), (32,), (32,), loss=lambda o: (o * o.detach().sin()).sum())
    (region,) = [r for r in graphs("forward")[0].regions
                 if "aten.native_layer_norm.default" in r.ops]
    assert "aten.embedding.default" in region.ops
    assert_ran_as_sm90_kernels([region])
    assert region.kernels() == 2
    (copy,) = [c for c in copies if dispatch.last_report(c) is not None]
    kernels = [s for s in dispatch.last_report(copy).segments if s.kind == "kernel"]
    assert [s.scheduler for s in kernels][0] == "pointwise" and "welford" not in kernels[0].exprs
    assert "index_select" in kernels[0].exprs and "index_select" not in kernels[1].exprs, kernels
    assert "outer_persistent" in chosen and "welford" in kernels[1].exprs, (chosen, kernels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layer_norm_of_half_parameters_fuses_its_training_forward(dtype):
    """A model whose parameters are half / bfloat16 (no autocast): the training forward's
    native_layer_norm saves its mean and rstd for the backward, in the input's dtype on the CPU
    (eager's; float on CUDA). The forward fuses with them (it was left to eager: the lowering
    did not know the device), the saved statistics are eager's dtype, and the step matches."""
    region = TC.half_layer_norm_step(dtype, "cpu", (5, 7, 24))
    assert TC.statistics_dtypes(region) == [dtype, dtype]
    assert all(o.dtype.torch is dtype for o in region.fusion.outputs)


def test_rms_norm_as_llama_writes_it_fuses_forward_and_backward():
    def rms(x, w):
        v = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(v + 1e-6))
    check_fn(rms, (4, 6, 32), (32,))
    assert "aten.mean.dim" in _fused_ops("forward")
    assert "aten.pow.Tensor_Scalar" in _fused_ops("backward")
    # dx (a row sum then the pointwise rest) is one inner persistent kernel: the row sum's
    # expand to the hidden size, a constant, meets the input's own (symbolic) size in an
    # elementwise op, so the two are known equal
    (region,) = [r for g in graphs("backward") for r in g.regions
                 if "aten.pow.Tensor_Scalar" in r.ops]
    report = pyfuser.runtime.dispatch.last_report(region.fusion)
    kernels = [s.scheduler for s in report.segments if s.kind == "kernel"]
    assert kernels == ["inner_persistent"], report


def test_batch_norm_training_updates_running_stats_like_eager():
    """Two training steps: the running statistics and num_batches_tracked are eager's. The
    graph's copy_ of each mutated buffer (AOTAutograd writes them back at the graph's end) is an
    in-place output of the region computing the new value: the batch norm's kernel writes the
    running statistics, the counter's add writes num_batches_tracked; no copy_ is left to FX and
    none runs after the kernels."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.weight.normal_()
        bn.bias.normal_()
    ref, ora = copy.deepcopy(bn), copy.deepcopy(bn).double()
    cbn = pyfuser.compile(bn)
    for step in range(2):
        x = torch.randn(4, 6, 5, 5) * 3 + 1 + step
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
        outs = [cbn(xs[0]), ref(xs[1]), ora(xs[2])]
        assert_as_close_as_eager(*outs, "forward")
        for o in outs:
            (o * o.detach().cos()).sum().backward()
        assert_as_close_as_eager(xs[0].grad, xs[1].grad, xs[2].grad, "dx")
        for name in ("weight", "bias"):
            assert_as_close_as_eager(getattr(bn, name).grad, getattr(ref, name).grad,
                                     getattr(ora, name).grad, name)
        for name in ("running_mean", "running_var"):
            assert_as_close_as_eager(getattr(bn, name), getattr(ref, name), getattr(ora, name),
                                     name)
        assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
    assert "aten._native_batch_norm_legit_functional.default" in _fused_ops("forward")
    assert "aten.native_batch_norm_backward.default" in _fused_ops("backward")
    (fw,) = graphs("forward")
    assert_input_copies_fused(fw, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eval_batch_norm_fuses_with_its_relu_and_residual(dtype):
    """An eval-mode batch norm (`_native_batch_norm_legit_no_training` in AOTAutograd's
    inference graph) is pointwise: with the residual add and the ReLU after it, one region
    (it ran eagerly before, with ResNet-18's ReLUs as kernels of their own)."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        for t in (bn.weight, bn.bias, bn.running_mean):
            t.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    bn = bn.to(dtype)
    ora = copy.deepcopy(bn).double()

    def f(m, x, r):
        return torch.relu(m(x) + r)
    x, r = torch.randn(4, 6, 5, 5) * 3 + 1, torch.randn(4, 6, 5, 5)
    with torch.no_grad():
        out = pyfuser.compile(lambda x, r: f(bn, x, r))(x.to(dtype), r.to(dtype))
        want = f(bn, x.to(dtype), r.to(dtype))
        oracle = f(ora, x.to(dtype).double(), r.to(dtype).double())
    assert out.dtype == want.dtype == dtype
    assert_as_close_as_eager(out, want, oracle, "eval batch norm")
    (g,) = graphs("inference")
    assert not g.unsupported, g.unsupported
    (region,) = g.regions
    assert {"aten._native_batch_norm_legit_no_training.default", "aten.add.Tensor",
            "aten.relu.default"} <= set(region.ops)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "resnet18", "t5", "vit", "bloom", "opt",
                                  "falcon", "distilbert", "mistral", "qwen2", "gemma", "phi",
                                  "deberta_v2", "convnext", "swin", "clip", "wav2vec2", "whisper",
                                  "mobilebert", "electra"])
def test_training_step_matches_eager(name):
    """forward, loss, backward and an SGD step: the loss, every gradient and every updated
    parameter as close to eager in float64 as eager in float32 is (within a factor 4)."""
    case = TC.TRAIN_CASES[name]("cpu")
    runs, losses = TC.steps_beside_eager(name, case, pyfuser.compile(case.model))
    m32, m64 = runs[1][0], runs[2][0]
    assert_as_close_as_eager(*losses, "loss")
    grads = [TC.grads(m) for m, _, _ in runs]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[1]:
        assert_as_close_as_eager(grads[0][k], grads[1][k], grads[2][k], k)
    after = [TC.params(m) for m, _, _ in runs]
    for k in after[1]:
        assert_as_close_as_eager(after[0][k], after[1][k], after[2][k], k)
    for (a, b), (_, c) in zip(zip(case.model.named_buffers(), m32.named_buffers()),
                              m64.named_buffers()):
        if a[1].is_floating_point():
            assert_as_close_as_eager(a[1], b[1], c, a[0])
        else:
            assert torch.equal(a[1], b[1]), a[0]
    fw, bw = graphs("forward"), graphs("backward")
    assert fw and bw
    if name == "resnet18":      # 20 batch norms: running mean and var, num_batches_tracked
        (g,) = fw
        assert_input_copies_fused(g, 60)
    if name == "swin":          # the relative-position bias table's lookup and its gradient
        fused = {op for g in fw + bw for r in g.regions for op in r.ops}
        assert {"aten.index.Tensor", "aten.index_put.default"} <= fused
        assert not [k for g in fw + bw for k in g.unsupported if k.startswith("index")]
    regions = [r for g in fw + bw for r in g.regions]
    assert sum(len(g.regions) for g in bw) >= 5
    assert all(r.eager_calls == 0 for r in regions)     # every region ran fused
    assert_ran_as_sm90_kernels(regions)


def test_in_place_lowerings_stay_out_of_regions():
    """A graph calling native_batch_norm in training mode (which writes its running statistics,
    though its schema does not say so) keeps that node an aten call: the shared lowering would
    write the inputs in place (Fusion.aliases, TorchScript's form), which a region of a
    functional graph must not do. The ops after it still fuse, and the statistics are eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from pyfuser.frontend.fx.compile_graph import compile_graph

    def f(x, w, b, rm, rv):
        y = torch.ops.aten.native_batch_norm.default(x, w, b, rm, rv, True, 0.1, 1e-5)[0]
        return (y * 2 + 1,)
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((4, 3, 5), (3,), (3,)))
    stats, ref_stats = [torch.zeros(3), torch.ones(3)], [torch.zeros(3), torch.ones(3)]
    gm = make_fx(f)(x, w, b, *[s.clone() for s in stats])
    cg = compile_graph(gm, None, "inference")
    got = cg([x, w, b, *stats])[0]
    want = f(x, w, b, *ref_stats)[0]
    torch.testing.assert_close(got, want)
    for s, r in zip(stats, ref_stats):
        torch.testing.assert_close(s, r)
    assert cg.unsupported == {"native_batch_norm": "its lowering writes an input in place"}
    assert [r.ops for r in cg.regions] == [["aten.mul.Tensor", "aten.add.Tensor"]]
    assert all(r.calls == 1 and r.eager_calls == 0 for r in cg.regions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_hardtanh_backward_at_its_bounds(dtype):
    """hardtanh's gradient is 0 at and beyond the bounds, compared in float with the bounds as
    given (bfloat16's nearest value to -0.3 is not -0.3: eager's CUDA and CPU kernels compare
    float(x) with -0.3 itself); a NaN input passes its gradient, as eager's CUDA kernel does."""
    lo, hi = -0.3, 0.7
    near = [torch.tensor(v, dtype=dtype).item() for v in (lo, hi)]
    x = torch.tensor([lo, hi, *near, 0.0, 2.0, -2.0, 0.69, float("nan")]).to(dtype)
    g = torch.arange(1.0, 10.0).to(dtype)
    xs = x.clone().requires_grad_()
    pyfuser.compile(lambda t: F.hardtanh(t * 1, lo, hi))(xs).backward(g)
    xf = x.float()
    want = torch.where((xf <= lo) | (xf >= hi), 0.0, g.float()).to(dtype)
    assert torch.equal(xs.grad, want), (xs.grad, want)
    assert xs.grad[-1] == g[-1]
