"""Losses through the torch.compile backend on the CPU (kernels through the interpreter):
cross-entropy's forward pick and its nll gradient in the log_softmax backward's kernel, binary
cross-entropy with logits, nll_loss's backward alone, the refusals of nll_loss_forward with
their reasons, and an out-of-range target's NaN gradient row."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels, check_fn, graphs


pytestmark = pytest.mark.usefixtures("fresh_compile")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_backward_computes_the_nll_gradient_in_the_kernel(reduction):
    """nll_loss_backward (eager: a zero fill and a scatter; decomposed by the backend) is an
    iota compare in the kernel of the log_softmax backward that reads it; ignored rows give
    zero gradients, as eager's."""
    target = torch.tensor([3, -100, 0, 6, 6, -100, 2])

    def f(x):
        loss = F.cross_entropy(x * 2, target, reduction=reduction)
        return loss if reduction != "none" else loss * torch.arange(7.0)
    check_fn(f, (7, 9), loss=lambda out: out.sum())
    (bwd,) = [r for g in graphs("backward") for r in g.regions if "aten.eq.Tensor" in r.ops]
    assert {"aten.where.self", "aten.exp.default", "aten.sum.dim_IntList"} <= set(bwd.ops)
    assert bwd.kernels() == 1
    # the forward's nll_loss (eager: a gather kernel) picks the target in the log_softmax's
    # kernel; the mean or sum over the rows is a second, small kernel
    (fwd,) = [r for g in graphs("forward") for r in g.regions
              if "aten.nll_loss_forward.default" in r.ops]
    assert {"aten.amax.default", "aten.exp.default", "aten.log.default"} <= set(fwd.ops)
    assert fwd.kernels() == (1 if reduction == "none" else 2)
    left = [n for g in graphs("backward") for n in g.unsupported]
    assert not any(n.startswith("nll_loss_backward") for n in left), left
    assert_ran_as_sm90_kernels([r for g in graphs("backward") for r in g.regions])


@pytest.mark.parametrize("kw", [{}, {"weight": True}, {"pos_weight": True},
                                {"reduction": "sum"}, {"reduction": "none"}], ids=str)
def test_binary_cross_entropy_with_logits_fuses(kw):
    """ELECTRA's discriminator loss: binary_cross_entropy_with_logits (left to eager: no
    lowering) is the kernel of the logits' producers, with class weights, positive weights and
    each reduction; forward and gradient as close to float64 as eager's."""
    gen = torch.Generator().manual_seed(1)
    target = (torch.rand(7, 5, generator=gen) > 0.6).float()
    extra = {k: torch.rand(5, generator=gen) * 2 if v is True else v for k, v in kw.items()}

    def f(x, b):
        return F.binary_cross_entropy_with_logits(x * 3 + b, target, **extra)
    check_fn(f, (7, 5), (5,), loss=lambda out: (out * torch.arange(1.0, out.numel() + 1)
                                                .reshape(out.shape)).sum())
    (fw,) = graphs("forward")
    assert not fw.unsupported, fw.unsupported
    (region,) = fw.regions
    assert {"aten.binary_cross_entropy_with_logits.default", "aten.add.Tensor"} <= set(region.ops)
    assert_ran_as_sm90_kernels(fw.regions + graphs("backward")[0].regions)


def test_nll_loss_backward_alone_is_a_pointwise_kernel_with_an_iota():
    """The backend's nll_loss_backward decomposition (an iota compare, no read of the
    log-probabilities) is one pointwise kernel; the ignored row's gradient is 0."""
    target = torch.tensor([1, 4, -100, 0])
    check_fn(lambda x: F.nll_loss(x * 1.5, target), (4, 5), loss=lambda out: out * 3)
    regions = [r for g in graphs("backward") for r in g.regions
               if {"aten.eq.Tensor", "aten.where.self"} <= set(r.ops)]
    assert regions
    assert_ran_as_sm90_kernels(regions)
    report = pyfuser.runtime.dispatch.last_report(regions[0].fusion)
    assert [s.scheduler for s in report.segments if s.kind == "kernel"] == ["pointwise"], report


def test_nll_loss_forward_left_to_eager_says_why():
    """nll_loss_forward's refusal of other than [N, C] inputs: the node stays eager with the
    lowering's reason, and the result is eager's."""
    reason = "nll_loss of other than [N, C] floating inputs (left to eager)"
    x, t = torch.randn(4), torch.tensor(2)

    def f(x):
        return F.nll_loss(F.log_softmax(x * 2, 0), t)
    with torch.no_grad():
        got = pyfuser.compile(f)(x)
    torch.testing.assert_close(got, f(x))
    reasons = {r for g in compiled_graphs() for n, r in g.unsupported.items()
               if n.startswith("nll_loss_forward")}
    assert reasons == {reason}, reasons


def test_nll_loss_backward_out_of_range_target_is_a_nan_row():
    """Eager stops on a device assert for a target class out of range; the decomposed
    gradient gives that row NaN (as the forward's loss and the op's lowering do), never a
    silent zero, and keeps the other rows and an ignored row exact."""
    from pyfuser.frontend.fx.backend import _nll_loss_backward
    x = torch.randn(4, 5)
    target = torch.tensor([1, 7, -100, -3])
    two, three = torch.tensor(2.0), torch.tensor(3.0)
    g = _nll_loss_backward(two, x, target, None, 1, -100, two)
    assert torch.isnan(g[1]).all() and torch.isnan(g[3]).all()
    assert torch.equal(g[0], torch.tensor([0.0, -1.0, 0.0, 0.0, 0.0]))
    assert torch.equal(g[2], torch.zeros(5))
    ok = torch.tensor([1, 4, -100, 0])
    want = torch.ops.aten.nll_loss_backward(two, x, ok, None, 1, -100, three)
    assert torch.equal(_nll_loss_backward(two, x, ok, None, 1, -100, three), want)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_weights_fuses_forward_and_backward(reduction):
    """Class weights: each row's loss times weight[target] (a lookup by the row's target in
    the row kernel), the mean over the weights' sum (total_weight), and the gradient at the
    target times its weight; ignored rows count nothing. Forward and gradient as close to
    float64 as eager's, and nothing of the loss left to eager."""
    target = torch.tensor([3, -100, 0, 6, 6, 2, 8])
    w = torch.rand(9, generator=torch.Generator().manual_seed(4)) * 2

    def f(x):
        loss = F.cross_entropy(x * 2, target, weight=w.to(x.dtype), reduction=reduction)
        return loss if reduction != "none" else loss * torch.arange(7.0)
    check_fn(f, (7, 9), loss=lambda out: out.sum())
    left = [n for g in compiled_graphs() for n in g.unsupported
            if n.startswith(("nll_loss", "cross_entropy"))]
    assert not left, left
    (fwd,) = [r for g in graphs("forward") for r in g.regions
              if "aten.nll_loss_forward.default" in r.ops]
    assert fwd.kernels() == (1 if reduction == "none" else 2)
    assert_ran_as_sm90_kernels([r for g in compiled_graphs() for r in g.regions])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_weighted_losses_through_jit_match_eager(dtype):
    """TorchScript's cross_entropy_loss and nll_loss with class weights (pyfuser.jit), every
    reduction, an ignored row and a row of weight 0; a mean whose rows are all ignored is
    NaN (0 / 0) as eager's."""
    import pyfuser as P
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 11, generator=gen).to(dtype)
    t = torch.tensor([1, 10, -100, 4, 0, 4])
    w = (torch.rand(11, generator=gen) * 3).to(dtype)
    w[0] = 0.0

    def ce(x, t, w):
        return (F.cross_entropy(x, t, weight=w), F.cross_entropy(x, t, weight=w, reduction="sum"),
                F.cross_entropy(x, t, weight=w, reduction="none"),
                F.nll_loss(F.log_softmax(x.float(), 1), t, weight=w.float()))
    f = P.jit(torch.jit.script(ce))
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    for tt in (t, torch.full((6,), -100)):
        got, want = f(x, tt, w), ce(x, tt, w)
        for g, e in zip(got, want):
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=tol, atol=tol, equal_nan=True)
        assert not f.last_run.fallbacks, f.last_run.fallbacks
    assert torch.isnan(f(x, torch.full((6,), -100), w)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_label_smoothing_through_jit_matches_eager(dtype):
    """TorchScript's cross_entropy_loss with label smoothing (aten_loss._smoothed), with and
    without class weights, every reduction, an ignored row: eager's value within rounding, as
    close to float64 as eager's, and no fallback."""
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(7, 13, generator=gen) * 3).to(dtype)
    t = torch.tensor([1, 12, -100, 4, 0, 4, 7])
    w = (torch.rand(13, generator=gen) * 2 + 0.1).to(dtype)

    def ce(x, t, w):
        return (F.cross_entropy(x, t, label_smoothing=0.1),
                F.cross_entropy(x, t, label_smoothing=0.25, reduction="sum"),
                F.cross_entropy(x, t, label_smoothing=0.3, reduction="none"),
                F.cross_entropy(x, t, weight=w, label_smoothing=0.05),
                F.cross_entropy(x, t, weight=w, label_smoothing=0.2, reduction="sum"),
                F.cross_entropy(x, t, weight=w, label_smoothing=1.0, reduction="none"))
    f = pyfuser.jit(torch.jit.script(ce))
    got, want = f(x, t, w), ce(x, t, w)
    oracle = ce(x.double(), t, w.double())
    assert not f.last_run.fallbacks, f.last_run.fallbacks
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for g, e, o in zip(got, want, oracle):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=tol, atol=tol)
        err_got = (g.double() - o).abs().max().item()
        err_eager = (e.double() - o).abs().max().item()
        assert err_got <= 2 * err_eager + tol * o.abs().max().item(), (err_got, err_eager)
    with pytest.raises(Exception):                # eager's own error, through the fallback
        f2 = pyfuser.jit(torch.jit.script(
            lambda x, t: F.cross_entropy(x, t, label_smoothing=1.5)))
        f2(x, t)


@pytest.mark.parametrize("kw", [{}, {"reduction": "none"}, {"reduction": "sum", "weight": True}],
                         ids=str)
def test_cross_entropy_with_classes_at_dim_1_fuses(kw):
    """[batch, classes, tokens] logits (and [N, C, H, W] maps): torch.compile's cross-entropy
    views them as [N, C, 1, T] for nll_loss2d_forward / nll_loss2d_backward, lowered as
    nll_loss's pick and gradient along the class axis 1 (left to eager before); forward and
    gradient as close to float64 as eager's, nothing of the loss left to eager."""
    target = torch.tensor([[3, -100, 0, 4, 4, 2, 1], [0, 1, 2, 3, 4, -100, 4]])
    w = torch.rand(5, generator=torch.Generator().manual_seed(6)) + 0.5
    extra = {k: (w if v is True else v) for k, v in kw.items()}

    def f(x):
        e = {k: (v.to(x.dtype) if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
        loss = F.cross_entropy(x * 2, target, **e)
        return loss if loss.dim() == 0 else loss * torch.arange(7.0)
    check_fn(f, (2, 5, 7), loss=lambda out: out.sum())
    left = [n for g in compiled_graphs() for n in g.unsupported if n.startswith("nll_loss")]
    assert not left, left
    ops = {op for g in compiled_graphs() for r in g.regions for op in r.ops}
    assert {"aten.nll_loss2d_forward.default", "aten.nll_loss2d_backward.default"} <= ops
    assert_ran_as_sm90_kernels([r for g in compiled_graphs() for r in g.regions])


def test_bfloat16_weighted_cross_entropy_with_classes_at_dim_1():
    """bfloat16 logits and class weights over [B, C, T]: the backward's weight[target] pick is a
    bfloat16 value held in a float register (its kernel declared a bfloat16 register, which
    NVRTC refused: found on an H200); loss and gradient within bfloat16 rounding of eager."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 300, 33, generator=gen).to(torch.bfloat16)
    t = torch.randint(0, 300, (4, 33), generator=gen)
    t.view(-1)[::7] = -100
    w = (torch.rand(300, generator=gen) + 0.5).to(torch.bfloat16)

    def f(x):
        return F.cross_entropy(x, t, weight=w)
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(f)(ours), f(ref)
    got.backward()
    want.backward()
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ours.grad.float(), ref.grad.float(), rtol=2e-2, atol=2e-4)
    assert_ran_as_sm90_kernels([r for g in compiled_graphs() for r in g.regions])


def test_loss_lowering_refusals_name_the_op_and_what():
    """What the loss lowerings refuse is an UnsupportedOpError naming the op and the reason
    (the node stays eager): class weights of another dtype or rank, nll_loss2d of other ranks,
    targets of another rank or dtype."""
    from pyfuser.errors import UnsupportedOpError
    from pyfuser.frontend.lowering.aten_backward import _nll_loss2d_backward
    from pyfuser.frontend.lowering.aten_loss import _nll_loss2d_forward, _nll_loss_forward
    from pyfuser.ir import DataType
    from pyfuser.ir import builder as B
    from pyfuser.ir.fusion import Fusion
    with Fusion():
        x2 = B.define_tensor([-1, -1], DataType.Float)
        x4 = B.define_tensor([-1, -1, -1, -1], DataType.Float)
        t1, t3 = B.define_tensor([-1], DataType.Int), B.define_tensor([-1, -1, -1], DataType.Int)
        w64 = B.define_tensor([-1], DataType.Double)
        w2 = B.define_tensor([-1, -1], DataType.Float)
        with pytest.raises(UnsupportedOpError, match="nll_loss: class weights other than a "
                                                     r"\[C\] tensor of the input's dtype"):
            _nll_loss_forward(x2, t1, w64, 1, -100)
        with pytest.raises(UnsupportedOpError, match="nll_loss2d: class weights other than"):
            _nll_loss2d_forward(x4, t3, w2, 1, -100)
        with pytest.raises(UnsupportedOpError, match=r"nll_loss2d of other than \[N, C, H, W\]"):
            _nll_loss2d_forward(x2, t1, None, 1, -100)
        with pytest.raises(UnsupportedOpError,
                           match="nll_loss2d: class-index targets must be int64 of rank 3"):
            _nll_loss2d_forward(x4, t1, None, 1, -100)
        with pytest.raises(UnsupportedOpError,
                           match="nll_loss2d_backward: reduction none needs a gradient of the "
                                 "target's shape"):
            _nll_loss2d_backward(t1, x4, t3, None, 0, -100, x2)
