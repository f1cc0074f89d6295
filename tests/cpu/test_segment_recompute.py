"""The segmenter recomputes a cut tensor in the segments that read it when that moves fewer
bytes (segment/recompute.py): a layer norm's backward cut into dweight / dbias and dx (the
inner-outer scheduler off, as for rows too long for it) passes no float32 intermediate between
its two kernels; a chain whose inputs weigh as much as what it saves stays cut; a returned
tensor is still written. Results are compared with eager on the CPU interpreter."""
from __future__ import annotations

import pytest
import torch

import pyfuser.frontend.lowering.aten_backward as AB
from pyfuser.ir import DataType
from pyfuser.ir import builder as B
from pyfuser.runtime import dispatch
from pyfuser.segment.segmenter import segment

from test_inner_outer import _fusion

ew = B.elementwise
DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


@pytest.fixture(autouse=True)
def _two_kernels(monkeypatch):
    monkeypatch.setenv("PYFUSER_INNER_OUTER", "0")   # the cut a too-long row gets


def _kernel_inputs(sf):
    """Per kernel segment, the names of the tensors it reads that another kernel wrote (a host
    segment's views of the fusion's inputs are no such tensors)."""
    written = {id(o) for s in sf.segments if s.kind == "kernel" for o in s.outputs}
    return [[v.name for v in s.inputs if id(v) in written]
            for s in sf.segments if s.kind == "kernel"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(6, 64), (5, 7, 24), (1, 33)])
def test_layer_norm_backward_cut_passes_no_intermediate(dtype, shape):
    H = shape[-1]
    lead = list(shape[:-1])

    def build():
        dy = B.define_tensor([-1] * len(shape), DT[dtype])
        x = B.define_tensor([-1] * len(shape), DT[dtype])
        mean = B.define_tensor([-1] * len(lead) + [1], DataType.Float)
        rstd = B.define_tensor([-1] * len(lead) + [1], DataType.Float)
        w = B.define_tensor([-1], DT[dtype])
        return AB._layer_norm_backward(dy, x, [H], mean, rstd, w, w, [True, True, True])
    f = _fusion(build)
    torch.manual_seed(0)
    x = torch.randn(*shape)
    w = torch.randn(H)
    _, mean, rstd = torch.native_layer_norm(x, [H], w, w, 1e-5)
    dy = torch.randn(*shape)
    inputs = [dy.to(dtype), x.to(dtype), mean, rstd, w.to(dtype)]
    sf = segment(f)
    assert sf.num_kernels == 2
    assert _kernel_inputs(sf) == [[], []]          # each kernel reads the fusion's inputs only
    recomputed = [e.op_name for s in sf.segments for e in s.recomputed]
    assert "sub" in recomputed and "mul" in recomputed       # x_hat, in the second kernel
    assert "(recomputed)" in str(sf)
    got = dispatch.execute_fusion(f, inputs, "interpret")
    want = torch.ops.aten.native_layer_norm_backward(
        inputs[0].double(), inputs[1].double(), [H], mean.double(), rstd.double(),
        inputs[4].double(), inputs[4].double(), [True, True, True])
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for g, w_ in zip(got, want):
        assert g.dtype == dtype and g.shape == w_.shape
        scale = max(1.0, w_.abs().max().item())
        torch.testing.assert_close(g.double(), w_, rtol=tol, atol=tol * scale)


def _two_reductions(make_t, returned=False, dtype=DataType.BFloat16):
    """t (from make_t(a, b)) read by a sum over the rows and a sum over the columns: the two
    reductions cannot share a kernel (the inner-outer scheduler is off), so t is cut."""
    def build():
        a = B.define_tensor([-1, -1], dtype)
        b = B.define_tensor([-1, -1], dtype)
        t = make_t(a, b)
        outs = [B.reduction("sum", t, [0]), B.reduction("sum", ew("mul", t, t), [1])]
        return outs + ([t] if returned else [])
    return _fusion(build)


def _check_eager(f, make_t_eager, returned=False, dtype=torch.bfloat16):
    torch.manual_seed(1)
    a, b = torch.randn(9, 40).to(dtype), torch.randn(9, 40).to(dtype)
    got = dispatch.execute_fusion(f, [a, b], "interpret")
    t = make_t_eager(a, b)
    want = [t.sum(0), (t * t).sum(1)] + ([t] if returned else [])
    assert len(got) == len(want)
    for g, w_ in zip(got, want):
        assert g.dtype == w_.dtype and g.shape == w_.shape
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-4)


def test_a_chain_whose_inputs_weigh_as_much_stays_cut():
    # t = a + b, all float32: recomputing t reads a and b, as many bytes as the write and the
    # read of t it would save: no gain, t stays cut
    f = _two_reductions(lambda a, b: ew("add", a, b), dtype=DataType.Float)
    sf = segment(f)
    assert sf.num_kernels == 2
    assert not [e for s in sf.segments for e in s.recomputed]
    assert sorted(map(len, _kernel_inputs(sf))) == [0, 1]
    _check_eager(f, lambda a, b: a + b, dtype=torch.float32)


def test_a_chain_of_narrower_inputs_is_recomputed():
    # the same sum of bfloat16 inputs computed in float32: a and b weigh half of t's write and
    # read, so the reader recomputes t
    f = _two_reductions(lambda a, b: ew("add", B.cast(a, DataType.Float), B.cast(b, DataType.Float)))
    sf = segment(f)
    assert _kernel_inputs(sf) == [[], []]
    assert sorted(e.op_name for s in sf.segments for e in s.recomputed) == ["add", "cast", "cast"]
    _check_eager(f, lambda a, b: a.float() + b.float())


def test_a_cast_is_recomputed_and_a_returned_tensor_still_written():
    # t = float(a): the reader loads a (2 bytes an element) instead of t (4)
    for returned in (False, True):
        f = _two_reductions(lambda a, b: B.cast(a, DataType.Float), returned)
        sf = segment(f)
        assert sf.num_kernels == 2
        assert _kernel_inputs(sf) == [[], []]
        assert [e.op_name for s in sf.segments for e in s.recomputed] == ["cast"]
        t = next(e for s in sf.segments for e in s.recomputed).output
        writers = [s for s in sf.segments if any(o is t for o in s.outputs)]
        assert len(writers) == (1 if returned else 0)
        assert (t is f.outputs[-1]) == returned
        _check_eager(f, lambda a, b: a.float(), returned)


def test_a_chain_reading_another_kernels_output_is_not_recomputed():
    # t = float(a) - sum(float(a), 1): the cast is recomputed where the row sum's kernel
    # needs it, but t reads the row sum (another kernel's output): t itself stays cut (a copy
    # reads only the fusion's inputs)
    def make_t(a, b):
        af = B.cast(a, DataType.Float)
        return ew("sub", af, B.broadcast(B.reduction("sum", af, [1]), [False, True]))
    f = _two_reductions(make_t)
    sf = segment(f)
    assert sf.num_kernels == 3
    assert "sub" not in [e.op_name for s in sf.segments for e in s.recomputed]
    _check_eager(f, lambda a, b: a.float() - a.float().sum(1, keepdim=True))


def test_a_transcendental_chain_is_not_recomputed():
    # t = exp(float(a)): one exp more per element of the reader could make it compute-bound
    f = _two_reductions(lambda a, b: ew("exp", B.cast(a, DataType.Float)))
    sf = segment(f)
    assert sf.num_kernels == 2
    assert not [e for s in sf.segments for e in s.recomputed]
    assert sorted(map(len, _kernel_inputs(sf))) == [0, 1]
    _check_eager(f, lambda a, b: a.float().exp())


def test_the_cheap_ops_are_ops_of_the_table():
    from pyfuser.ir.ops import OPS
    from pyfuser.segment import recompute
    assert recompute.CHEAP <= set(OPS)
    assert not {"exp", "log", "sin", "cos", "tanh", "erf", "pow"} & recompute.CHEAP


def test_a_tensor_made_from_nothing_is_recomputed():
    # t = float(a) + iota (an arange along the rows' axis): the chain loads a only, and the
    # iota loads nothing, so each reader computes t itself
    def make_t(a, b):
        rows = B.broadcast(B.cast(B.iota(a.logical[1].extent), DataType.Float), [True, False])
        return ew("add", B.cast(a, DataType.Float), rows)
    f = _two_reductions(make_t)
    sf = segment(f)
    assert _kernel_inputs(sf) == [[], []]
    assert "iota" in [e.op_name for s in sf.segments for e in s.recomputed]
    _check_eager(f, lambda a, b: a.float() + torch.arange(a.shape[1]).float())


_RECOMPUTED: list = []        # per random program: whether the pass recomputed anything
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum}
_UNARY = {"neg": torch.neg, "abs": torch.abs, "sin": torch.sin}


@pytest.mark.parametrize("seed", range(24))
def test_random_chains_cut_between_two_reductions(seed):
    """Random chains of pointwise ops (cheap and not) over bfloat16 / float32 inputs, row and
    column parameters, feeding a sum over the rows and one over the columns (two kernels), t
    returned or not: whatever the recompute pass decides, the results are eager's and no
    kernel reads a tensor another kernel does not write."""
    import random
    rng = random.Random(seed)
    dts = [rng.choice([torch.bfloat16, torch.float32]) for _ in range(2)]
    steps = [(rng.choice(list(_BINARY) + list(_UNARY)), rng.randrange(4)) for _ in range(rng.randint(1, 4))]
    returned = rng.random() < 0.5

    def build():
        a, b = (B.define_tensor([-1, -1], DT[d]) for d in dts)
        col = B.define_tensor([-1], DataType.Float)
        row = B.define_tensor([-1, 1], DataType.Float)
        srcs = [B.cast(a, DataType.Float), B.cast(b, DataType.Float),
                B.broadcast(col, [True, False]), row]
        t = srcs[0]
        for op, k in steps:
            t = ew(op, t, srcs[k]) if op in _BINARY else ew(op, t)
        outs = [B.reduction("sum", t, [0]), B.reduction("sum", ew("mul", t, srcs[1]), [1])]
        return outs + ([t] if returned else [])

    def eager(a, b, col, row):
        srcs = [a.float(), b.float(), col.unsqueeze(0), row]
        t = srcs[0]
        for op, k in steps:
            t = _BINARY[op](t, srcs[k]) if op in _BINARY else _UNARY[op](t)
        outs = [t.sum(0), (t * srcs[1]).sum(1)]
        return outs + ([t] if returned else [])
    f = _fusion(build)
    sf = segment(f)
    written = {id(o) for s in sf.segments if s.kind == "kernel" for o in s.outputs}
    produced = {id(o) for s in sf.segments for o in s.outputs} | {id(v) for v in f.inputs}
    assert all(id(v) in produced for s in sf.segments for v in s.inputs)
    assert not [v for s in sf.segments for e in s.recomputed for v in e.inputs if id(v) in written]
    _RECOMPUTED.append(bool([e for s in sf.segments for e in s.recomputed]))
    a = torch.randn(7, 12).to(dts[0])
    b = torch.randn(7, 12).to(dts[1])
    col, row = torch.randn(12), torch.randn(7, 1)
    got = dispatch.execute_fusion(f, [a, b, col, row], "interpret")
    want = eager(a, b, col, row)
    assert len(got) == len(want)
    for g, w_ in zip(got, want):
        assert g.dtype == w_.dtype and g.shape == w_.shape
        torch.testing.assert_close(g, w_, rtol=1e-4, atol=1e-4 * max(1.0, w_.abs().max().item()))


def test_random_chains_exercise_the_pass():
    """The random programs above are not all left alone by the pass (run after them)."""
    if len(_RECOMPUTED) < 24:
        pytest.skip("run with the random programs")
    assert 0 < sum(_RECOMPUTED) < len(_RECOMPUTED)
