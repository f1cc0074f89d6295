"""The model corpus (model_corpus.py) through pyfuser.jit on the CPU: each model's torch object
parses (what torch prints of it too), fuses, runs through the CPU interpreter of the generated
kernels and matches eager: every output, and for train-mode batch norm the running statistics.
Reductions and normalizations run as kernels; no fusion group may fall back to eager.

Train-mode batch norm over a batch of 2 at 1x1 spatial size (ResNet-18's last stage at 32x32)
normalizes two values a channel: an ill-conditioned function of its input, so any two float32
summation orders drift apart there. Where pyfuser and eager differ by more than rtol 1e-4, both
are compared with the model run in float64: pyfuser must be as accurate as eager (within 4x its
error)."""
from __future__ import annotations

import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.torchscript import parse_ir

import model_corpus as M


def _id(case):
    return f"{case.name}-{case.how}"


@pytest.mark.parametrize("case", M.CASES, ids=[_id(c) for c in M.CASES])
def test_model_fuses_and_matches_eager(case):
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    model, inputs = case.build("cpu")
    obj = M.compile_case(case, model, inputs)
    parse_ir(str(obj.inlined_graph))               # the text parser reads what torch prints
    ref_model = copy.deepcopy(model)               # same state as the compiled object now
    model64 = copy.deepcopy(model).double()
    f = pyfuser.jit(obj, cpu_executor="interpret")
    with torch.no_grad():
        got = M.tensors(f(*inputs))
        want = M.tensors(ref_model(*inputs))
        exact = M.tensors(model64(*[x.double() if x.is_floating_point() else x for x in inputs]))
    assert len(got) == len(want) >= 1
    for g, w, x in zip(got, want, exact):
        assert g.shape == w.shape and g.dtype == w.dtype
        M.as_close_as_eager(g, w, x, "output")
    for (name, b), (_, rb), (_, xb) in zip(model.named_buffers(), ref_model.named_buffers(),
                                           model64.named_buffers()):
        M.as_close_as_eager(b, rb, xb, name)
    run = f.last_run
    assert run.groups >= 1 and run.kernels >= 1, str(f.graph)
    assert run.eager_groups == 0, [fb for fb in run.fallbacks if fb["kind"] == "prim::PyfuserGroup"]


def test_model_under_autograd_keeps_requires_grad():
    case = next(c for c in M.CASES if c.name == "resnet18_eval" and c.how == "script")
    model, inputs = case.build("cpu")
    f = pyfuser.jit(M.compile_case(case, model, inputs))
    out, ref = f(*inputs), model(*inputs)
    assert out.requires_grad and ref.requires_grad
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    g = model.fc.weight.grad.clone()
    model.zero_grad()
    ref.sum().backward()
    torch.testing.assert_close(g, model.fc.weight.grad)


def test_resnet_source_is_named():
    assert M.resnet_source().startswith(("torchvision", "model_corpus.ResNet18"))
