"""The torch.compile backend's factory ops and where their regions run: `full`, `ones`,
`zeros`, `scalar_tensor` and integer `arange` fuse (constants, an iota) with eager's values and dtypes;
the partitioner never makes a CUDA region with no CUDA input (it could not tell its device):
random factories are left to eager, and a region fed only by an `arange` (of a constant or a
symbolic size) leaves the arange to eager and keeps its compute (partition tests on fake CUDA
tensors, no GPU needed)."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

bf16 = torch.bfloat16


pytestmark = pytest.mark.usefixtures("fresh_compile")


def _partition_on_fake_cuda(g, symbolic: bool = False):
    """(supported nodes, regions) of graph g (one placeholder: a fake CUDA tensor of 3, or of a
    symbolic size with `symbolic`, as under dynamic shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from pyfuser.frontend.fx.partition import partition
    from pyfuser.frontend.fx.support import node_support
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv() if symbolic else None)
    size = 3
    if symbolic:
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
        size = mode.from_tensor(torch.empty(3, device="meta"), symbolic_context=dynamic).shape[0]
    with mode:
        fake_x = torch.empty(size, device="cuda")
    FakeTensorProp(gm, mode).propagate(fake_x)
    nodes = list(gm.graph.nodes)
    outs = set(nodes[-1].all_input_nodes)
    supported = {n for n in nodes if node_support(n, outs)[0]}
    return supported, partition(nodes, supported)


def test_a_region_making_cuda_values_from_no_cuda_input_is_left_to_eager():
    """A fusion runs on its inputs' device; `rand(..., device="cuda") * 2` has none (found while
    adding factory ops: the region would have run on the CPU)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(torch.ops.aten.rand.default, ([4, 4],), {"device": torch.device("cuda")})
    m = g.call_function(torch.ops.aten.mul.Tensor, (r, 2))
    a = g.call_function(torch.ops.aten.add.Tensor, (x, 1))
    g.output((m, a))
    supported, regions = _partition_on_fake_cuda(g)
    assert {r, m, a} <= supported
    assert [reg.nodes for reg in regions] == [[a]]          # the rand region is dissolved


def test_a_cuda_region_fed_only_by_an_arange_keeps_its_compute():
    """A region whose only source is a factory op (a model's `arange(S) + 0`, the packed-sequence
    checks after it) computes CUDA values from no CUDA input: the arange is left to eager,
    which makes it on the device, and the ops after it stay one region reading it there."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ar = g.call_function(torch.ops.aten.arange.default, (8,), {"device": torch.device("cuda")})
    a = g.call_function(torch.ops.aten.add.Tensor, (ar, 1))
    m = g.call_function(torch.ops.aten.mul.Tensor, (a, 3))
    b = g.call_function(torch.ops.aten.add.Tensor, (x, 1))
    g.output((m, b))
    supported, regions = _partition_on_fake_cuda(g)
    assert {ar, a, m, b} <= supported
    assert sorted([reg.nodes for reg in regions], key=len) == [[b], [a, m]]
    (am,) = [reg for reg in regions if a in reg.nodes]
    assert am.inputs == [ar]                     # the eager arange's CUDA value


def test_a_load_free_cuda_region_leaves_one_factory_op_to_eager():
    """HF Llama's mask on the GPU, once its packed-sequence cumsum fused (fx/rewrite_scan.py):
    aranges and per-layer `where(mask, scalar_tensor(0), scalar_tensor(-inf))` in one region
    that read no CUDA tensor, so every factory op of it ran as an eager kernel (4 aranges and 8
    scalar_tensors at the benchmark's size). One is enough to anchor the region on the device:
    the 0-dim scalar_tensor (fewest elements) is left to eager, the rest stays fused."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    cuda = torch.device("cuda")
    ar = g.call_function(torch.ops.aten.arange.default, (8,), {"device": cuda})
    lt = g.call_function(torch.ops.aten.lt.Scalar, (ar, 4))
    zero = g.call_function(torch.ops.aten.scalar_tensor.default, (0.0,),
                           {"dtype": torch.float32, "device": cuda})
    ninf = g.call_function(torch.ops.aten.scalar_tensor.default, (float("-inf"),),
                           {"dtype": torch.float32, "device": cuda})
    w = g.call_function(torch.ops.aten.where.self, (lt, zero, ninf))
    b = g.call_function(torch.ops.aten.add.Tensor, (x, 1))
    g.output((w, b))
    supported, regions = _partition_on_fake_cuda(g)
    assert {ar, lt, zero, ninf, w, b} <= supported
    (mask,) = [reg for reg in regions if w in reg.nodes]
    assert mask.inputs == [zero] and {ar, lt, ninf, w} <= set(mask.nodes)


def test_a_cuda_region_fed_only_by_an_arange_of_a_symbolic_size_keeps_its_compute():
    """The same under dynamic shapes: `arange(s)` reads the SymInt node s but no tensor, so it is
    left to eager as a factory op with no input is (it had kept the region from running where
    it computes, and the whole region was dissolved into eager ops)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    s = g.call_function(torch.ops.aten.sym_size.int, (x, 0))
    ar = g.call_function(torch.ops.aten.arange.default, (s,), {"device": torch.device("cuda")})
    a = g.call_function(torch.ops.aten.add.Tensor, (ar, 1))
    m = g.call_function(torch.ops.aten.mul.Tensor, (a, 3))
    b = g.call_function(torch.ops.aten.add.Tensor, (x, 1))
    g.output((m, b))
    supported, regions = _partition_on_fake_cuda(g, symbolic=True)
    assert {ar, a, m, b} <= supported
    assert sorted([reg.nodes for reg in regions], key=len) == [[b], [a, m]]
    (am,) = [reg for reg in regions if a in reg.nodes]
    assert am.inputs == [ar]


def test_scalar_tensor_and_full_fuse_as_constants_with_eagers_dtypes():
    """The attention-mask pattern of HF models: where(mask, scalar_tensor(0), scalar_tensor(-inf))."""
    def f(m, x):
        zero = torch.ops.aten.scalar_tensor.default(0.0, dtype=bf16)
        ninf = torch.ops.aten.scalar_tensor.default(float("-inf"), dtype=bf16)
        return torch.where(m, zero, ninf), x + torch.full((3,), 2.5, dtype=torch.float64), \
            torch.full((2,), 7)                    # no dtype: eager infers int64, left to eager
    m, x = torch.rand(3) > 0.5, torch.randn(3)
    with torch.no_grad():
        got = pyfuser.compile(f)(m, x)
    for g, w in zip(got, f(m, x)):
        assert g.dtype == w.dtype and torch.equal(g, w)
    (graph,) = compiled_graphs()
    ops = sorted(tuple(r.ops) for r in graph.regions)
    assert ops == [("aten.full.default", "aten.add.Tensor"),
                   ("aten.scalar_tensor.default", "aten.scalar_tensor.default", "aten.where.self")]
    assert list(graph.unsupported.values()) == [
        "full without a dtype (eager infers it from the value; left to eager)"]


def test_ones_and_zeros_fuse_as_constants_with_eagers_dtypes():
    """`torch.ones` / `torch.zeros` (a default mask, a bias of zeros) fuse as constants: the
    default dtype when none is given, the given one otherwise; values, dtypes and strides as
    eager's."""
    def f(x):
        a = (x + torch.ones(3, 5, 4)) * torch.zeros(5, 4, dtype=torch.float64)
        b = torch.where(x > 0, torch.ones(5, 4, dtype=torch.int32), x.to(torch.int32)) * 2
        return a, b, x.sum(-1) + torch.zeros(3, 5).exp()
    x = torch.randn(3, 5, 4)
    with torch.no_grad():
        got = pyfuser.compile(f)(x)
    for g, w in zip(got, f(x)):
        assert g.dtype == w.dtype and g.stride() == w.stride() and torch.equal(g, w)
    (graph,) = compiled_graphs()
    assert not graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.ones.default") == 2 and ops.count("aten.zeros.default") == 2


def test_integer_arange_fuses_as_an_iota_and_floating_ones_stay_eager():
    """arange(end), arange(start, end), arange(start, end, step) of integers (a class index
    compared with targets, positions): an iota in the kernel with eager's values and dtype; a
    floating arange is left to eager with the reason."""
    def f(t, x):
        hit = t.unsqueeze(1) == torch.arange(7)
        pos = torch.arange(2, 9) * 3 + torch.arange(1, 22, 3, dtype=torch.int32)
        return hit, pos + t[:1], x + torch.arange(0.5, 3.5)
    t, x = torch.randint(0, 7, (5,)), torch.randn(3)
    with torch.no_grad():
        got = pyfuser.compile(f)(t, x)
    for g, w in zip(got, f(t, x)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
    (graph,) = compiled_graphs()
    fused = [op for r in graph.regions for op in r.ops]
    assert fused.count("aten.arange.default") == 1 and fused.count("aten.arange.start") == 1
    assert fused.count("aten.arange.start_step") == 1
    assert list(graph.unsupported.values()) == [
        "arange of other than integer bounds and a nonzero step (left to eager)"]


def test_anchoring_a_region_of_symbolic_size_adds_no_guard():
    """`partition._anchored` picks the factory op of fewest elements; it had taken `int()` of a
    symbolic numel, which guards the size to the example's (Eq(s, 3)): a dynamic-shape graph
    specialized, recompiled at every new size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from pyfuser.frontend.fx.partition import partition
    from pyfuser.frontend.fx.support import node_support
    g = torch.fx.Graph()
    x = g.placeholder("x")
    cuda = torch.device("cuda")
    s = g.call_function(torch.ops.aten.sym_size.int, (x, 0))
    ar = g.call_function(torch.ops.aten.arange.default, (s,), {"device": cuda})
    ar2 = g.call_function(torch.ops.aten.arange.default, (s,), {"device": cuda})
    m = g.call_function(torch.ops.aten.mul.Tensor, (
        g.call_function(torch.ops.aten.add.Tensor, (ar, ar2)), 3))
    g.output((m, g.call_function(torch.ops.aten.add.Tensor, (x, 1))))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    env = ShapeEnv()
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=env)
    size = mode.from_tensor(torch.empty(3, device="meta"), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC])).shape[0]
    with mode:
        fake_x = torch.empty(size, device="cuda")
    FakeTensorProp(gm, mode).propagate(fake_x)
    nodes = list(gm.graph.nodes)
    outs = set(nodes[-1].all_input_nodes)
    regions = partition(nodes, {n for n in nodes if node_support(n, outs)[0]})
    assert not env.guards
    (r,) = [r for r in regions if m in r.nodes]
    tensors = [i for i in r.inputs if isinstance(i.meta["val"], torch.Tensor)]
    assert len(tensors) == 1 and tensors[0] in (ar, ar2)      # one arange anchors it
