"""Losses and norms that ran eagerly before (frontend/lowering/aten_regression_loss.py,
aten_vector_norm.py; xlogy, nan_to_num and alias) through the torch.compile backend on the
CPU: MSE, smooth L1, Huber, soft margin and binary cross-entropy losses with their gradients,
vector norms (F.normalize, cosine similarity, x.norm(dim=...)), KL divergence's xlogy,
nan_to_num and autograd's alias of a saved tensor fuse, and the values and gradients are as
close to float64 eager as float32 eager is; half / bfloat16 losses stay eager's (eager rounds
each of their steps)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import pyfuser

from compile_checks import check_fn, graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _fused():
    return {op for kind in ("inference", "forward", "backward") for g in graphs(kind)
            for r in g.regions for op in r.ops}


def _no_lowering_missing():
    missing = [why for g in graphs("forward") + graphs("backward")
               for why in g.unsupported.values() if "lowering" in why or "left to eager" in why]
    assert not missing, missing


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss,ops", [
    (lambda x, y, r: F.mse_loss(x, y, reduction=r), ["mse_loss", "mse_loss_backward"]),
    (lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
     ["smooth_l1_loss", "smooth_l1_loss_backward"]),
    (lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.7),
     ["huber_loss", "huber_loss_backward"]),
], ids=["mse", "smooth_l1", "huber"])
def test_regression_loss_and_its_gradient_fuse(loss, ops, reduction):
    """Both operands require grad (the target's gradient is the backward op with the operands
    swapped); differences on both sides of beta / delta."""
    check_fn(lambda x, y: loss(x * 1.5, y, reduction) * 2, (6, 9), (6, 9),
             loss=lambda o: (o * o).sum() if reduction == "none" else o)
    fused = _fused()
    assert all(f"aten.{op}.default" in fused for op in ops), fused
    _no_lowering_missing()


def test_regression_losses_of_bfloat16_stay_eagers():
    """eager computes a bfloat16 MSE in bfloat16, step by step: left to eager (the same bits),
    where a float32 one fuses."""
    x, y = torch.randn(5, 7).bfloat16(), torch.randn(5, 7).bfloat16()
    got = pyfuser.compile(lambda a, b: F.mse_loss(a * 2, b, reduction="none"))(x, y)
    assert torch.equal(got, F.mse_loss(x * 2, y, reduction="none"))
    assert graphs("inference") and "aten.mse_loss.default" not in _fused()
    assert "mse_loss of other than float32 / float64 tensors of one dtype" in \
        " ".join(why for g in graphs("inference") for why in g.unsupported.values())
    torch._dynamo.reset()
    pyfuser.compile(lambda a, b: F.mse_loss(a * 2, b, reduction="none"))(x.float(), y.float())
    assert "aten.mse_loss.default" in _fused()


def test_smooth_l1_at_its_bounds():
    """Differences exactly at -beta, 0 and beta take eager's branches, forward and backward."""
    y = torch.zeros(7)
    x = torch.tensor([-0.5, 0.5, 0.0, -0.25, 0.75, -2.0, 0.49999997])
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    f = lambda a: F.smooth_l1_loss(a * 1, y, reduction="sum", beta=0.5)   # noqa: E731
    out, want = pyfuser.compile(f)(ours), f(ref)
    torch.testing.assert_close(out, want)
    out.backward()
    want.backward()
    assert torch.equal(ours.grad, ref.grad), (ours.grad, ref.grad)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_soft_margin_is_eagers_op_by_op(reduction):
    """log1p(exp(-x * y)) and the gradient y * z * -norm / (z + 1) * grad in eager's order: the
    gradient is eager's bits for every reduction (norm = 1 / numel rounded to float for the
    mean), and so is the loss per element; labels +1 / -1 and large margins (exp overflows to
    inf and the loss is inf, as eager's)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(40, generator=gen) * 4, torch.tensor([-100.0, 100.0, 0.0])])
    y = torch.randint(0, 2, (43,), generator=gen).float() * 2 - 1
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    f = lambda a: F.soft_margin_loss(a * 1, y, reduction=reduction)   # noqa: E731
    out, want = pyfuser.compile(f)(ours), f(ref)
    if reduction == "none":
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    else:
        torch.testing.assert_close(out, want)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    want.backward(g)
    # (NaN at the margins of 100: inf / inf, in eager too)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=0, atol=0, equal_nan=True)
    assert "aten.soft_margin_loss_backward.default" in _fused()


@pytest.mark.parametrize("fn", [
    lambda x: F.normalize(x, dim=-1) * 3,
    lambda x: F.cosine_similarity(x, x.flip(0) + 1.0, dim=-1),
    lambda x: x.norm(dim=-1, keepdim=True) + x,
    lambda x: torch.linalg.vector_norm(x, ord=1, dim=0),
    lambda x: torch.linalg.vector_norm(x, ord=math.inf, dim=(0, 1)),
    lambda x: torch.linalg.vector_norm(x * 2, ord=3.0, dim=1),
    lambda x: torch.linalg.vector_norm(x - x.round(), ord=0, dim=-1) + x.sum(-1),
    lambda x: F.pairwise_distance(x, x * 0.5 + 0.25),
], ids=["normalize", "cosine_similarity", "norm_keepdim", "ord1", "inf_all", "ord3", "ord0",
        "pairwise_distance"])
def test_vector_norms_fuse(fn):
    check_fn(fn, (6, 10))
    fused = _fused()
    assert any("norm" in op for op in fused), fused


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_vector_norm_is_eagers_float_accumulation(dtype):
    """Half / bfloat16 summed in float and rounded once: eager's result, within one rounding."""
    x = (torch.randn(12, 64) * 4).to(dtype)
    got = pyfuser.compile(lambda t: torch.linalg.vector_norm(t, dim=-1) * 1)(x)
    want = torch.linalg.vector_norm(x, dim=-1)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want)
    exact = x.double().square().sum(-1).sqrt()
    assert ((got.double() - exact).abs() <= (want.double() - exact).abs() + exact.abs() * 2 ** -7).all()


def test_kl_divergence_fuses_through_xlogy():
    """F.kl_div with probability targets is xlogy(t, t) - t * input: fused, forward and backward;
    xlogy's zeros and NaN as eager's (0 where x == 0, NaN where y is NaN)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.softmax(torch.randn(6, 11, generator=gen), -1)
    y[0, :3] = 0.0
    check_fn(lambda x: F.kl_div(F.log_softmax(x, -1), y, reduction="batchmean"), (6, 11))
    assert "aten.xlogy.Tensor" in _fused()
    a = torch.tensor([0.0, 0.0, 1.0, float("nan"), 2.0, 0.0])
    b = torch.tensor([0.0, float("nan"), 0.0, 1.0, 3.0, -1.0])
    got = pyfuser.compile(lambda p, q: torch.xlogy(p, q) + 0)(a, b)
    torch.testing.assert_close(got, torch.xlogy(a, b), equal_nan=True)


def test_alias_of_a_saved_tensor_is_lowered():
    """autograd's alias (a logsumexp's or std's saved result) lowers to its operand: no graph
    reports it unfused ("has no lowering" before), and each graph is one region."""
    check_fn(lambda x: torch.logsumexp(x, -1).mean() + x.std(-1).mean(), (5, 8),
             loss=lambda o: o)
    gs = graphs("forward") + graphs("backward")
    assert any(n.target is torch.ops.aten.alias.default for g in gs for n in g.gm.graph.nodes)
    assert not [k for g in gs for k in g.report()["unfused"] if "alias" in k]
    assert all(len(g.regions) == 1 for g in gs), [len(g.regions) for g in gs]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy_and_its_gradient_fuse(reduction, weighted):
    """F.binary_cross_entropy of probabilities (a sigmoid that saturates to 0 and 1 in places:
    the logs clamped at -100 as eager's), with and without per-element weights."""
    gen = torch.Generator().manual_seed(3)
    t = torch.rand(6, 5, generator=gen)
    t[0, :2] = torch.tensor([0.0, 1.0])
    w = torch.rand(6, 5, generator=gen) if weighted else None

    def f(x):
        p = torch.sigmoid(x * 3)
        p = torch.where(x.abs() > 1.5, (x > 0).to(x.dtype), p)   # exact 0s and 1s
        return F.binary_cross_entropy(p, t.to(x.dtype), reduction=reduction,
                                      weight=None if w is None else w.to(x.dtype))
    check_fn(f, (6, 5), loss=lambda o: (o * o).sum() if reduction == "none" else o)
    fused = _fused()
    assert {"aten.binary_cross_entropy.default",
            "aten.binary_cross_entropy_backward.default"} <= fused, fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32], ids=str)
@pytest.mark.parametrize("kw", [{}, {"nan": 2.5, "posinf": 1e30, "neginf": -3.0}],
                         ids=["defaults", "given"])
def test_nan_to_num_is_eagers(dtype, kw):
    """NaN and the infinities replaced by eager's values (the dtype's largest finite ones by
    default; a given 1e30 is +inf in half, as eager casts it); integers copied."""
    base = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5, -2.0, 0.0, 7e4, -7e4])
    x = base.to(dtype) if dtype.is_floating_point else torch.tensor([1, 0, 3, -2], dtype=dtype)
    f = lambda t: torch.nan_to_num(t * 1, **kw)    # noqa: E731
    got, want = pyfuser.compile(f)(x), f(x)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    assert "aten.nan_to_num.default" in {op for g in graphs("inference") + graphs("forward")
                                         for r in g.regions for op in r.ops}


def _left_to_eager(handler, *args):
    from pyfuser.errors import UnsupportedOpError
    from pyfuser.frontend.lowering.lower import tensor_input
    from pyfuser.ir.fusion import Fusion
    with Fusion():
        x = tensor_input(torch.float32, [4, 6], [6, 1], "x")
        y = tensor_input(torch.float32, [4, 6], [6, 1], "y")
        h = tensor_input(torch.bfloat16, [4, 6], [6, 1], "h")
        s = tensor_input(torch.float32, [], [], "s")
        env = {"x": x, "y": y, "h": h, "s": s}
        with pytest.raises(UnsupportedOpError) as e:
            handler(*[env.get(a, a) if isinstance(a, str) else a for a in args])
    return str(e.value)


@pytest.mark.parametrize("module,name,args,message", [
    ("aten_regression_loss", "_mse_loss", ("x", "h", 1), "of other than float32 / float64"),
    ("aten_regression_loss", "_mse_loss", ("x", "y", 3), "mse_loss: reduction 3"),
    ("aten_regression_loss", "_smooth_l1_loss", ("x", "y", 1, 0.0), "beta 0"),
    ("aten_regression_loss", "_huber_loss", ("x", "y", 1, -1.0), "must be a constant >= 0"),
    ("aten_loss", "_bce", ("x", "y", None, 4), "binary_cross_entropy: reduction 4"),
    ("aten_vector_norm", "_linalg_vector_norm", ("x", "fro"), "ord must be a constant number"),
    ("aten_vector_norm", "_norm", ("x", 2, 1), "not a list of dims"),
    ("aten_activations", "_glu", ("s", -1), "glu of a 0-dim tensor"),
    ("aten_pointwise", "_xlogy", ("x", "h"), "xlogy of other than float32 / float64"),
    ("aten_regression_loss", "_soft_margin_loss", ("s", "x", 1), "target that broadcasts"),
    ("aten_regression_loss", "_soft_margin_loss", ("h", "h", 1), "of other than float32"),
], ids=["dtypes", "reduction", "beta0", "delta", "bce_reduction", "ord", "norm_overload", "glu",
        "xlogy", "soft_margin_broadcast", "soft_margin_half"])
def test_unsupported_forms_are_left_to_eager_with_their_reason(module, name, args, message):
    """Each form these lowerings do not take raises UnsupportedOpError (the node runs eagerly
    and the graph's report names the reason)."""
    import importlib
    handler = getattr(importlib.import_module(f"pyfuser.frontend.lowering.{module}"), name)
    assert message in _left_to_eager(handler, *args)
