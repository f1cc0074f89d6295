"""The embedding_backward kernel (schedule/embedding_backward.py, codegen/
embedding_backward_lowering.py) on the CPU interpreter: every element of the weight gradient is
bit-equal to the sequential sum of its tokens' gradient rows in token order, in float32 (float64
for double), rounded once to the gradient's dtype; close to eager's; an index outside the table
stops the kernel; the kernel compiles with NVRTC for sm_90. Training steps through
pyfuser.compile are in test_embedding_backward_compile.py."""
from __future__ import annotations

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch, nvrtc
from pyfuser.schedule import embedding_backward as EB


def _fusion(grad_rank, ids_rank, dtype, index_dtype, num_weights, padding_idx):
    f = Fusion()
    with f:
        g = B.define_tensor([-1] * grad_rank, DataType.from_torch(dtype))
        i = B.define_tensor([-1] * ids_rank, DataType.from_torch(index_dtype))
        f.add_output(B.embedding_backward(g, i, num_weights, padding_idx))
    return f


def sequential_reference(grad, ids, num_weights, padding_idx):
    """grad_weight[v] = the rows of tokens t with ids[t] == v, added one token after the other
    in token order, in float32 (float64 for double), then rounded to grad's dtype."""
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    h = grad.shape[-1]
    rows = grad.reshape(-1, h).to(acc_dtype)
    acc = torch.zeros(num_weights, h, dtype=acc_dtype)
    for t, v in enumerate(ids.reshape(-1).tolist()):
        if v != padding_idx:
            acc[v] = acc[v] + rows[t]
    return acc.to(grad.dtype)


def _run(grad, ids, num_weights, padding_idx):
    f = _fusion(grad.dim(), ids.dim(), grad.dtype, ids.dtype, num_weights, padding_idx)
    (out,) = dispatch.execute_fusion(f, [grad, ids], "interpret")
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.eager_segments == 0, report
    return out, f


def _check(grad, ids, num_weights, padding_idx=-1):
    out, f = _run(grad, ids, num_weights, padding_idx)
    want = sequential_reference(grad, ids, num_weights, padding_idx)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert torch.equal(out.view(-1).view(torch.uint8) if out.numel() else out,
                       want.view(-1).view(torch.uint8) if want.numel() else want), \
        (out - want).abs().max()
    # eager's CUDA kernel accumulates half / bfloat16 in float32; its CPU kernel in the
    # gradient's dtype (1500 bfloat16 additions drift by whole units): compare with eager's
    # float32 sums rounded once
    wide = grad.float() if grad.dtype in (torch.float16, torch.bfloat16) else grad
    eager = torch.ops.aten.embedding_dense_backward(wide, ids, num_weights, padding_idx,
                                                    False).to(grad.dtype)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12}.get(grad.dtype, 2e-2)
    torch.testing.assert_close(out, eager, rtol=tol, atol=tol)
    return out, f


def _grad(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _ids(shape, high, dtype=torch.int64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_sums_are_the_sequential_float32_sums(dtype, index_dtype):
    """[3, 7] tokens (21: not a multiple of the block), H 37 (no multiple of anything), 11 rows
    (fewer than the tokens: rows gather several tokens), padding row 4."""
    ids = _ids((3, 7), 11, index_dtype)
    ids[0, :3] = 4
    out, _ = _check(_grad((3, 7, 37), dtype), ids, 11, padding_idx=4)
    assert not out[4].any()


@pytest.mark.parametrize("ids_shape", [(45,), (5, 9), (3, 5, 3)], ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("num_weights", [7, 300], ids=["V<N", "V>N"])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_ranks_sizes_and_padding(ids_shape, num_weights, padding_idx):
    _check(_grad((*ids_shape, 24), torch.float32), _ids(ids_shape, num_weights), num_weights,
           padding_idx)


def test_gradient_viewed_as_rows_of_other_shape():
    """Eager takes any gradient of numel(indices) rows: indices [4, 6], gradient [24, 16]."""
    _check(_grad((24, 16), torch.float32), _ids((4, 6), 9), 9)


@pytest.mark.parametrize("num_weights", [8, 2])
def test_a_long_run_of_one_index(num_weights):
    """Every token the same row (a token-type table): one sum of 1500 rows, in order; with 2
    rows the plan loads 32 matched rows at a time (EB.HEAVY_UNROLL)."""
    ids = torch.full((3, 500), 1, dtype=torch.int64)
    _, f = _check(_grad((3, 500, 40), torch.float32), ids, num_weights)
    plan = api.plan_kernel(f, [_grad((3, 500, 40), torch.float32), ids])
    assert plan.params.match_unroll == (EB.HEAVY_UNROLL if num_weights == 2 else 8)
    _check(_grad((3, 500, 40), torch.bfloat16), ids, num_weights)


def test_many_chunks_and_wide_rows():
    """2600 tokens (several chunks of block x unroll), H 600 (a thread owns 3 columns), rows
    alternating between two indices and random ones."""
    ids = _ids((2600,), 700)
    ids[:200] = torch.arange(200) % 2
    _check(_grad((2600, 600), torch.float32, seed=3), ids, 700, padding_idx=1)


def test_several_column_slices():
    """H 1100 > 4 x 256: two column slices (blockIdx.y)."""
    f = _fusion(2, 1, torch.float32, torch.int64, 50, -1)
    plan = api.plan_kernel(f, [_grad((30, 1100), torch.float32), _ids((30,), 50)])
    assert plan.params.block * plan.params.cols < 1100
    _check(_grad((30, 1100), torch.float32), _ids((30,), 50), 50)


def test_strided_indices_and_gradient():
    """Indices expanded along the batch (stride 0: HF's token-type buffer) and a transposed
    gradient: read through their sizes and strides."""
    ids = _ids((1, 13), 6).expand(4, 13)
    grad = _grad((13, 4, 20), torch.float32).transpose(0, 1)
    out, f = _check(grad, ids, 6)
    plan = api.plan_kernel(f, [grad, ids])
    assert not plan.params.ids_dense and not plan.params.grad_dense


def test_no_tokens():
    """No indices: the gradient is all zeros (no launch needed beyond writing them)."""
    out, _ = _check(torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64), 5)
    assert out.shape == (5, 8) and not out.any()


@pytest.mark.parametrize("bad", [9, -1])
def test_an_index_outside_the_table_is_an_error(bad):
    ids = _ids((20,), 9)
    ids[13] = bad
    with pytest.raises(IndexError, match="embedding_dense_backward: index out of range"):
        _run(_grad((20, 8), torch.float32), ids, 9, -1)


def test_bit_identical_across_runs():
    grad, ids = _grad((4, 64, 48), torch.float32), _ids((4, 64), 30)
    a, _ = _run(grad, ids, 30, -1)
    b, _ = _run(grad, ids, 30, -1)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dense", [True, False])
def test_compiles_for_sm90(dtype, dense):
    ids = _ids((8, 512), 30522)
    grad = _grad((8, 512, 768), dtype) if dense else \
        _grad((512, 8, 768), dtype).transpose(0, 1)
    f = _fusion(3, 2, dtype, torch.int64, 30522, 0)
    plan = api.plan_kernel(f, [grad, ids])
    assert plan.scheduler == "embedding_backward"
    assert "__ballot_sync" in plan.kernel.source and "__trap()" in plan.kernel.source
    assert "atomic" not in plan.kernel_ir.__repr__().lower()
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None


def test_plan_for_bert_sizes():
    """Indices 8 x 512, H 768: a slice is the whole row (256 threads x 3 columns; a token-type
    table of 2 rows: one column a thread, 32 rows in flight), the tile's accumulator and lists
    fit 48 KB, and the grid fills 132 SMs at least twice."""
    for vocab in (30522, 8192, 512, 2):
        block, cols, rows, unroll = EB.choose(768, 4096, vocab, 4)
        assert (block, cols, unroll) == ((256, 1, 32) if vocab == 2 else (256, 3, 4))
        assert rows * block * cols * 4 + EB.list_bytes(block, EB.UNROLL) <= EB.SHARED_LIMIT
        blocks = -(-vocab // rows) * -(-768 // (block * cols))
        assert blocks >= min(2 * EB.SMS, vocab)


@pytest.mark.parametrize("unused_first", [True, False])
def test_a_tensor_input_the_kernel_does_not_read(unused_first):
    """A fusion taking a tensor besides the gradient and the indices: the kernel's output is
    the tensor after every tensor input (it was tensor 2, the unused input when that came
    first or last: a launch reading its shape, a kernel writing it)."""
    grad, ids, extra = _grad((6, 4), torch.float32), _ids((6,), 5), torch.full((3, 4), 7.0)
    f = Fusion()
    with f:
        if unused_first:
            B.define_tensor([-1, -1], DataType.Float)
        g = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        if not unused_first:
            B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.embedding_backward(g, i, 5, -1))
    inputs = [extra, grad, ids] if unused_first else [grad, ids, extra]
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    assert dispatch.last_report(f).kernels == 1
    assert torch.equal(out, sequential_reference(grad, ids, 5, -1))
    assert torch.equal(extra, torch.full((3, 4), 7.0))


def _tied_fusion(dtype, num_weights, padding_idx, extra_ops=False):
    """embedding_backward(g, i) + other (a tied weight's other gradient); with `extra_ops`,
    then * 0.5, cast to float32 and - other2 (two [V, H] inputs read by the epilogue)."""
    dt = DataType.from_torch(dtype)
    f = Fusion()
    with f:
        g = B.define_tensor([-1, -1, -1], dt)
        i = B.define_tensor([-1, -1], DataType.Int)
        other = B.define_tensor([-1, -1], dt)
        y = B.elementwise("add", other, B.embedding_backward(g, i, num_weights, padding_idx))
        if extra_ops:
            other2 = B.define_tensor([-1, -1], DataType.Float)
            y = B.elementwise("sub", B.cast(B.elementwise("mul", y, 0.5), DataType.Float), other2)
        f.add_output(y)
    return f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("extra_ops", [False, True], ids=["add", "add_mul_cast_sub"])
def test_an_epilogue_computes_a_tied_weights_gradient_in_the_kernel(dtype, extra_ops):
    """A tied embedding's gradient, mm's plus the embedding's: one embedding_backward kernel
    whose write adds the other gradient (then more pointwise ops), bit-equal to eager's ops one
    after the other on the sequential sum rounded to the dtype (a strided other gradient: read
    through its strides)."""
    grad, ids = _grad((3, 7, 37), dtype), _ids((3, 7), 11)
    other = _grad((37, 11), dtype, seed=5).t()                   # [11, 37], column-major
    f = _tied_fusion(dtype, 11, 4, extra_ops)
    inputs = [grad, ids, other] + ([_grad((11, 37), torch.float32, seed=6)] if extra_ops else [])
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.eager_segments == 0, report
    assert [s.scheduler for s in report.segments if s.kind == "kernel"] == ["embedding_backward"]
    want = other + sequential_reference(grad, ids, 11, 4)
    if extra_ops:
        want = (want * 0.5).float() - inputs[3]
    assert out.dtype == want.dtype and torch.equal(out, want), (out - want).abs().max()


def test_the_epilogue_kernel_compiles_for_sm90():
    ids, grad = _ids((8, 512), 30522), _grad((8, 512, 768), torch.bfloat16)
    other = _grad((30522, 768), torch.bfloat16, seed=2)
    f = _tied_fusion(torch.bfloat16, 30522, 0)
    plan = api.plan_kernel(f, [grad, ids, other])
    assert plan.scheduler == "embedding_backward" and plan.params.epilogue == (2,)
    assert "ep0_s1" in plan.kernel.source
    assert "atomic" not in plan.kernel.source.split('extern "C"')[1]
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None


def _scalar_input():
    s = B.symbolic_scalar(DataType.Double)
    Fusion.current().add_input(s)
    return s


def _refusal(build) -> str:
    f = Fusion()
    with f:
        g = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        w = B.embedding_backward(g, i, 9, -1)
        for out in build(w):
            f.add_output(out)
    ok, why = EB.can_schedule(f)
    assert not ok
    return why


@pytest.mark.parametrize("build,reason", [
    (lambda w: [B.elementwise("add", w, B.define_tensor([1, -1], DataType.Float))],
     "reads only [num_weights, H] inputs"),
    (lambda w: [B.elementwise("mul", w, _scalar_input())],
     "is not a constant"),
    (lambda w: [B.reduction("sum", w, [0], False)], "only pointwise ops after it"),
    (lambda w: [w, B.elementwise("neg", w)], "must be the only output"),
], ids=["broadcast_input", "scalar_input", "reduction", "two_outputs"])
def test_what_is_no_epilogue(build, reason):
    """A broadcast input, a run-time scalar, a reduction after the embedding gradient, or the
    gradient itself an output beside the epilogue's value: the scheduler refuses the group (the
    segmenter keeps the embedding_backward kernel alone)."""
    assert reason in _refusal(build)


def test_an_epilogue_input_of_another_shape_is_refused_at_run_time():
    f = _tied_fusion(torch.float32, 11, -1)
    grad, ids = _grad((2, 3, 5), torch.float32), _ids((2, 3), 11)
    ok, why = EB.run_check(f, [grad, ids, torch.zeros(12, 5)], None)
    assert not ok and "not (11, 5)" in why
    assert EB.run_check(f, [grad, ids, torch.zeros(11, 5)], None)[0]


_EPILOGUE_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
_EPILOGUE_TORCH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
                   "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("seed", range(12))
def test_random_epilogues_are_eagers_ops(seed):
    """Random chains of 1-4 arithmetic ops after the embedding gradient, over 1-2 [V, H] inputs
    (row- or column-major), constants, neg / abs and casts, in a random float dtype: the kernel's
    result is eager's ops applied one after the other to the rounded sum, bit for bit."""
    import random
    r = random.Random(seed)
    dtype = r.choice([torch.float32, torch.bfloat16, torch.float16, torch.float64])
    dt = DataType.from_torch(dtype)
    vocab, hidden = r.choice([(5, 3), (13, 40), (40, 9)])
    grad, ids = _grad((2, 9, hidden), dtype, seed), _ids((2, 9), vocab, seed=seed + 1)
    extras = [_grad((vocab, hidden), dtype, seed + 2 + k) for k in range(r.randint(1, 2))]
    extras = [x if r.random() < 0.5 else x.t().contiguous().t() for x in extras]
    steps = []
    for _ in range(r.randint(1, 4)):
        kind = r.random()
        if kind < 0.6:
            steps.append(("bin", r.choice(_EPILOGUE_BINARY), r.choice(["in", "const", "self"]),
                          r.randrange(len(extras)), r.choice([0.5, -2.0, 3.0])))
        elif kind < 0.85:
            steps.append(("un", r.choice(["neg", "abs"])))
        else:
            steps.append(("cast", r.choice([torch.float32, dtype])))
    f = Fusion()
    with f:
        g = B.define_tensor([-1, -1, -1], dt)
        i = B.define_tensor([-1, -1], DataType.Int)
        ins = [B.define_tensor([-1, -1], dt) for _ in extras]
        y = B.embedding_backward(g, i, vocab, -1)
        for st in steps:
            if st[0] == "bin":
                other = {"in": ins[st[3]], "const": st[4], "self": y}[st[2]]
                y = B.elementwise(st[1], y, other)
            elif st[0] == "un":
                y = B.elementwise(st[1], y)
            else:
                y = B.cast(y, DataType.from_torch(st[1]))
        f.add_output(y)
    (out,) = dispatch.execute_fusion(f, [grad, ids, *extras], "interpret")
    report = dispatch.last_report(f)
    assert [s.scheduler for s in report.segments if s.kind == "kernel"] == ["embedding_backward"]
    want = sequential_reference(grad, ids, vocab, -1)
    for st in steps:
        if st[0] == "bin":
            # (a constant as eager's 0-dim tensor: maximum / minimum take no Python number)
            other = {"in": extras[st[3]], "const": torch.tensor(st[4]), "self": want}[st[2]]
            want = _EPILOGUE_TORCH[st[1]](want, other)
        elif st[0] == "un":
            want = getattr(torch, st[1])(want)
        else:
            want = want.to(st[1])
    assert out.dtype == want.dtype and out.shape == want.shape
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


def test_a_symbolic_row_count_and_the_evaluators_index_check():
    """num_weights a symbolic Int Scalar (a table's rows known at run time: the output's
    extent); the reference evaluator checks every index against them, as the kernel does;
    a num_weights that is neither an int nor an Int Scalar is refused, naming it."""
    from pyfuser.errors import FusionDefinitionError
    from pyfuser.ir.base import Scalar
    from pyfuser.ir.evaluator import evaluate
    f = Fusion()
    with f:
        table = B.define_tensor([-1, -1], DataType.Float)
        g = B.define_tensor([-1, -1], DataType.Float)
        i = B.define_tensor([-1], DataType.Int)
        rows = table.logical[0].extent
        out = B.embedding_backward(g, i, rows)
        f.add_output(B.elementwise("add", table, out))
        with pytest.raises(FusionDefinitionError, match="num_weights must be an int"):
            B.embedding_backward(g, i, Scalar(DataType.Float, None, f))
    assert out.logical[0].extent is rows
    grad, ids = _grad((3, 2), torch.float32), torch.tensor([0, 4, 4])
    (got,) = evaluate(f, [torch.zeros(5, 2), grad, ids])
    torch.testing.assert_close(got, sequential_reference(grad, ids, 5, -1))
    with pytest.raises(IndexError, match=r"index out of range \(an index outside \[0, 4\)"):
        evaluate(f, [torch.zeros(4, 2), grad, ids])
