"""CUDA graphs for torch.compile on a GPU (frontend/fx/cuda_graphs.py, cuda_graphs_training.py):
HF models' eval forwards replayed from real CUDA graphs give the bits of the same compiled
forward run without them and stay within float rounding of eager, parameters updated in place
are seen, random ops draw new numbers in every replay, and training steps through graphed
forwards and backwards match the same graphs run without them."""
from __future__ import annotations

import dataclasses
import math
import os
import sys

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import cuda_graphs as CG

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import train_corpus as TC  # noqa: E402

SIZE = dataclasses.replace(TC.SMALL, batch=4, seq=64, hidden=128, heads=4, vocab=512)


pytestmark = pytest.mark.usefixtures("fresh_compile")


@pytest.fixture(autouse=True)
def _no_graphed_calls():
    CG._LIVE.clear()                        # an earlier test's compiled graphs may be alive
    yield
    torch.cuda.synchronize()


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_eval_forward_replayed_from_a_graph(name, dtype):
    case = TC.TRAIN_CASES[name]("cuda", SIZE)
    model = case.model.eval()
    inputs = {k: v for k, v in case.inputs.items() if k != "labels"}
    plain = pyfuser.compile(model)
    graphed = pyfuser.compile(model, cuda_graphs=True)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        want = _logits(model(**inputs)).float()
        ref = _logits(plain(**inputs)).float()
        # copies: a replay's outputs are the graph's memory, which the next replay rewrites
        outs = [_logits(graphed(**inputs)).float().clone() for _ in range(4)]
    torch.cuda.synchronize()
    g = [x for x in CG.graphed_calls() if x.replays]
    assert len(g) == 1 and g[0].captures == 1 and g[0].replays == 3, [
        (x.why_not, [e.failed for e in x.entries.values()]) for x in CG.graphed_calls()]
    for o in outs[1:]:
        assert torch.equal(o, ref)                 # the same kernels, replayed: the same bits
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(outs[-1], want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.gpu
def test_parameters_updated_in_place_and_new_inputs():
    lin = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
    lin = lin.cuda().eval()
    c = pyfuser.compile(lin, mode="reduce-overhead")
    with torch.no_grad():
        results = []
        for i in range(5):
            x = torch.randn(32, 64, device="cuda")
            results.append((c(x).clone(), lin(x)))    # kept: a copy (the graph's memory
            if i == 2:                                  # is rewritten by the next replay)
                lin[0].weight.mul_(0.5)               # an optimizer-like update in place
                x = torch.randn(32, 64, device="cuda")
                results.append((c(x).clone(), lin(x)))
    torch.cuda.synchronize()
    for got, want in results:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    (g,) = CG.graphed_calls()
    assert g.captures == 1 and g.replays >= 4


@pytest.mark.gpu
def test_dropout_replayed_from_a_graph_draws_new_masks():
    """A graphed call with dropout draws a new mask in every replay (its kernels add device
    words that a captured randint refreshes: runtime/rng.py), with dropout's values and rate,
    and torch.manual_seed reproduces a sequence of replays."""
    def f(x):
        return torch.nn.functional.dropout(torch.tanh(x), 0.5, training=True)
    c = pyfuser.compile(f, cuda_graphs=True)
    x = torch.ones(256, 256, device="cuda")
    with torch.no_grad():
        c(x), c(x)                                  # a plain run, then the capture
        torch.manual_seed(1)
        first = [c(x).clone() for _ in range(3)]   # kept: copies of the graph's memory
        torch.manual_seed(1)
        again = [c(x).clone() for _ in range(3)]
    torch.cuda.synchronize()
    (g,) = CG.graphed_calls()
    assert g.captures == 1 and g.replays >= 7 and g.why_not is None
    kept = float(torch.tanh(torch.ones(())) / 0.5)
    for o in first:
        assert torch.all((o == 0) | ((o - kept).abs() < 1e-6))
        assert 0.48 < (o != 0).float().mean().item() < 0.52          # 65536 draws at p = 0.5
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_dropout_training_steps_replayed_from_graphs():
    """Training steps with dropout through graphed forward and backward graphs: each replayed
    forward draws a new mask, and the backward's gradients are the ones of the mask seen in the
    forward's output."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.3)).cuda()
    c = pyfuser.compile(m, cuda_graphs=True)
    masks = []
    for _ in range(6):
        m.zero_grad()
        x = torch.randn(32, 64, device="cuda")
        y = c(x)
        y.sum().backward()
        lin = x @ m[0].weight.detach().T + m[0].bias.detach()
        keep = y.detach() != 0
        torch.testing.assert_close(y.detach(), torch.where(keep, lin / 0.7, 0.0))
        d = keep.float() / 0.7
        torch.testing.assert_close(m[0].weight.grad, d.T @ x, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m[0].bias.grad, d.sum(0), rtol=1e-4, atol=1e-4)
        masks.append(keep)
    torch.cuda.synchronize()
    fw, bw = (next(g for g in CG.graphed_calls() if kind in g.__name__)
              for kind in ("forward", "backward"))
    assert fw.why_not is None and fw.replays >= 3 and bw.replays >= 3
    assert all(not torch.equal(a, b) for a, b in zip(masks[2:], masks[3:]))
    assert 0.67 < torch.stack(masks[2:]).float().mean().item() < 0.73


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_dropout_models_train_from_graphs(name):
    """HF GPT-2 / BERT at dropout 0.1 (bfloat16 autocast): the training forward is graphed too;
    runs of steps from one torch.manual_seed give the same losses, another seed other ones."""
    import copy
    case = TC.TRAIN_CASES[name]("cuda", SIZE, dropout=0.1)
    runs = []
    for seed in (7, 7, 8):
        torch._dynamo.reset()                      # each run compiles (and graphs) anew
        CG._LIVE.clear()
        model = copy.deepcopy(case.model)
        fn = pyfuser.compile(model, cuda_graphs=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(seed)
        losses = []
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses.append(float(TC.step(TC.TrainCase(name, model, case.inputs, case.loss),
                                            fn, opt)))
        torch.cuda.synchronize()
        calls = [(g.__name__, g.why_not, g.captures, g.replays,
                  [e.failed for e in g.entries.values()]) for g in CG.graphed_calls()]
        fw = [g for g in CG.graphed_calls() if "forward" in g.__name__]   # one a Dynamo graph
        assert fw and all(g.why_not is None and g.replays >= 3 for g in fw), (seed, calls)
        runs.append(losses)
    assert all(math.isfinite(x) for x in runs[0])
    assert runs[0] == pytest.approx(runs[1], rel=1e-3)
    assert runs[2][2:] != runs[0][2:]                  # other masks in the replayed steps


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [("llama", torch.float32), ("llama", torch.bfloat16),
                                        ("resnet18", torch.float32),
                                        ("resnet18", torch.bfloat16), ("gpt2", torch.bfloat16),
                                        ("bert", torch.bfloat16)])
def test_training_steps_replayed_from_graphs(name, dtype):
    """Training steps (forward, loss, backward, SGD) through graphed forward and backward graphs
    give the losses, gradients and parameters of the same compiled graphs run without CUDA
    graphs, step after step (cuda_graphs_training.py)."""
    import copy
    case = TC.TRAIN_CASES[name]("cuda", SIZE)
    runs = []
    for graphs in (False, True):
        model = copy.deepcopy(case.model)
        fn = pyfuser.compile(model, cuda_graphs=graphs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses, grads = [], []
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                loss = TC.step(TC.TrainCase(name, model, case.inputs, case.loss), fn, opt)
            losses.append(loss)
            grads.append(TC.grads(model))
        torch.cuda.synchronize()
        runs.append((losses, grads, TC.params(model)))
    fw, bw = (next(g for g in CG.graphed_calls() if kind in g.__name__)
              for kind in ("forward", "backward"))
    assert fw.replays >= 3 and bw.replays >= 2 and fw.busy == bw.busy == 0, (
        fw.why_not, bw.why_not, [e.failed for e in fw.entries.values()])
    (l0, g0, p0), (l1, g1, p1) = runs
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    for a, b in zip(l0, l1):
        torch.testing.assert_close(b, a, **tol)
    for ga, gb in zip(g0, g1):
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], **tol, msg=n)
    for n in p0:
        torch.testing.assert_close(p1[n], p0[n], **tol, msg=n)


@pytest.mark.gpu
def test_efficient_attention_dropout_masks_agree_through_graphed_training():
    """float32 SDPA with dropout runs memory-efficient attention, whose dropout seed is a host
    tensor when run as it is and a device one when captured (cuda_graphs_training.py): a
    backward run as it is after a replayed forward crashed the process (BERT float32 in
    bench/models.py). With v the identity the forward's output is the dropped-out attention
    matrix P, and v's gradient for a loss of sum(out) is P's column sums: the backward's mask is
    the forward's, on every call (as it is, captured, replayed)."""
    torch.manual_seed(0)

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    c = pyfuser.compile(f, cuda_graphs=True)
    q, k = (torch.randn(2, 2, 64, 64, device="cuda") for _ in range(2))
    eye = torch.eye(64, device="cuda").expand(2, 2, 64, 64).contiguous()
    for _ in range(6):
        v = eye.clone().requires_grad_()
        out = c(q, k, v)
        out.sum().backward()
        cols = out.detach().sum(-2)                           # [2, 2, 64]: P's column sums
        torch.testing.assert_close(v.grad, cols.unsqueeze(-1).expand(2, 2, 64, 64),
                                   rtol=1e-4, atol=1e-4)
        assert (out == 0).float().mean() > 0.2                # dropout took place
    torch.cuda.synchronize()
    bw = [g for g in CG.graphed_calls() if g.compiled.kind == "backward"]
    assert len(bw) == 1 and len(bw[0].seeds) == 2 and bw[0].replays >= 1, [
        (g.compiled.kind, g.replays, g.why_not) for g in CG.graphed_calls()]
