"""Embedding lookups and index_select read inside pointwise kernels (schedule/pointwise_graph.py's
"ix" keys, lowering/aten_indexing.py): the rows are read at the index's values in the kernel that
consumes them, with 16-byte vectors along a row where the index is the same along it; an index
outside the gathered axis stops the kernel with an error (IndexError here, a trap on the GPU);
the kernels compile with NVRTC for sm_90; results equal eager's exactly (only where elements
are read from changes). Also torch.gather and lookups of looked-up indices; lookups inside
normalization kernels are in test_gather_normalization.py."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.codegen import api
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.runtime import dispatch, nvrtc

from compile_checks import assert_ran_as_sm90_kernels
from test_inner_outer import _fusion

pytestmark = pytest.mark.usefixtures("fresh_compile")
ew = B.elementwise
DTYPES = [DataType.Float, DataType.BFloat16]


def _lookup_add(dtype, index_dtype=DataType.Int, rank=2):
    """out = table[ids] * 2 + y: the ids of `rank` axes, a row of 64."""
    table = B.define_tensor([-1, 64], dtype)
    ids = B.define_tensor([-1] * rank, index_dtype)
    y = B.define_tensor([-1] * rank + [64], dtype)
    return [ew("add", ew("mul", B.embedding(table, ids), 2.0), y)]


def _inputs(dtype, index_dtype=torch.int64, rank=2, rows=50):
    shape = (3, 7)[:rank] if rank else ()
    table = torch.randn(rows, 64).to(dtype.torch)
    ids = torch.randint(0, rows, shape if rank else (), dtype=index_dtype)
    return [table, ids, torch.randn(*shape, 64).to(dtype.torch)]


def _eager(table, ids, y):
    rows = torch.embedding(table, ids)
    return (rows.float() * 2 + y.float()).to(table.dtype) if table.dtype != torch.float32 \
        else rows * 2 + y


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_lookup_fuses_into_one_vectorized_kernel(dtype, rank):
    f = _fusion(lambda: _lookup_add(dtype, rank=rank))
    inputs = _inputs(dtype, rank=rank)
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "pointwise"
    assert plan.params.vec == 16 // dtype.itemsize           # whole 16-byte vectors of a row
    assert "__trap()" in plan.kernel.source
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    for mode in ("interpret", "evaluator"):
        (out,) = dispatch.execute_fusion(f, inputs, mode)
        want = _eager(*inputs)
        assert out.shape == want.shape and out.dtype == want.dtype
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    report = dispatch.last_report(f)
    assert report is None or report.eager_segments == 0


@pytest.mark.parametrize("bad", [50, -1, 2 ** 40])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_an_index_outside_the_table_is_an_error(bad, index_dtype):
    """As eager's embedding: an error naming the kernel and the index, never a read outside the
    table (a wrapped negative index, or an int64 index cut to 32 bits, would be a silent wrong
    row)."""
    if index_dtype is torch.int32 and bad >= 2 ** 31:
        pytest.skip("not an int32")
    idt = DataType.Int if index_dtype is torch.int64 else DataType.Int32
    f = _fusion(lambda: _lookup_add(DataType.Float, idt))
    inputs = _inputs(DataType.Float, index_dtype)
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    torch.testing.assert_close(out, _eager(*inputs), rtol=0, atol=0)
    inputs[1][1, 4] = bad
    with pytest.raises(IndexError, match=f"index out of range.*: {bad}$"):
        dispatch.execute_fusion(f, inputs, "interpret")
    with pytest.raises(IndexError):
        _eager(*inputs)


def test_index_along_the_row_reads_one_element_a_step():
    """index_select along the last axis: the index changes along the vectors, so the kernel
    reads one element a step (no vector), and its values are eager's."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        return [ew("exp", B.index_select(x, i, 1))]
    f = _fusion(build)
    x, i = torch.randn(6, 40), torch.randint(0, 40, (24,))
    plan = api.plan_kernel(f, [x, i])
    assert plan.scheduler == "pointwise" and plan.params.vec == 1
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, torch.index_select(x, 1, i).exp(), rtol=0, atol=0)


def test_a_computed_table_is_cut_from_the_lookup():
    """The rows are read from memory: a table computed in the fusion (weight * 2) is its own
    kernel's output first; the results are still eager's."""
    def build():
        w = B.define_tensor([-1, 16], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        return [ew("add", B.embedding(ew("mul", w, 2.0), i), 1.0)]
    f = _fusion(build)
    w, i = torch.randn(9, 16), torch.tensor([8, 0, 3, 3])
    (out,) = dispatch.execute_fusion(f, [w, i], "interpret")
    torch.testing.assert_close(out, (w * 2)[i] + 1, rtol=0, atol=0)
    report = dispatch.last_report(f)
    assert report.eager_segments == 0 and report.kernels == 2, report


class _Embeddings(torch.nn.Module):
    """GPT-2's input embeddings: token rows plus position rows (positions from an arange)."""
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(100, 64), torch.nn.Embedding(32, 64)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(pos))


def test_token_and_position_embeddings_are_one_kernel_under_torch_compile():
    m = _Embeddings()
    ids = torch.randint(0, 100, (4, 32))
    with torch.no_grad():
        got, want = pyfuser.compile(m)(ids), m(ids)
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (g,) = compiled_graphs()
    assert not g.unsupported and len(g.regions) == 1, (g.unsupported, g.regions)
    assert sum(op == "aten.embedding.default" for op in g.regions[0].ops) == 2
    report = dispatch.last_report(g.regions[0].fusion)
    assert report.kernels == 1, report
    assert_ran_as_sm90_kernels(g.regions)


def test_embedding_training_step_matches_eager():
    """The forward's lookups fuse; the backward's embedding_dense_backward is an embedding_backward kernel; the
    weights' gradients are eager's."""
    torch.manual_seed(0)
    m = _Embeddings()
    ref = _Embeddings()
    ref.load_state_dict(m.state_dict())
    ids = torch.randint(0, 100, (4, 32))
    ids[0, :3] = 7                                     # repeated rows: their gradients add
    loss = lambda out: (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()
    loss(pyfuser.compile(m)(ids)).backward()
    loss(ref(ids)).backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6, msg=name)
    fwd = [g for g in compiled_graphs() if g.kind == "forward"]
    assert fwd and any("aten.embedding.default" in r.ops for g in fwd for r in g.regions)


def _ts_lookup(table, ids, y):
    return torch.embedding(table, ids) * 2.0 + y


def test_torchscript_lookup_is_one_group_and_one_kernel():
    from pyfuser.frontend.torchscript.fuse_api import jit
    f = jit(torch.jit.script(_ts_lookup))
    inputs = _inputs(DataType.Float)
    for _ in range(2):
        out = f(*inputs)
        torch.testing.assert_close(out, _ts_lookup(*inputs), rtol=0, atol=0)
        assert (f.last_run.groups, f.last_run.kernels) == (1, 1), f.last_run.as_dict()
        assert f.last_run.eager_groups == 0


def test_fusion_definition_embedding_fwd():
    """nvFuser's fd.ops.embedding_fwd: one pointwise kernel with the op after it, eager's rows;
    max_norm (an in-place renormalization of the weight) is refused with a reason."""
    from pyfuser.errors import FusionDefinitionError
    from pyfuser.frontend.definition import Fusion as FS, FusionDefinition
    fs = FS()
    with FusionDefinition(fs) as fd:
        ids = fd.define_tensor([-1, -1], dtype=DataType.Int)
        w = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.embedding_fwd(ids, w, padding_idx=0)))
    i, w = torch.randint(0, 20, (3, 5)), torch.randn(20, 8)
    (out,) = fs.execute([i, w])
    torch.testing.assert_close(out, torch.nn.functional.embedding(i, w).relu(), rtol=0, atol=0)
    assert "fd.ops.embedding_fwd(" in repr(fd)
    report = dispatch.last_report(fs._ir)
    assert report is not None and report.eager_segments == 0 and report.kernels == 1, report
    with pytest.raises(FusionDefinitionError, match="max_norm"):
        with FusionDefinition(FS()) as fd:
            ids = fd.define_tensor([-1], dtype=DataType.Int)
            w = fd.define_tensor([-1, -1], dtype=DataType.Float)
            fd.ops.embedding_fwd(ids, w, max_norm=1.0)


# ---- torch.gather, and lookups of looked-up indices ---------------------------------------------
@pytest.mark.parametrize("dim,index_shape", [(1, (6, 25)), (0, (4, 40)), (1, (3, 25))])
def test_gather_reads_inside_a_pointwise_kernel(dim, index_shape):
    """torch.gather: the input read along `dim` at the index's values, the index of the
    input's rank (smaller than the input along the other axes too: (3, 25) of (6, 40))."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1, -1], DataType.Int)
        return [ew("exp", B.gather(x, i, dim))]
    f = _fusion(build)
    x = torch.randn(6, 40)
    i = torch.randint(0, x.shape[dim], index_shape)
    plan = api.plan_kernel(f, [x, i])
    assert plan.scheduler == "pointwise"
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, torch.gather(x, dim, i).exp(), rtol=0, atol=0)
    i[0, 1] = x.shape[dim]
    with pytest.raises(IndexError, match="index out of range"):
        dispatch.execute_fusion(f, [x, i], "interpret")


@pytest.mark.parametrize("vectors", [True, False], ids=["same-along-row", "along-row"])
def test_a_computed_index_is_computed_inside_the_kernel(vectors):
    """An index computed from an input and an iota (i * 3 + 1 - position, kept in range by a
    remainder) is computed in the gathering kernel from the index's registers and the
    element's position, not written by a kernel of its own: one kernel, eager's values (a
    computed index outside the axis: the next test)."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1, -1] if not vectors else [-1, 1], DataType.Int)
        n = x.logical[1 if not vectors else 0].extent
        pos = B.iota(i.logical[0].extent, 0, 1, DataType.Int)
        pos = B.broadcast(pos, [False, True])
        at = ew("remainder", ew("sub", ew("add", ew("mul", i, 3), 1), pos), n)
        if vectors:      # rows of x picked per row of the output: the same index along a row
            return [ew("exp", B.index_select(x, B.reshape(at, [i.logical[0].extent]), 0))]
        return [ew("exp", B.gather(x, at, 1))]
    f = _fusion(build)
    x = torch.randn(6, 40)
    i = torch.randint(-50, 50, (6, 1) if vectors else (6, 25))
    at = (i * 3 + 1 - torch.arange(6)[:, None]) % (6 if vectors else 40)
    want = (x.index_select(0, at.view(-1)) if vectors else torch.gather(x, 1, at)).exp()
    plan = api.plan_kernel(f, [x, i])
    assert plan.scheduler == "pointwise"
    assert plan.params.vec == (4 if vectors else 1), plan.params.vec
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.eager_segments == 0, report


def test_a_computed_index_out_of_range_stops_the_kernel():
    """x[:, 2 * i]: the doubled index is checked against the axis in the kernel."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1, -1], DataType.Int)
        return [B.gather(x, ew("mul", i, 2), 1)]
    f = _fusion(build)
    x, i = torch.randn(3, 10), torch.randint(0, 5, (3, 4))
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, torch.gather(x, 1, i * 2), rtol=0, atol=0)
    i[1, 2] = 5
    with pytest.raises(IndexError, match="index out of range"):
        dispatch.execute_fusion(f, [x, i], "interpret")


@pytest.mark.parametrize("reduce", [False, True], ids=["pointwise", "reduction"])
def test_a_copy_in_a_computed_index_is_its_value(reduce):
    """Regression (fresh-clone CI, test_compile_scatter_views): a copy (set) of the index in
    its chain, as an index_put's functionalized graph makes, is read through like a view."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        rows = B.index_select(x, ew("add", B.set_(i), 1), 0)
        return [B.reduction("sum", rows, [1]) if reduce else ew("neg", rows)]
    f = _fusion(build)
    x, i = torch.randn(6, 40), torch.tensor([4, 0, 2])
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    want = x[i + 1].sum(1) if reduce else -x[i + 1]
    torch.testing.assert_close(out, want)
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.eager_segments == 0, report


def test_rows_at_a_computed_index_are_summed_in_the_reduction_kernel():
    """A row sum of rows looked up at a computed index (ids * 2 + 1): the reduction kernel
    computes the row's index from the index tensor's element, one kernel."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        return [B.reduction("sum", B.index_select(x, ew("add", ew("mul", i, 2), 1), 0), [1])]
    f = _fusion(build)
    x, i = torch.randn(9, 70), torch.tensor([0, 3, 1, 1, 2])
    plan = api.plan_kernel(f, [x, i])
    assert plan.scheduler == "reduction", plan.scheduler
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, [x, i], "interpret")
    torch.testing.assert_close(out, x[i * 2 + 1].sum(1))
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.eager_segments == 0, report


class _BertEmbeddings(torch.nn.Module):
    """HF BERT's embeddings as its code writes them (transformers' modeling_bert): the token
    types gathered from a buffer at the positions, then three lookups, their sum and a layer
    norm."""
    def __init__(self):
        super().__init__()
        self.words, self.types = torch.nn.Embedding(100, 64), torch.nn.Embedding(2, 64)
        self.places, self.norm = torch.nn.Embedding(32, 64), torch.nn.LayerNorm(64)
        self.register_buffer("position_ids", torch.arange(32).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, 32, dtype=torch.long),
                             persistent=False)

    def forward(self, ids):
        b, s = ids.shape
        pos = self.position_ids[:, :s]
        tt = torch.gather(self.token_type_ids.expand(pos.shape[0], -1), dim=1, index=pos)
        tt = tt.expand(b, s)
        return self.norm(self.words(ids) + self.types(tt) + self.places(pos))


def test_bert_token_types_gather_joins_the_embeddings_kernel():
    """The token types' gather is a lookup whose result is another lookup's index: read in the
    same kernel (nested), so BERT's whole embedding block is one region and one kernel."""
    m = _BertEmbeddings()
    with torch.no_grad():
        m.token_type_ids[0, 3:9] = 1
    ids = torch.randint(0, 100, (4, 20))
    with torch.no_grad():
        got, want = pyfuser.compile(m)(ids), m(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (g,) = compiled_graphs()
    assert not g.unsupported and len(g.regions) == 1, g.unsupported
    assert "aten.gather.default" in g.regions[0].ops
    report = dispatch.last_report(g.regions[0].fusion)
    assert report.kernels == 1 and report.eager_segments == 0, report
    assert_ran_as_sm90_kernels(g.regions)


def test_an_iota_index_axis_stays_out_of_the_vectors_group():
    """Review finding: a column sum of y + t[arange(N)][None, :, None] (a lookup at iota
    positions along a kept axis of an outer reduction): the reduction scheduler merged that
    axis with the innermost one, so a vector of lanes crossed rows with one index, a silent
    wrong sum. A lookup's index axes now stay groups of their own."""
    from pyfuser.schedule import reduction
    def build():
        t, y = B.define_tensor([-1], DataType.Float), B.define_tensor([-1, -1, -1], DataType.Float)
        pos = B.iota(y.logical[1].extent, 0, 1, DataType.Int)
        g = B.broadcast(B.index_select(t, pos, 0), [True, False, True])
        return [B.reduction("sum", ew("add", y, g), [0])]
    f = _fusion(build)
    t, y = torch.randn(10), torch.randn(5, 4, 3)
    sched = reduction.schedule(f, [t, y])
    assert [1] in sched.params.groups, sched.params.groups
    (out,) = dispatch.execute_fusion(f, [t, y], "interpret")
    torch.testing.assert_close(out, (y + t[:4][None, :, None]).sum(0))


def test_layer_norm_of_a_lookup_with_a_column_sum_runs():
    """Review finding: the inner-outer scheduler (a layer norm's rows and a column sum in one
    kernel) took the lookup without reading its key entries right: a TypeError, no fallback."""
    def fn(w, i, g):
        y = torch.nn.functional.layer_norm(torch.nn.functional.embedding(i, w), (64,))
        return y, (y * g).sum(0)
    w, i, g = torch.randn(30, 64), torch.randint(0, 30, (16,)), torch.randn(16, 64)
    got, want = pyfuser.compile(fn)(w, i, g), fn(w, i, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _lookup_after_a_column_sum(x, t, i):
    y = x - x.mean(1, keepdim=True)
    return y, y.sum(0) + torch.gather(t, 0, i).squeeze(0)


def _selection_after_a_column_sum(x, t, i):
    y = x - x.mean(1, keepdim=True)
    return y, y.sum(0) + torch.index_select(t, 0, i)


@pytest.mark.parametrize("fn,t,i", [
    (_lookup_after_a_column_sum, (5, 64), (1, 64)),
    (_selection_after_a_column_sum, (70,), (64,))], ids=["gather", "index_select"])
def test_a_lookup_after_a_column_sum_is_cut_from_the_inner_outer_kernel(fn, t, i):
    """Review finding: a lookup read after a sum over the rows, beside a row normalization: the
    inner-outer scheduler's column graph had no index mapping through it (an AssertionError out
    of every frontend). It now refuses with a reason and the lookup gets its own kernel."""
    from pyfuser.frontend.torchscript.fuse_api import jit
    x = torch.randn(16, 64)
    t = torch.randn(*t)
    i = torch.randint(0, t.shape[0], i)
    want = fn(x, t, i)
    for compiled in (pyfuser.compile(fn), jit(torch.jit.script(fn))):
        with torch.no_grad():
            got = compiled(x, t, i)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_lookup_in_a_horizontal_kernel():
    """A lookup beside an independent pointwise computation: one horizontal kernel, whose
    renaming of each component's kernel IR reaches the index check's names too."""
    def build():
        t, i = B.define_tensor([-1, 64], DataType.Float), B.define_tensor([-1], DataType.Int)
        y = B.define_tensor([-1], DataType.Float)
        return [ew("add", B.embedding(t, i), 1.0), ew("mul", y, 2.0)]
    f = _fusion(build)
    inputs = [torch.randn(9, 64), torch.tensor([8, 0, 3]), torch.randn(100)]
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "horizontal"
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    a, b = dispatch.execute_fusion(f, inputs, "interpret")
    assert torch.equal(a, inputs[0][inputs[1]] + 1) and torch.equal(b, inputs[2] * 2)
    inputs[1][1] = 9
    with pytest.raises(IndexError, match="index out of range.*: 9$"):
        dispatch.execute_fusion(f, inputs, "interpret")
