"""The model corpus on CUDA: every model (GPT-2 and Llama traced among them) through
pyfuser.jit matches eager on the GPU, its groups run as CUDA kernels (none falls back);
traced constants stay exact and on their device; seed 002's traced forms run as one kernel
each on the GPU too (views only: none)."""
from __future__ import annotations

import copy
import math
import os
import sys
import warnings

import pytest
import torch

import pyfuser

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import model_corpus as M  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from bench.common import load_module_from_path  # noqa: E402


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [4])
@pytest.mark.parametrize("case", M.CASES, ids=[f"{c.name}-{c.how}" for c in M.CASES])
def test_model_on_cuda_matches_eager(case, scale):
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    model, inputs = case.build("cuda", scale)
    obj = M.compile_case(case, model, inputs)
    ref_model = copy.deepcopy(model)
    f = pyfuser.jit(obj)
    with torch.no_grad():
        got, want = M.tensors(f(*inputs)), M.tensors(ref_model(*inputs))
    assert len(got) == len(want) >= 1
    for g, w in zip(got, want):
        assert g.is_cuda and g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    assert f.last_run.kernels >= 1 and f.last_run.eager_groups == 0, f.last_run.fallbacks


def _t5_bucket(r):
    return (torch.log(r.float() / 8) / math.log(128 / 8) * 8).to(torch.long)


@pytest.mark.gpu
def test_traced_constants_exact_on_cuda():
    x = torch.arange(8, 128, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = torch.jit.trace(_t5_bucket, (x,))
    from pyfuser.frontend.torchscript import graph_from_function
    from pyfuser.frontend.torchscript.constants import constant_value
    consts = [constant_value(n) for n in graph_from_function(tr).nodes()
              if n.kind == "prim::Constant"]
    assert any(isinstance(c, torch.Tensor) and c.item() == math.log(16) for c in consts)
    f = pyfuser.jit(tr)
    assert torch.equal(f(x), _t5_bucket(x))


@pytest.mark.gpu
def test_seed002_traced_forms_on_cuda():
    mod = load_module_from_path(
        "test_fuser_traced_views", os.path.join(os.path.dirname(HERE), "cpu",
                                                "test_fuser_traced_views.py"),
        fresh=True, register=False)
    for name, fn, shape, kernels in mod.SEED002:
        x = torch.randn(shape, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = pyfuser.jit(torch.jit.trace(fn, (x,), check_trace=False))
        got, ref = f(x.clone()), fn(x.clone())
        for g, r in zip(got if isinstance(got, tuple) else (got,),
                        ref if isinstance(ref, tuple) else (ref,)):
            torch.testing.assert_close(g, r)
        assert f.last_run.kernels == kernels and f.last_run.eager_groups == 0, name
