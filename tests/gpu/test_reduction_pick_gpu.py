"""Cross-entropy's target logit read as one element per row (reduction_graph.Pick) on the GPU:
F.cross_entropy through pyfuser.jit against eager (float32, bfloat16, ignored and valid
targets, rows of 32000 classes: the streamed row kernel, and rows of 3072), and the picked sum
of a Fusion bit for bit against the reference evaluator (out-of-range indices, -0.0, NaN
beside the index); cross-entropy over classes at dim 1 (nll_loss2d, weighted, both dtypes)
through torch.compile, forward and backward."""
import pytest
import torch

import pyfuser
from pyfuser.codegen import api
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate
from pyfuser.runtime import dispatch
from pyfuser.runtime.dispatch import execute_fusion

pytestmark = pytest.mark.gpu
F = torch.nn.functional
ew = B.elementwise


def ce(x, t):
    return F.cross_entropy(x, t, ignore_index=-100)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 32000), (257, 3072)])
def test_cross_entropy_matches_eager(dt, shape):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(*shape, device="cuda", generator=g).to(dt)
    t = torch.randint(0, shape[1], (shape[0],), device="cuda", generator=g)
    t[::7] = -100
    f = pyfuser.jit(torch.jit.script(ce))
    got, want = f(x, t), ce(x, t)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-5 if dt == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert not f.last_run.fallbacks


def test_the_picked_sum_bit_for_bit():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        t = B.define_tensor([-1], DataType.Int)
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        f.add_output(B.reduction("sum", ew("where", onehot, x, 0.0), [1]))
        f.add_output(B.reduction("max", x, [1]))
    x = torch.randn(300, 1000, device="cuda")
    t = torch.randint(-5, 1005, (300,), device="cuda")
    x[0, t[0].clamp(0, 999)] = -0.0
    x[1, (t[1] + 1) % 1000] = float("nan")
    plan = api.plan_kernel(f, [x.cpu(), t.cpu()])
    assert "_at" in plan.kernel.source
    got = execute_fusion(f, [x, t])
    rep = dispatch.last_report(f)
    assert rep.eager_segments == 0 and rep.launched == 1, rep
    want = evaluate(f, [x, t])
    assert torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))
    torch.testing.assert_close(got[1], want[1], equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 32000), (257, 3072), (64, 50257)])
def test_cross_entropy_through_torch_compile_matches_eager(dt, shape):
    """torch.compile's form (nll_loss of a log_softmax, no grad): the picked log-probability
    computed once the row's (max, sum) exists, in the reduction scheduler's one pass."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = (2 * torch.randn(*shape, device="cuda", generator=g)).to(dt)
    t = torch.randint(0, shape[1], (shape[0],), device="cuda", generator=g)
    t[::5] = -100
    with torch.no_grad():
        got = pyfuser.compile(ce)(x, t)
    want = ce(x, t)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-5 if dt == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    from pyfuser.frontend.fx import compiled_graphs
    (region,) = compiled_graphs()[-1].regions
    rep = dispatch.last_report(region.fusion)
    assert rep.eager_segments == 0
    assert [s.scheduler for s in rep.segments if s.kind == "kernel"] == ["reduction", "reduction"]


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_weighted_cross_entropy_forward_and_backward_match_eager(dt, reduction):
    """Class weights picked per row (docs/reductions.md, "Class weights"), through
    pyfuser.compile: the loss and the logits' gradient against eager's."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(512, 32000, device="cuda", generator=g).to(dt)
    t = torch.randint(0, 32000, (512,), device="cuda", generator=g)
    t[::9] = -100
    w = (torch.rand(32000, device="cuda", generator=g) * 2).to(dt)

    def f(x):
        loss = F.cross_entropy(x, t, weight=w, reduction=reduction)
        return loss if reduction == "mean" else (loss * torch.arange(512, device="cuda")).sum()
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(f)(xs), f(xe)
    got.backward()
    want.backward()
    tol = 1e-4 if dt == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(xs.grad.float(), xe.grad.float(), rtol=tol, atol=tol)
    from pyfuser.frontend.fx import compiled_graphs
    left = [n for cg in compiled_graphs() for n in cg.unsupported
            if n.startswith(("nll_loss", "cross_entropy"))]
    assert not left, left


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 50, 7, 5), (4, 300, 33)])
def test_cross_entropy_over_classes_at_dim_1_forward_and_backward(dt, shape):
    """nll_loss2d_forward / backward (F.cross_entropy of [N, C, H, W] and [B, C, T]) fused,
    with class weights and ignored targets, against eager's."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(*shape, device="cuda", generator=g).to(dt)
    rest = (shape[0], *shape[2:])
    t = torch.randint(0, shape[1], rest, device="cuda", generator=g)
    t.view(-1)[::7] = -100
    wt = (torch.rand(shape[1], device="cuda", generator=g) + 0.5).to(dt)

    def f(x):
        return F.cross_entropy(x, t, weight=wt)
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(f)(xs), f(xe)
    got.backward()
    want.backward()
    tol = 1e-4 if dt == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(xs.grad.float(), xe.grad.float(), rtol=tol, atol=tol)
    from pyfuser.frontend.fx import compiled_graphs
    left = [n for cg in compiled_graphs() for n in cg.unsupported if n.startswith("nll_loss")]
    assert not left, left
