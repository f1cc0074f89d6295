"""Dynamo's unspecialised Python floats under dynamic=True: a float attribute or global (an
epsilon, an attention scale, GPT-2's `math.sqrt(2.0 / math.pi)`) is a 0-dim float64 CPU input
of the graph, which AOTAutograd's tensorify pass computes with in float64 and converts to the
op's computation dtype before the op (`prims.convert_element_type`, `true_divide.Tensor`,
`sqrt`). Those ops lower through the one op table and fuse with the ops reading them (they had
split GPT-2's GELU into two tiny regions); a 0-dim operand keeps eager's promotion (it does not
promote a dimensioned tensor of its category) and the value eager computes with
(lowering/scalar_operands.py): results equal eager's bit for bit, float32, bfloat16 and half.
A region on CUDA takes such an input by value (a kernel parameter: no copy to the device, and
its cached calls replay), checked on fake_cuda.py's fake CUDA. Floats of symbolic sizes
(`x / math.sqrt(x.shape[-1])`: `scalar_tensor` of a SymInt, then the same float64 chain) fuse
too."""
from __future__ import annotations

import math

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


class Scaled(torch.nn.Module):
    """Float attributes and a global in mul, add, div, sub and a comparison, and
    `sqrt(2 / pi)`."""

    def __init__(self):
        super().__init__()
        self.scale, self.eps = 0.1234567, 1e-3

    def forward(self, x):
        y = x * self.scale + self.eps
        return (y / self.scale - self.eps) * math.sqrt(2.0 / math.pi), \
            torch.where(x > self.eps, x, x * self.scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unspecialised_floats_fuse_with_eagers_values(dtype, plans):
    model = Scaled()
    cm = pyfuser.compile(model, dynamic=True)
    seen = []
    for n in (6, 10, 14):
        x = torch.randn(5, n, generator=torch.Generator().manual_seed(n)).to(dtype) * 4
        with torch.no_grad():
            got, want = cm(x), model(x)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype == dtype and g.shape == w.shape
            assert torch.equal(g, w), (dtype, n, (g.float() - w.float()).abs().max())
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]     # no recompile, no new kernel
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert "prims.convert_element_type.default" in ops and "aten.true_divide.Tensor" in ops
    placeholders = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    scalars = [n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)
               and n.meta["val"].dim() == 0]
    assert scalars and all(n.meta["val"].dtype == torch.float64 for n in scalars)
    assert all(r.eager_calls == 0 for r in graph.regions)


def _lowered_on_fake_cuda(ops):
    """The one region of a graph over x (a fake CUDA bfloat16 [4, 64]), s (a 0-dim float64 CPU
    tensor: an unspecialised float) and t (a 0-dim float32 CUDA tensor), lowered: its Fusion
    and the region. `ops(g, x, s32, t)` gives the graph's outputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from pyfuser.frontend.fx.lower import lower_region
    from pyfuser.frontend.fx.partition import partition
    from pyfuser.frontend.fx.support import node_support
    g = torch.fx.Graph()
    x, s, t = g.placeholder("x"), g.placeholder("s"), g.placeholder("t")
    cvt = torch.ops.prims.convert_element_type.default
    s32 = g.call_function(cvt, (g.call_function(cvt, (s, torch.float64)), torch.float32))
    g.output(tuple(ops(g, x, s32, t)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fx = torch.empty(4, 64, device="cuda", dtype=torch.bfloat16)
        ft = torch.empty((), device="cuda")
    FakeTensorProp(gm, mode).propagate(fx, torch.tensor(0.5, dtype=torch.float64), ft)
    nodes = list(gm.graph.nodes)
    supported = {n for n in nodes if node_support(n, set(nodes[-1].all_input_nodes))[0]}
    (region,) = partition(nodes, supported)
    assert region.outputs == list(nodes[-1].args[0])
    return lower_region(region), region


def test_cuda_reads_a_cpu_scalar_operand_in_float(monkeypatch, tmp_path):
    """On CUDA eager's add / sub / mul / div kernels read a 0-dim CPU operand (`other`) as a
    float scalar: bfloat16 x * s is round(float(x) * s), not x * bf16(s) (what the kernel
    does with a 0-dim CUDA tensor, cast to the common dtype first, as here for t). The region
    takes s by value (a kernel parameter): run on the fake CUDA of fake_cuda.py (kernels
    interpreted), it gives those values with no copy to the device, and its second call
    replays the recorded program."""
    import fake_cuda
    from pyfuser.frontend.fx.region import FusedRegion
    from pyfuser.runtime import dispatch
    A = torch.ops.aten

    def ops(g, x, s, t):
        outs = [g.call_function(op, (x, s)) for op in (A.mul.Tensor, A.add.Tensor,
                                                       A.sub.Tensor, A.div.Tensor)]
        return outs + [g.call_function(A.mul.Tensor, (outs[0], t))]
    lowered, region = _lowered_on_fake_cuda(ops)
    assert len(region.nodes) == 7 and [x.name for x in region.inputs] == ["s", "x", "t"]
    assert lowered.scalar_inputs == [0]                 # s by value, x and t tensors
    fake = fake_cuda.install(monkeypatch, tmp_path)
    try:
        fr = FusedRegion("r", lowered, region, torch.nn.Module())
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
        s = fake.host(torch.tensor(math.sqrt(2.0 / math.pi), dtype=torch.float64))
        t = s.float()                                   # posing as a CUDA tensor
        for _ in range(2):
            got = fr(s, x, t)
        recorded = len(fr.progs.runs)
    finally:
        dispatch.clear_caches()
    assert fake.h2d == [] and recorded == 1 and fr.calls == 2 and fr.eager_calls == 0
    s32, xf = s.float(), x.float()
    want = [(xf * s32).bfloat16(), (xf + s32).bfloat16(), (xf - s32).bfloat16(),
            (xf / s32).bfloat16()]
    want.append((want[0].float() * t.bfloat16().float()).bfloat16())
    for k, (g_, w) in enumerate(zip(got, want)):
        assert g_.dtype == torch.bfloat16 and torch.equal(g_, w), k
    # the rounded scalar would differ: the test tells the two apart
    assert not torch.equal(want[0], x * s32.bfloat16())


def _size_scalars(x):
    """Float scalars of symbolic sizes (SymFloats under dynamic=True): an attention scale
    `1 / sqrt(head_dim)` in its forms, a mean's `1 / n`, a float of a size product."""
    n, b = x.shape[-1], x.shape[0]
    h = x * 2
    return (h / math.sqrt(n),                          # sym_sqrt: scalar_tensor(s1), sqrt
            h * (1.0 / math.sqrt(n)),
            h / n ** 0.5,                              # pow of the float64 scalar
            h * (1.0 / n),                             # true_divide
            h / float(n),
            h / math.sqrt(n * b))                      # a product of two sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_symbolic_float_scalars_of_sizes_fuse(dtype, plans):
    """`x / math.sqrt(x.shape[-1])` under dynamic=True: Dynamo's SymFloat becomes, in
    AOTAutograd's graph, `scalar_tensor(s1)` (the SymInt), converted to float64, `sqrt` /
    `pow` / `true_divide`, converted to the op's dtype. scalar_tensor of a symbolic size had
    been left to eager ("not a constant number"), a tiny op and a 0-dim tensor input per
    region; it is now a 0-dim tensor of the size scalar in the Fusion (the size converted on
    the host when the sizes are bound, the float64 chain once per thread in the kernel). One
    graph and no new kernel over three sizes, no op left out, eager's values bit for bit."""
    cf = pyfuser.compile(_size_scalars, dynamic=True)
    seen = []
    for b, n in ((3, 6), (5, 10), (7, 14)):
        x = torch.randn(b, n, generator=torch.Generator().manual_seed(n)).to(dtype)
        with torch.no_grad():
            got, want = cf(x), _size_scalars(x)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype == dtype and g.shape == w.shape and \
                g.stride() == w.stride(), (k, n)
            assert torch.equal(g, w), (dtype, k, n, (g.float() - w.float()).abs().max())
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]     # no recompile, no new kernel
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.scalar_tensor.default") >= 5 and "aten.sqrt.default" in ops
    assert all(r.eager_calls == 0 for r in graph.regions)
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def _scaled_softmax(x):
    return torch.softmax(x * 2 / math.sqrt(x.shape[-1]), -1)


def test_a_scaled_softmax_takes_the_size_scalar_in_its_region():
    """An attention-like softmax of `x / sqrt(head_dim)`: the size's scalar_tensor joins the
    softmax's region (a reduction kernel reads it), one graph over three sizes, values within
    float tolerance of eager's (the row reductions may round differently)."""
    cf = pyfuser.compile(_scaled_softmax, dynamic=True)
    for b, n in ((3, 6), (5, 10), (7, 14)):
        x = torch.randn(b, 2, n, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            got, want = cf(x), _scaled_softmax(x)
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want)
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    (region,) = graph.regions
    assert "aten.scalar_tensor.default" in region.ops and region.eager_calls == 0
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)
