"""Never more kernels than eager: for every graph of the fuser corpus and the model corpus, one
call through pyfuser.jit (a call plan) launches at most as many kernels as eager PyTorch runs
kernel-launching aten ops (kernel_count.py: a dispatch hook on the CPU; on a GPU the bench and
tests/gpu count with the profiler)."""
import copy

import pytest
import torch

import model_corpus as M
from fuser_corpus import CASES
from kernel_count import count_eager, count_fused, launches_kernel
from pyfuser.frontend.torchscript.fuse_api import jit


def _check(f, eager, args_fused, args_eager):
    with torch.no_grad():
        f(*args_fused())                 # the checked call that makes the plan
    fused, fused_ops = count_fused(f, *args_fused())
    want, eager_ops = count_eager(eager, *args_eager())
    assert fused <= want, (f"{fused} kernels fused vs {want} eager\nfused: "
                           f"{f.last_run.kernels} in groups + {fused_ops}\neager: {eager_ops}\n"
                           f"{f.graph}")
    return fused, want


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fuser_corpus_never_more_kernels_than_eager(case):
    obj = torch.jit.trace(case.fn, tuple(case.inputs())) if case.traced \
        else torch.jit.script(case.fn)
    f = jit(obj, cpu_executor="evaluator")
    _check(f, case.fn, case.inputs, case.inputs)


@pytest.mark.parametrize("case", M.CASES, ids=[f"{c.name}-{c.how}" for c in M.CASES])
def test_models_never_more_kernels_than_eager(case):
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    model, inputs = case.build("cpu")
    ref = copy.deepcopy(model)
    f = jit(M.compile_case(case, model, inputs), cpu_executor="evaluator")
    fused, want = _check(f, ref, lambda: inputs, lambda: inputs)
    assert f.last_run.kernels >= 1


def test_the_count_skips_views_and_allocations():
    x = torch.randn(4, 6)
    n, ops = count_eager(lambda t: (t.view(6, 4).t() + 1).sum(), x)
    assert ops == ["add.Tensor", "sum.default"] and n == 2
    assert not launches_kernel(torch.ops.aten.empty.memory_format)
    assert launches_kernel(torch.ops.aten.add_.Tensor)
