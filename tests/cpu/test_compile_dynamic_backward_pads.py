"""Slice and select gradients to SymInt sizes under dynamic=True: `aten.slice_backward` and
`aten.select_backward` whose input sizes hold SymInts (HF BERT's pooler, `hidden_states[:, 0]`,
in a training step: a select_backward to [s0, s1, hidden]) had stayed eager aten calls ("input
size must be a constant int") where static sizes fuse them. They are now pads of symbolic
extent (lowering/aten_resize.py): the slice's clamped bounds as scalar expressions
(slice_bounds.py), the pad's high side the size less the end, a symbolic low side (a negative or
SymInt start, a negative select index) a shift the kernel reads as a parameter; the output's
extents are the op's sizes, so binding the sizes checks that the gradient and the index fit
(a call they do not runs eagerly, raising as eager does). A stepped slice's gradient is a pad
with that step (its operand spread step apart): GPT-J's interleaved rotary trains fused.
Checked against eager on several sizes: one graph, no new kernel, eager's values, shapes,
dtypes and strides."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import pyfuser
from pyfuser.errors import ExecuteError
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.lowering.aten_resize import _select_backward, _slice_backward
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch

import train_corpus as TC
from test_compile_dynamic_slices import assert_left_to_eager
from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
BIG = 2 ** 63 - 1                      # eager's open end
_BACKWARD_OPS = ("aten.slice_backward.default", "aten.select_backward.default")


class Picks(torch.nn.Module):
    """A [b, s, h] activation read through selects and slices of the sequence axis: SymInt,
    negative, open and past-the-end bounds, and selects at both ends."""

    def __init__(self, h=8):
        super().__init__()
        self.lin = torch.nn.Linear(h, h)

    def forward(self, x):
        n = x.shape[1]
        h = torch.tanh(self.lin(x))
        return (h[:, 0].sin().sum() + h[:, -1].cos().sum()      # select_backward (lo symbolic)
                + (h[:, 1:n] * 2).exp().sum()                    # a SymInt end
                + h[:, -3:].square().sum()                       # a negative start
                + (h[:, n // 2:] * 3).sin().sum()                # a SymInt start
                + h[:, 1:n + 5].cos().sum()                      # an end past the size
                + (h[:, 2:5] - 1).square().sum())                # a constant end (guarded)


def _step(model, fn, x):
    x = x.clone().requires_grad_()
    loss = fn(x)
    loss.backward()
    return loss.detach(), x.grad, {k: p.grad for k, p in model.named_parameters()}


def _backward_graph():
    (bw,) = [g for g in compiled_graphs() if g.kind == "backward"]
    return bw


def test_training_step_fuses_symbolic_slice_and_select_gradients(plans, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "1")
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "8")
    torch.manual_seed(0)
    model = Picks()
    ref = copy.deepcopy(model)
    cm = pyfuser.compile(model, dynamic=True)
    seen = []
    for b, s in ((3, 6), (5, 10), (7, 14)):       # the layout facts kept: one kernel set
        x = torch.randn(b, s, 8)
        got, want = _step(model, cm, x), _step(ref, ref, x)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        for g, w in zip([got[1], *got[2].values()], [want[1], *want[2].values()]):
            assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        model.zero_grad()
        ref.zero_grad()
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 2 and seen[2] == seen[1] == seen[0]      # no recompile, no new kernel
    bw = _backward_graph()
    assert not [r for r in bw.unsupported.values() if "backward" in r], bw.unsupported
    ops = [op for r in bw.regions for op in r.ops]
    assert ops.count("aten.select_backward.default") == 2
    assert ops.count("aten.slice_backward.default") >= 5
    assert all(r.eager_calls == 0 for r in bw.regions)
    assert_ran_as_sm90_kernels([r for r in bw.regions if any(o in r.ops for o in _BACKWARD_OPS)])


def _gradients(y):
    """slice_backward / select_backward of slices of a computed value, called directly with
    SymInt sizes: every kind of bound eager's slice takes."""
    n = y.shape[1]
    h = y * 2 + 1
    out = []
    for a, b in ((0, BIG), (1, n), (-3, BIG), (n // 2, BIG), (1, n + 5), (-n - 5, -2),
                 (2 - n, n - 1), (2, 5), (n, BIG), (None, 3)):
        out.append(torch.ops.aten.slice_backward(h[:, a:b].sin(), y.shape, 1,
                                                 0 if a is None else a, b, 1))
    for i in (0, 2, -1, -2):
        out.append(torch.ops.aten.select_backward(h[:, i].cos(), y.shape, 1, i))
    return out


def test_symbolic_gradient_pads_follow_eager_on_every_size(plans):
    cf = pyfuser.compile(_gradients, dynamic=True)
    seen = []
    for n in (6, 10, 14, 10):                 # a size again: its recorded program replays
        y = torch.randn(3, n, 4, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            got, want = cf(y), _gradients(y)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), (n, k)
            assert torch.equal(g, w), (n, k)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[3] == seen[2] == seen[1] == seen[0]
    (graph,) = compiled_graphs()
    assert not [r for r in graph.unsupported.values() if "backward" in r], graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.slice_backward.default") == 10
    assert ops.count("aten.select_backward.default") == 4
    assert all(r.eager_calls == 0 for r in graph.regions)
    assert_ran_as_sm90_kernels(graph.regions)


def _stepped_gradients(y):
    """slice_backward with steps 2 and 3 of stepped slices of a computed value, called directly
    with SymInt sizes: every kind of bound eager's slice takes."""
    n = y.shape[1]
    h = y * 2 + 1
    out = []
    for a, b, st in ((0, BIG, 2), (1, BIG, 2), (1, n - 1, 2), (-5, BIG, 2), (n // 2, BIG, 2),
                     (1, n + 5, 3), (n, BIG, 2), (2, 5, 2), (-n - 5, -2, 3), (None, 3, 2)):
        out.append(torch.ops.aten.slice_backward(h[:, a:b:st].sin(), y.shape, 1,
                                                 0 if a is None else a, b, st))
    return out


def test_stepped_slice_gradients_follow_eager_on_every_size(plans):
    """`aten.slice_backward` with a step other than 1 (zeros but at every step-th element from
    the start) had stayed an aten call; it is a pad spreading the gradient step apart
    (PadOp.steps), its low side the clamped start, its high side the size less the start less
    the span of the gradient's elements (slice_bounds.stepped_span). One graph and no new
    kernel over four sizes (and odd ones: new layout facts, new kernels), eager's values bit
    for bit, shapes, strides, no eager call."""
    cf = pyfuser.compile(_stepped_gradients, dynamic=True)
    seen = []
    for n in (6, 10, 14, 10, 7, 13):
        y = torch.randn(3, n, 4, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            got, want = cf(y), _stepped_gradients(y)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), (n, k)
            assert torch.equal(g, w), (n, k)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[5][0] == 1 and seen[3] == seen[2] == seen[1] == seen[0]
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.slice_backward.default") == 10
    assert all(r.eager_calls == 0 for r in graph.regions)
    assert_ran_as_sm90_kernels(graph.regions)


def rotate_every_two(x):
    """GPT-J's interleaved rotary (NeoX's `rotate_every_two`): pairs (x0, x1) -> (-x1, x0)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class InterleavedRotary(torch.nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.lin = torch.nn.Linear(h, h)

    def forward(self, x, sin, cos):
        q = torch.tanh(self.lin(x))
        return ((q * cos + rotate_every_two(q) * sin) * 2).square().sum()


def test_interleaved_rotary_training_step_fuses_its_stepped_slices(plans, monkeypatch):
    """A training step of GPT-J's interleaved rotary under dynamic=True on three sizes: the
    forward's stepped slices and the backward's stepped slice_backwards are in fused regions
    (no aten call left for them), one graph each and no new kernel, loss and gradients as
    close to float64 eager's as float32 eager's are."""
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "1")
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "8")
    torch.manual_seed(0)
    model = InterleavedRotary()
    ref, oracle = copy.deepcopy(model), copy.deepcopy(model).double()
    cm = pyfuser.compile(model, dynamic=True)
    seen = []
    for b, s in ((3, 6), (5, 10), (7, 14)):
        x, sin, cos = torch.randn(b, s, 16), torch.randn(s, 16), torch.randn(s, 16)
        got = _step(model, lambda t: cm(t, sin, cos), x)
        want = _step(ref, lambda t: ref(t, sin, cos), x)
        exact = _step(oracle, lambda t: oracle(t, sin.double(), cos.double()), x.double())
        flat = [[r[0], r[1], *r[2].values()] for r in (got, want, exact)]
        for g, w, o in zip(*flat):
            assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
            err, eager_err = (g.double() - o).abs().max(), (w.double() - o).abs().max()
            assert err <= 4 * eager_err + 1e-6 * o.abs().max(), (b, s, err, eager_err)
        for m in (model, ref, oracle):
            m.zero_grad()
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 2 and seen[2] == seen[1] == seen[0]
    fw = next(g for g in compiled_graphs() if g.kind == "forward")
    bw = _backward_graph()
    for g, op in ((fw, "aten.slice.Tensor"), (bw, "aten.slice_backward.default")):
        assert not [r for r in g.unsupported.values() if "slice" in r], g.unsupported
        assert sum(r.ops.count(op) for r in g.regions) == 2, (op, [r.ops for r in g.regions])
        assert all(r.eager_calls == 0 for r in g.regions)
    assert_ran_as_sm90_kernels([r for r in bw.regions if "aten.slice_backward.default" in r.ops])


def _symbolic_step(y):
    n = y.shape[1]
    return torch.ops.aten.slice_backward((y * 2)[:, ::y.shape[0]], y.shape, 1, 0, n,
                                         y.shape[0]) + 1


def test_a_symbolic_gradient_step_stays_an_aten_call():
    assert_left_to_eager(_symbolic_step, "aten::slice_backward with a symbolic step")


def _pad_at(start):
    """slice_backward along the innermost axis from a literal `start` (a closure's int would be
    a SymInt under dynamic=True)."""
    sb = torch.ops.aten.slice_backward
    return {8: lambda g, y: sb(g * 2, y.shape, 1, 8, BIG, 1) + y,
            3: lambda g, y: sb(g * 2, y.shape, 1, 3, BIG, 1) + y,
            -8: lambda g, y: sb(g * 2, y.shape, 1, -8, BIG, 1) + y}[start]


@pytest.mark.parametrize("start,vec", [(8, 8), (3, 1), (-8, 1)])
def test_gradient_pads_along_the_vectors_keep_them_only_where_aligned(start, vec, monkeypatch):
    """A slice's gradient along the innermost axis of symbolic size: a constant start of 8
    keeps bfloat16 vectors of 8 (the pad's condition holds for every lane of a vector), one of
    3 none; a negative start is a symbolic shift (size - 8), unprovable: no vectors. Eager's
    values bit for bit on two sizes, one compiled graph."""
    from pyfuser.codegen import api
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")      # plan here, not from disk
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda f, i: plans.append(real(f, i)) or plans[-1])
    fn = _pad_at(start)
    cf = pyfuser.compile(fn, dynamic=True)
    for n in (64, 96):
        g = torch.randn(4, -start if start < 0 else n - start, dtype=torch.bfloat16)
        y = torch.randn(4, n, dtype=torch.bfloat16)
        with torch.no_grad():
            got, want = cf(g, y), fn(g, y)
        assert got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got, want), n
    (graph,) = compiled_graphs()
    assert not graph.unsupported and all(r.eager_calls == 0 for r in graph.regions)
    assert [p.params.vec for p in plans if p.scheduler == "pointwise"] == [vec]


def _run(build, inputs):
    f = Fusion()
    with f:
        f.add_output(build())
    return dispatch.execute_fusion(f, inputs, "interpret")[0]


def test_sizes_that_do_not_fit_raise_at_binding():
    """The checks behind the fused ops, on a Fusion alone: the sizes (extents of an input x)
    are bound per call; a select index past the axis (either end), a constant slice end past
    it, or a gradient whose size does not match the slice, raise ExecuteError (a region then
    runs eagerly, which raises as eager does or gives eager's clamped result)."""
    def select(i):
        def build():
            x = B.define_tensor([-1, -1, 4], DataType.Float)
            g = B.define_tensor([-1, 4], DataType.Float)
            return _select_backward(g, [x.logical[0].extent, x.logical[1].extent, 4], 1, i)
        return build

    def sliced(start, end):
        def build():
            x = B.define_tensor([-1, -1], DataType.Float)
            g = B.define_tensor([-1, -1], DataType.Float)
            return _slice_backward(g, [x.logical[0].extent, x.logical[1].extent], 1, start,
                                   end, 1)
        return build

    g = torch.randn(3, 4)
    for n, i in ((5, 0), (5, 4), (5, -1), (5, -5), (1, 0), (1, -1)):
        want = torch.ops.aten.select_backward(g, [3, n, 4], 1, i)
        got = _run(select(i), [torch.empty(3, n, 4), g])
        assert got.shape == want.shape and torch.equal(got, want), (n, i)
        with pytest.raises(IndexError):
            torch.ops.aten.select_backward(g, [3, n, 4], 1, i + 5 if i >= 0 else i - 5)
        with pytest.raises(ExecuteError, match="negative"):
            _run(select(i + 5 if i >= 0 else i - 5), [torch.empty(3, n, 4), g])
    for start, end, n in ((1, 4, 6), (1, 4, 4), (-2, BIG, 7), (0, BIG, 3)):
        s, e = slice(start, end).indices(n)[:2]
        grad = torch.randn(2, max(e - s, 0))
        want = torch.ops.aten.slice_backward(grad, [2, n], 1, start, end, 1)
        got = _run(sliced(start, end), [torch.empty(2, n), grad])
        assert got.shape == want.shape and torch.equal(got, want), (start, end, n)
    with pytest.raises(ExecuteError, match="negative"):            # eager clamps the end to 3
        _run(sliced(1, 4), [torch.empty(2, 3), torch.randn(2, 2)])
    with pytest.raises(ExecuteError, match="size"):                # eager raises: 2 into 3
        _run(sliced(1, 4), [torch.empty(2, 6), torch.randn(2, 2)])


def test_hf_bert_pooler_gradient_fuses_under_dynamic_shapes():
    """HF BERT with its pooler (sequence classification: `hidden_states[:, 0]`), one layer of
    train_corpus' SMALL configuration, a training step under dynamic=True on two sizes: the
    pooler's select_backward to [s0, s1, hidden] is in a fused region (it was the one aten
    select_backward of the backward graph), the graph is not recompiled, and the loss and
    gradients match eager's within the dynamic BERT test's tolerances."""
    import transformers as T
    small = dataclasses.replace(TC.SMALL, layers=1)
    cfg = T.BertConfig(vocab_size=small.vocab, hidden_size=small.hidden,
                       num_hidden_layers=small.layers, num_attention_heads=small.heads,
                       intermediate_size=4 * small.hidden, max_position_embeddings=64,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
                       problem_type="single_label_classification")
    model = TC.hf_model("BertForSequenceClassification", cfg).train()
    ref = copy.deepcopy(model)
    cm = pyfuser.compile(model, dynamic=True)
    counts = []
    for b, s in ((2, 16), (6, 32)):
        case = TC.TRAIN_CASES["bert"]("cpu", dataclasses.replace(small, batch=b, seq=s))
        inputs = dict(case.inputs, labels=case.inputs["labels"][:, 0] % 3)
        loss = cm(**inputs).loss
        loss.backward()
        want = ref(**inputs).loss
        want.backward()
        torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-5, atol=1e-6)
        g, rg = TC.grads(model), TC.grads(ref)
        assert g.keys() == rg.keys()
        for k in rg:
            torch.testing.assert_close(g[k], rg[k], rtol=1e-3, atol=1e-5, msg=k)
        model.zero_grad()
        ref.zero_grad()
        counts.append(len(compiled_graphs()))
    assert counts == [2, 2]                                        # never recompiled
    bw = _backward_graph()
    assert not [n for n in bw.unsupported if n.startswith("select_backward")], bw.unsupported
    left = [n for n in bw.gm.graph.nodes if n.op == "call_function" and
            str(n.target) == "aten.select_backward.default"]
    assert not left, left
    (pooler,) = [r for r in bw.regions if "aten.select_backward.default" in r.ops]
    assert pooler.eager_calls == 0 and pooler.calls == 2
