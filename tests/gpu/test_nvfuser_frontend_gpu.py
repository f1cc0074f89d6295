"""nvFuser-frontend programs (tests/cpu/nvfuser_frontend_cases.py) on CUDA tensors: eager's results
on the GPU, outputs on the inputs' device, the printed definition rebuilding the same cached
fusion, pointwise parts launched as kernels, random ops reproducible under torch.manual_seed."""
import os
import re
import sys

import pytest
import torch

from pyfuser import DataType, FusionCache, FusionDefinition

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

pytestmark = pytest.mark.gpu

C = load_module_from_path("nvfuser_frontend_cases", os.path.join(
    os.path.dirname(__file__), "..", "cpu", "nvfuser_frontend_cases.py"), fresh=True,
    register=False)


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


@pytest.mark.parametrize("name", sorted(C.CASES))
def test_case_on_cuda(name):
    fusion, make_inputs, eager = C.CASES[name]
    inputs = make_inputs("cuda")
    want = eager(_clone(inputs))
    with FusionDefinition() as fd:
        fusion(fd, inputs)
    out = fd.execute(_clone(inputs))
    assert len(out) == len(want)
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    for o, w in zip(out, want):
        assert o.dtype == w.dtype and o.shape == w.shape
        assert o.is_cuda == on_gpu
        torch.testing.assert_close(o, w.to(o.device), equal_nan=True)
    text = repr(fd)
    namespace = {}
    exec(text, namespace)
    with FusionDefinition() as fd2:
        namespace[re.findall(r"nvfuser_fusion_id\d+", text.split("\n")[1])[0]](fd2)
    assert fd2.id() == fd.id()
    for a, b in zip(out, fd2.execute(_clone(inputs))):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_pointwise_definition_launches_one_kernel_and_is_cached():
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(2):
        with FusionDefinition() as fd:
            t = fd.from_pytorch(x)
            fd.add_output(fd.ops.relu(t * 2.0 + fd.define_constant(1.0)))
        (out,) = fd.execute([x])
        torch.testing.assert_close(out, torch.relu(x * 2.0 + 1.0))
        assert fd.fusion.last_run.kernels == 1 and fd.fusion.last_run.launched == 1
    assert FusionCache.get().num_fusions() == 1


def test_random_ops_on_cuda_follow_torch_manual_seed():
    x = torch.empty(256, 512, device="cuda")
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.uniform(fd.define_constant(0.0), fd.define_constant(1.0),
                                     fd.ops.tensor_sizes(t), DataType.Float))
    torch.manual_seed(3)
    (a,) = fd.execute([x])
    torch.manual_seed(3)
    want = torch.empty(256, 512, device="cuda").uniform_(0.0, 1.0)
    assert a.is_cuda and torch.equal(a, want)


def test_output_stride_order_on_cuda():
    x = torch.randn(2, 3, 4, 5, device="cuda")
    with FusionDefinition() as fd:
        fd.add_output(fd.from_pytorch(x) + 3.0, [3, 1, 0, 2])
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x + 3.0)
    by_rank = [0] * 4
    for axis, rank in enumerate([3, 1, 0, 2]):
        by_rank[rank] = out.stride()[axis]
    assert by_rank == sorted(by_rank, reverse=True)
