"""CUDA graphs for torch.compile's inference graphs on a GPU (frontend/fx/cuda_graphs.py): HF
models' eval forwards replayed from real CUDA graphs give the bits of the same compiled forward
run without them and stay within float rounding of eager, parameters updated in place are
seen, and graphs with random ops or eager-only inputs run without a graph."""
from __future__ import annotations

import dataclasses
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
        outs = [_logits(graphed(**inputs)).float() for _ in range(4)]
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
            results.append((c(x), lin(x)))
            if i == 2:
                lin[0].weight.mul_(0.5)               # an optimizer-like update in place
                x = torch.randn(32, 64, device="cuda")
                results.append((c(x), lin(x)))
    torch.cuda.synchronize()
    for got, want in results:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    (g,) = CG.graphed_calls()
    assert g.captures == 1 and g.replays >= 4


@pytest.mark.gpu
def test_dropout_runs_without_a_graph():
    def f(x):
        return torch.nn.functional.dropout(torch.tanh(x), 0.5, training=True)
    c = pyfuser.compile(f, cuda_graphs=True)
    x = torch.ones(256, 256, device="cuda")
    with torch.no_grad():
        a, b = c(x), c(x)
        c(x)
    torch.cuda.synchronize()
    (g,) = CG.graphed_calls()
    assert g.captures == 0 and "random" in g.why_not
    assert not torch.equal(a, b)
