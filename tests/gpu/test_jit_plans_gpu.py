"""Call plans and CUDA graphs of pyfuser.jit on the GPU (issue 14): a BERT-like model gives eager's
results through its plan with no host-to-device copy per call and never more kernels than eager
(torch.profiler); a second input signature gets its own kernels; 0-dim CPU tensors reach
kernels by value; a grid reduction's workspaces work in plans and graphs; CUDA graphs replay
with new inputs each call and fresh outputs; a one-fusion function is answered by the native
runner where it is built."""
from __future__ import annotations

import copy
import os
import sys
import warnings

import pytest
import torch

import pyfuser

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import model_corpus as M  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _profile(fn, calls: int = 2):
    """(kernels, host-to-device copies) per call of fn, from torch.profiler (after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = h2d = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower().replace(" ", "")
        if name.startswith("memcpy"):
            h2d += "htod" in name
        elif not name.startswith("memset"):
            kernels += 1
    return kernels / calls, h2d / calls


def _bert(scale: int = 4):
    case = next(c for c in M.CASES if c.name == "bert")
    if not M.available(case):
        pytest.skip("transformers is not installed")
    model, inputs = case.build("cuda", scale)
    return model, inputs, M.compile_case(case, model, inputs)


def _close(got, want):
    g, w = M.tensors(got), M.tensors(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_bert_plan_no_copies_and_never_more_kernels_than_eager():
    model, inputs, traced = _bert()
    ref = copy.deepcopy(model)
    f = pyfuser.jit(traced)
    with torch.no_grad():
        for _ in range(3):
            _close(f(*inputs), ref(*inputs))
            assert f.last_run.eager_groups == 0
        assert len(f.plans) == 1
        fused, copies = _profile(lambda: f(*inputs))
        eager, eager_copies = _profile(lambda: ref(*inputs))
    assert copies == 0, "a host-to-device copy per call"
    assert fused <= eager, (fused, eager)


def test_bert_with_cuda_graphs_replays_new_inputs():
    model, inputs, traced = _bert()
    ref = copy.deepcopy(model)
    f = pyfuser.jit(traced, cuda_graphs=True)
    seen = []
    with torch.no_grad():
        for k in range(5):
            ids = torch.randint(0, M.VOCAB, inputs[0].shape, device="cuda",
                                generator=torch.Generator("cuda").manual_seed(k))
            mask = inputs[1].clone()
            got = f(ids, mask)
            want = ref(ids, mask)
            _close(got, want)
            seen.append((got, want))
        (plan,) = f.plans.values()
        assert plan.graph is not None, plan.failed
        for got, want in seen:                # earlier results were not overwritten
            _close(got, want)
        kernels, copies = _profile(lambda: f(ids, mask))
    assert copies == 0


def _abc(a, b, c):
    return (a + b) * c


def test_new_inputs_every_call_through_a_graph():
    f = pyfuser.jit(torch.jit.script(_abc), cuda_graphs=True)
    outs = []
    with torch.no_grad():
        for _ in range(6):
            xs = [torch.randn(1000, 300, device="cuda") for _ in range(3)]
            out = f(*xs)
            torch.testing.assert_close(out, _abc(*xs))
            outs.append((out, _abc(*xs)))
    (plan,) = f.plans.values()
    assert plan.graph is not None, plan.failed
    for out, want in outs:
        torch.testing.assert_close(out, want)


def test_a_second_signature_gets_its_own_kernels():
    f = pyfuser.jit(torch.jit.script(_abc))
    with torch.no_grad():
        for dtype in (torch.float32, torch.float16, torch.float32, torch.float16):
            xs = [torch.randn(4096, device="cuda", dtype=dtype) for _ in range(3)]
            for _ in range(2):
                out = f(*xs)
                assert out.dtype == dtype
                torch.testing.assert_close(out, _abc(*xs))
                assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0
            kernels, _ = _profile(lambda: f(*xs))
            assert kernels == 1
    (runner,) = f.runners.values()
    assert len(runner.variants) == 2


def _scale(x, s):
    return x * s + 1.0


def test_zero_dim_cpu_tensor_travels_by_value():
    x = torch.randn(1024, 512, device="cuda")
    f = pyfuser.jit(torch.jit.trace(_scale, (x, torch.tensor(2.0))))
    with torch.no_grad():
        for v in (2.0, 3.0, 2.0):
            s = torch.tensor(v, dtype=torch.float64)          # CPU, 0-dim, float64
            out = f(x, s)
            assert out.dtype == torch.float32 and out.is_cuda
            torch.testing.assert_close(out, _scale(x, s))
        kernels, copies = _profile(lambda: f(x, s))
    assert copies == 0 and kernels == 1


def _colsum(x):
    return x.sum(0) * 2.0


@pytest.mark.parametrize("graphs", [False, True])
def test_grid_reduction_workspaces_in_plans_and_graphs(graphs):
    from pyfuser.runtime import dispatch
    f = pyfuser.jit(torch.jit.script(_colsum), cuda_graphs=graphs)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8192, 64, device="cuda")
            torch.testing.assert_close(f(x), _colsum(x), rtol=1e-4, atol=1e-3)
    (runner,) = f.runners.values()
    ex = dispatch.get_executor(runner.lowered.fusion)
    assert any(fast.workspaces for fast in ex._fast.values())


def test_one_fusion_function_through_the_native_runner():
    from pyfuser.runtime import native
    if native.build() is None:
        pytest.skip("the native runner cannot be built here")
    f = pyfuser.jit(torch.jit.script(_abc))
    with torch.no_grad():
        for _ in range(4):
            xs = [torch.randn(1024, device="cuda") for _ in range(3)]
            torch.testing.assert_close(f(*xs), _abc(*xs))
        assert f._variant.native is not None and f._entry == f._variant.native.run
        assert f.last_run.kernels == 1
        kernels, copies = _profile(lambda: f(*xs))
    assert kernels == 1 and copies == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xs = [torch.randn(1024, device="cuda", requires_grad=True) for _ in range(3)]
        out = f(*xs)                                  # grad mode: the Python path, autograd
    assert out.requires_grad
