"""Embedding lookups read inside normalization kernels (the reduction schedulers' "ix" keys:
BERT's word, position and token-type lookups, their adds and the layer norm one kernel), an
index outside the table stopping the kernel, an index along the reduced axis cut from the
reduction, lookups in staged cluster rows, and what stays eager (index_select of a 0-dim input,
an index along the vectors axis of an outer reduction). Through the CPU interpreter of the kernel
IR against eager, and NVRTC for sm_90. The pointwise lookups are in test_gather_fusion.py."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.codegen import api
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.runtime import dispatch, nvrtc

from test_inner_outer import _fusion

pytestmark = pytest.mark.usefixtures("fresh_compile")
ew = B.elementwise
DTYPES = [DataType.Float, DataType.BFloat16]


def _lookup_layer_norm(dtype, hidden):
    """BERT's embeddings: word + token-type + position rows (the positions an iota), then a
    layer norm over the hidden axis."""
    def build():
        words = B.define_tensor([-1, hidden], dtype)
        types = B.define_tensor([-1, hidden], dtype)
        places = B.define_tensor([-1, hidden], dtype)
        ids = B.define_tensor([-1, -1], DataType.Int)
        tt = B.define_tensor([-1, -1], DataType.Int32)
        pos = B.broadcast(B.iota(ids.logical[1].extent, 0, 1, DataType.Int), [True, False])
        pos = B.expand(pos, [ids.logical[0].extent, -1])
        h = ew("add", ew("add", B.embedding(words, ids), B.embedding(types, tt)),
               B.embedding(places, pos))
        h = B.cast(h, DataType.Float) if dtype is not DataType.Float else h
        var, mean = B.var_mean(h, [2], 0, True)
        y = ew("mul", ew("sub", h, mean), ew("rsqrt", ew("add", var, 1e-5)))
        return [B.cast(y, dtype) if dtype is not DataType.Float else y]
    return build


def _lookup_layer_norm_inputs(dtype, hidden, rows=(3, 7)):
    g = torch.Generator().manual_seed(0)
    t = lambda n: torch.randn(n, hidden, generator=g).to(dtype.torch)   # noqa: E731
    ids = torch.randint(0, 50, rows, generator=g)
    tt = torch.randint(0, 2, rows, generator=g, dtype=torch.int32)
    return [t(50), t(2), t(16), ids, tt]


def _lookup_layer_norm_eager(words, types, places, ids, tt):
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    h = (torch.embedding(words, ids).float() + torch.embedding(types, tt.long()).float()
         + torch.embedding(places, pos).float()) if words.dtype != torch.float32 else \
        torch.embedding(words, ids) + torch.embedding(types, tt.long()) + \
        torch.embedding(places, pos)
    return torch.nn.functional.layer_norm(h.float(), h.shape[-1:], eps=1e-5).to(words.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("hidden", [64, 4096])
def test_lookups_and_their_layer_norm_are_one_kernel(dtype, hidden):
    """The rows are read inside the normalization kernel (a persistent row in registers, or a
    longer row): one kernel, the layer norm's values as eager's within float rounding."""
    f = _fusion(_lookup_layer_norm(dtype, hidden))
    inputs = _lookup_layer_norm_inputs(dtype, hidden)
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "inner_persistent", plan.scheduler
    assert plan.kernel.source.count("pf_checked_index(") >= 3
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    want = _lookup_layer_norm_eager(*inputs)
    assert out.shape == want.shape and out.dtype == want.dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is DataType.Float else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, want, **tol)
    report = dispatch.last_report(f)
    assert report is None or (report.kernels == 1 and report.eager_segments == 0), report


@pytest.mark.parametrize("which,bad", [(3, 50), (4, -1), (4, 2)])
def test_an_index_outside_the_table_stops_the_normalization_kernel(which, bad):
    f = _fusion(_lookup_layer_norm(DataType.Float, 64))
    inputs = _lookup_layer_norm_inputs(DataType.Float, 64)
    inputs[which][2, 5] = bad
    with pytest.raises(IndexError, match=f"index out of range.*: {bad}$"):
        dispatch.execute_fusion(f, inputs, "interpret")


def test_an_index_along_the_reduced_axis_is_cut_from_the_reduction():
    """index_select along the axis a sum reduces: one index per element of the row, not per
    row; the reduction scheduler refuses it and the lookup runs in a kernel before the sum."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        return [B.reduction("sum", B.index_select(x, i, 1), [1])]
    f = _fusion(build)
    x, i = torch.randn(5, 30), torch.randint(0, 30, (45,))
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, torch.index_select(x, 1, i).sum(1))
    report = dispatch.last_report(f)
    assert report.eager_segments == 0 and report.kernels == 2, report


def test_bert_embeddings_and_layer_norm_are_one_kernel_under_torch_compile():
    class Embeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.words, self.types = torch.nn.Embedding(100, 64), torch.nn.Embedding(2, 64)
            self.places, self.norm = torch.nn.Embedding(32, 64), torch.nn.LayerNorm(64)

        def forward(self, ids, tt):
            pos = torch.arange(ids.shape[1]).unsqueeze(0)
            return self.norm(self.words(ids) + self.types(tt) + self.places(pos))
    m = Embeddings()
    ids, tt = torch.randint(0, 100, (4, 32)), torch.randint(0, 2, (4, 32))
    with torch.no_grad():
        got, want = pyfuser.compile(m)(ids, tt), m(ids, tt)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (g,) = compiled_graphs()
    assert not g.unsupported and len(g.regions) == 1
    report = dispatch.last_report(g.regions[0].fusion)
    assert report.kernels == 1 and report.eager_segments == 0, report


def test_lookup_in_a_staged_cluster_row():
    """Rows of 65536 bfloat16 elements: a cluster of blocks a row, its loads staged in shared
    memory by async copies, each copy's address the looked-up row's."""
    def build():
        t = B.define_tensor([-1, 65536], DataType.BFloat16)
        i = B.define_tensor([-1], DataType.Int)
        h = B.cast(B.embedding(t, i), DataType.Float)
        var, mean = B.var_mean(h, [1], 0, True)
        return [B.cast(ew("mul", ew("sub", h, mean), ew("rsqrt", ew("add", var, 1e-5))),
                       DataType.BFloat16)]
    f = _fusion(build)
    inputs = [torch.randn(6, 65536).bfloat16(), torch.tensor([0, 5, 3, 3])]
    plan = api.plan_kernel(f, inputs)
    assert plan.params.cluster > 1 and plan.params.stage and "pf_cp_async" in plan.kernel.source
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    x = inputs[0][inputs[1]].float()
    want = torch.nn.functional.layer_norm(x, (65536,), eps=1e-5).bfloat16()
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


def _index_select_of_a_number(x, i):
    return torch.index_select(x, 0, i) * 2


def test_index_select_of_a_0_dim_input_stays_eager():
    """Review finding: index_select of a 0-dim input (eager: its one element) has no axis to
    gather; the lowering refuses it (it crashed the pointwise graph) and eager runs it."""
    from pyfuser.frontend.torchscript.fuse_api import jit
    x, i = torch.tensor(5.0), torch.tensor([0])
    want = _index_select_of_a_number(x, i)
    assert torch.equal(jit(torch.jit.script(_index_select_of_a_number))(x, i), want)
    assert torch.equal(pyfuser.compile(_index_select_of_a_number)(x, i), want)
    from pyfuser.schedule import pointwise
    f = _fusion(lambda: [ew("mul", B.index_select(B.define_tensor([], DataType.Float),
                                                  B.define_tensor([-1], DataType.Int), 0), 2.0)])
    ok, why = pointwise.can_schedule(f)
    assert not ok and "no axis to gather" in why
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    assert torch.equal(out, want)


def test_an_index_along_the_vectors_axis_of_an_outer_reduction_is_refused():
    """A column sum of x.index_select(1, i) + y: y's layout makes the gathered axis the
    innermost one in memory, a kept axis the vectors run along, while the row's index changes
    along it (a silent wrong sum before this check: each vector read one index's column).
    The reduction schedulers refuse these inputs with the reason; the values are eager's."""
    from pyfuser.ir.shapes import bind
    from pyfuser.schedule import reduction
    def build():
        x, i = B.define_tensor([-1, -1], DataType.Float), B.define_tensor([-1], DataType.Int)
        y = B.define_tensor([-1, -1], DataType.Float)
        return [B.reduction("sum", ew("add", B.index_select(x, i, 1), y), [0])]
    f = _fusion(build)
    inputs = [torch.randn(50, 40), torch.randint(0, 40, (64,)), torch.randn(50, 64)]
    ok, why = reduction._gather_layout(f, inputs, bind(f, inputs))
    assert not ok and "innermost axis" in why
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    want = (torch.index_select(inputs[0], 1, inputs[1]) + inputs[2]).sum(0)
    torch.testing.assert_close(out, want)
