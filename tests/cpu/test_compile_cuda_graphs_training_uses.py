"""Graphed training (frontend/fx/cuda_graphs_training.py) in the ways a training loop uses
autograd, on the CPU with the stand-in graphs of fake_graphs.py, each equal to eager: gradients
accumulated over micro-batches and clipped in place, `torch.autograd.grad` on an input that
requires grad with the results kept, a gradient's storage kept across steps, one layer applied
twice in a step, tied weights used by
two compiled functions, graphs dropped (MAX_GRAPHS) while their saved tensors are alive, and
non-reentrant checkpointing that reruns the graphed forward inside the backward."""
import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import cuda_graphs as CG

pytestmark = pytest.mark.usefixtures("fresh_compile", "no_graphed_calls")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh())


def _compiled(m, **kw):
    return torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead", **kw)


def _same_grads(m, ref):
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, msg=name)
        torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad")


def _replays():
    return {g.__name__.split("_")[1]: g.replays for g in CG.graphed_calls()}


def test_micro_batches_accumulated_and_clipped(fake_graphs):
    m = _model()
    ref = copy.deepcopy(m)
    c = _compiled(m)
    opt, opt_ref = (torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, ref))
    for _ in range(3):
        opt.zero_grad()
        opt_ref.zero_grad()
        for _ in range(3):
            x = torch.randn(3, 4)
            c(x).square().mean().backward()
            ref(x).square().mean().backward()
        for mm in (m, ref):
            torch.nn.utils.clip_grad_norm_(mm.parameters(), 0.05)
        _same_grads(m, ref)
        opt.step()
        opt_ref.step()
    assert _replays()["forward"] >= 2


def test_autograd_grad_of_an_input_kept(fake_graphs):
    m = _model()
    c = _compiled(m)
    kept = []
    for _ in range(4):
        x = torch.randn(3, 4, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        got = torch.autograd.grad(c(x).square().sum(), [x, *m.parameters()])
        want = torch.autograd.grad(m(xr).square().sum(), [xr, *m.parameters()])
        kept.append((got, want))
    for got, want in kept:
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert _replays()["forward"] >= 2


def test_a_gradient_s_storage_kept_across_steps(fake_graphs):
    """A caller that keeps only a gradient's storage (`p.grad.untyped_storage()`, no tensor on
    it) holds the graph's memory: the next step runs without its graph rather than overwrite
    it (the storage's use count does not show it; its Python object's reference count does)."""
    m = _model()
    c = _compiled(m)
    kept = []
    for _ in range(5):
        m.zero_grad(set_to_none=True)
        c(torch.randn(3, 4)).square().sum().backward()
        w = m[0].weight.grad
        kept.append((w.untyped_storage(), w.storage_offset(), w.shape, w.stride(), w.clone()))
        del w
    for st, off, shape, stride, value in kept:
        t = torch.empty(0).set_(st, off, shape, stride)
        assert torch.equal(t, value)          # no later step wrote it
    (bw,) = [g for g in CG.graphed_calls() if g.compiled.kind == "backward"]
    assert bw.busy >= 1


def test_one_layer_twice_in_a_step(fake_graphs):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    ref = copy.deepcopy(lin)
    c = _compiled(lin)
    for _ in range(4):
        x = torch.randn(3, 4)
        lin.zero_grad()
        ref.zero_grad()
        torch.tanh(c(torch.tanh(c(x)))).square().sum().backward()
        torch.tanh(ref(torch.tanh(ref(x)))).square().sum().backward()
        _same_grads(lin, ref)
    assert _replays()["forward"] >= 2


def test_tied_weights_in_two_compiled_functions(fake_graphs):
    torch.manual_seed(0)
    m = torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 4),
                             "head": torch.nn.Linear(4, 10, bias=False)})
    m.head.weight = m.emb.weight
    ref = copy.deepcopy(m)
    lm = lambda mm, ids: mm.head(torch.tanh(mm.emb(ids))).square().mean()   # noqa: E731
    reg = lambda mm, ids: mm.emb(ids).square().sum()                        # noqa: E731
    c1, c2 = _compiled(lambda ids: lm(m, ids)), _compiled(lambda ids: reg(m, ids))
    opt, opt_ref = (torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, ref))
    for _ in range(4):
        ids = torch.randint(0, 10, (3, 5))
        opt.zero_grad(set_to_none=False)
        opt_ref.zero_grad(set_to_none=False)
        (c1(ids) + c2(ids)).backward()
        (lm(ref, ids) + reg(ref, ids)).backward()
        _same_grads(m, ref)
        opt.step()
        opt_ref.step()
    assert _replays()["forward"] >= 2


def test_graphs_dropped_while_their_saved_tensors_are_alive(fake_graphs, monkeypatch):
    monkeypatch.setattr(CG, "MAX_GRAPHS", 1)
    m = _model()
    ref = copy.deepcopy(m)
    c = _compiled(m, dynamic=True)
    for _ in range(4):
        xs = [torch.randn(n, 4) for n in (3, 5, 3, 5, 3)]
        m.zero_grad()
        ref.zero_grad()
        sum(c(x).square().mean() for x in xs).backward()
        sum(ref(x).square().mean() for x in xs).backward()
        _same_grads(m, ref)
    assert fake_graphs.captures >= 2


def test_checkpoint_reruns_the_graphed_forward_in_the_backward(fake_graphs):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    ref = copy.deepcopy(lin)
    c = _compiled(lambda x: torch.tanh(lin(x)))
    r = lambda x: torch.tanh(ref(x))       # noqa: E731
    for _ in range(4):
        x = torch.randn(3, 4)
        lin.zero_grad()
        ref.zero_grad()
        for f in (c, r):
            checkpoint(f, checkpoint(f, x, use_reentrant=False),
                       use_reentrant=False).square().sum().backward()
        _same_grads(lin, ref)
    assert _replays()["forward"] >= 2
