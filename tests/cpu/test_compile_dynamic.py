"""Dynamic shapes through the torch.compile backend: SymInt sizes become symbolic extents of the
fusions, so a new batch size or sequence length runs the compiled graphs and kernels again
(no Dynamo recompile, no new kernel), with dynamic=True and after an automatic-dynamic
recompile. Kernels are specialised on layout facts (schedule/layout.py: which sizes are 1, the
power of two dividing each size, capped at 16) and, for reductions, on a size class: a column
sum's grid split follows its number of rows (reduction_heuristics._outer) until the grid fills
the GPU, and a layer norm's team of threads widens while its rows are too few to fill it. The
sizes here keep the layout facts; where the test counts kernels, the split and the team are
fixed (PYFUSER_RED_SPLITS, PYFUSER_RED_BDIMX: speed-only knobs). The first size of a dynamic run has no two
equal dynamic sizes (Dynamo's duck sizing would guard on that equality). An `arange` of a SymInt
bound (BERT's attention mask) is an iota of symbolic extent in its region, a slice with a SymInt
bound (GPT-2's and Llama's packed-sequence mask) a slice of symbolic extent, and Dynamo's
unspecialised floats (0-dim float64 inputs) fuse with the ops they feed: BERT's, GPT-2's and
Llama's forwards fuse into the regions they have with static sizes."""
from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

import train_corpus as TC


pytestmark = pytest.mark.usefixtures("fresh_compile")


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):                         # x: [batch, seq, d]
        h = F.gelu(self.up(x))
        h = h.view(x.shape[0], x.shape[1], 2, -1).sum(2)     # a view with two symbolic sizes
        return self.norm(self.down(torch.cat([h, h], -1)) + x)


def _train_step(model, fn, x):
    out = fn(x)
    out.square().mean().backward()
    return out.detach()


@pytest.mark.parametrize("dynamic", [True, None])
def test_new_batch_and_sequence_sizes_reuse_graphs_and_kernels(dynamic, plans, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "1")
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "8")
    torch.manual_seed(0)
    model = Block()
    ref = copy.deepcopy(model)
    cm = pyfuser.compile(model, dynamic=dynamic)
    sizes = [(12, 20), (20, 12), (28, 44), (44, 4)]
    seen = []
    for b, s in sizes:
        x = torch.randn(b, s, 32)
        got = _train_step(model, cm, x)
        want = _train_step(ref, ref, x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        seen.append((len(compiled_graphs()), plans[0]))
    # dynamic=True: a forward and a backward graph from the start; automatic dynamic: the second
    # size recompiles them once with symbolic sizes; after that nothing is compiled again
    assert seen[3] == seen[2] == seen[1]
    if dynamic:
        assert seen[1] == seen[0]
    assert seen[-1][0] == (2 if dynamic else 4)
    graph = compiled_graphs()[-2]
    assert graph.kind == "forward" and len(graph.regions) >= 2
    # the regions read symbolic sizes through their inputs' extents or as scalar inputs
    assert any(ph.meta.get("val") is not None and isinstance(ph.meta["val"], torch.SymInt)
               for ph in graph.gm.graph.nodes if ph.op == "placeholder")


def test_bert_training_with_dynamic_shapes_matches_eager(plans):
    small = dataclasses.replace(TC.SMALL, layers=1)     # Dynamo traces symbolic sizes slowly
    base = TC.TRAIN_CASES["bert"]("cpu", dataclasses.replace(small, batch=2, seq=16))
    ref = copy.deepcopy(base.model)
    cm = pyfuser.compile(base.model, dynamic=True)
    counts = []
    for b, s in ((2, 16), (6, 32)):
        case = TC.TRAIN_CASES["bert"]("cpu", dataclasses.replace(small, batch=b, seq=s))
        loss = TC.step(TC.TrainCase("bert", base.model, case.inputs, case.loss), cm)
        want = TC.step(TC.TrainCase("bert", ref, case.inputs, case.loss), ref)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        g, rg = TC.grads(base.model), TC.grads(ref)
        for k in rg:
            torch.testing.assert_close(g[k], rg[k], rtol=1e-3, atol=1e-5, msg=k)
        base.model.zero_grad()
        ref.zero_grad()
        counts.append(len(compiled_graphs()))
    assert counts == [2, 2]                         # never recompiled


def _mask_and_positions(m, x):
    """HF BERT's attention-mask pattern (an arange of the sequence length compared, anded with
    the padding mask, expanded to [batch, 1, seq, seq]) and aranges with a start and a step."""
    b, s = m.shape
    keep = (torch.arange(s)[None, None, :, None] >= 0) & m.bool()[:, None, None, :]
    mask = torch.where(keep.expand(b, 1, s, s), 0.0, float("-inf")) + x
    return (mask, m[:, 1::2] * torch.arange(1, s, 2),
            m * torch.arange(s, 0, -1) + torch.arange(2, s + 2))


def test_arange_of_symbolic_bounds_fuses_as_an_iota(plans):
    """Under dynamic shapes `torch.arange(seq_len)` has a SymInt bound: an iota whose extent is
    that symbol (the extent of the input it is the size of) or the scalar expression of eager's
    length, so it stays in the region with the mask's symbolic expand, as with static sizes (it
    was left to eager: an extra kernel and a tensor input). New sizes reuse graph and kernels."""
    cf = pyfuser.compile(_mask_and_positions, dynamic=True)
    seen = []
    for b, s in ((3, 6), (5, 10), (7, 14)):
        m, x = torch.randint(0, 2, (b, s)), torch.randn(b, 1, s, s)
        m[0] = 1
        with torch.no_grad():
            got, want = cf(m, x), _mask_and_positions(m, x)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            assert torch.equal(g, w)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.arange.default") == 1 and ops.count("aten.arange.start") == 1
    assert ops.count("aten.arange.start_step") == 2 and "aten.expand.default" in ops
    (mask,) = [r for r in graph.regions if "aten.expand.default" in r.ops]
    assert "aten.arange.default" in mask.ops
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def _inference_graph(name: str, dynamic: bool, sizes, plans=None):
    """HF `name` (BERT, GPT-2, Llama: one layer, random weights) compiled for inference: its one
    graph, after checking each size's logits against eager (values, shape, dtype); with
    `plans`, also the kernels planned after each size."""
    torch._dynamo.reset()
    small = dataclasses.replace(TC.SMALL, layers=1)
    model = TC.TRAIN_CASES[name]("cpu", small).model.eval()
    cm = pyfuser.compile(model, dynamic=dynamic)
    before = len(compiled_graphs())
    planned = []
    for b, s in sizes:
        case = TC.TRAIN_CASES[name]("cpu", dataclasses.replace(small, batch=b, seq=s))
        inputs = {k: v for k, v in case.inputs.items() if k != "labels"}
        with torch.no_grad():
            got, want = cm(**inputs).logits, model(**inputs).logits
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        planned.append(None if plans is None else plans[0])
    (graph,) = compiled_graphs()[before:]          # one graph: dynamic=True never recompiles
    return (graph, planned) if plans is not None else graph


def test_bert_forward_fuses_under_dynamic_shapes_as_with_static_ones():
    """With dynamic=True, BERT's attention mask `arange(seq_len)` has a symbolic bound; it was
    left to eager ("arange of other than integer bounds") and the mask's region read its
    result, where static sizes fuse it. Now the regions and their ops are the static graph's,
    and nothing more is left unfused (host size arithmetic such as `s0 * s1` is not listed)."""
    static = _inference_graph("bert", False, [(2, 12)])
    dynamic = _inference_graph("bert", True, [(2, 12), (6, 20)])
    assert len(dynamic.regions) == len(static.regions)
    assert sorted(sorted(r.ops) for r in dynamic.regions) == \
        sorted(sorted(r.ops) for r in static.regions)
    assert Counter(dynamic.unsupported.values()) == Counter(static.unsupported.values())
    assert not [n for n in dynamic.unsupported if n.startswith(("arange", "expand"))]


_INT64_MAX = 2 ** 63 - 1
# the ops AOTAutograd writes for an unspecialised float (a 0-dim float64 input): in float64,
# then converted to the dtype of the op using it
_FLOAT_INPUT_OPS = {"prims.convert_element_type.default", "aten.true_divide.Tensor",
                    "aten.sqrt.default", "aten.scalar_tensor.default"}


def _full_slice(n) -> bool:
    """Dynamo's `x[:, 0:INT64_MAX]` of a whole axis (the dynamic graphs keep them): no op."""
    return str(n.target) == "aten.slice.Tensor" and tuple(n.args[2:4]) == (0, _INT64_MAX)


def _zero_dim(n) -> bool:
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) and v.dim() == 0


def _ops(graph, keep):
    return sorted(sorted(str(n.target) for n in r.region.nodes if keep(n)) for r in graph.regions)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_lm_forward_fuses_under_dynamic_shapes_as_with_static_ones(name, plans,
                                                                         monkeypatch):
    """GPT-2's and Llama's forward under dynamic=True had more regions than with static sizes
    (GPT-2 8 against 5, Llama 7 against 6): their packed-sequence mask slices a `cat` to the
    sequence length, a SymInt bound (refused: "aten::slice end must be a constant int"), and
    Dynamo's unspecialised floats (GPT-2's `sqrt(2 / pi)`, Llama's RMS norm epsilon and rotary
    scaling) came as `prims.convert_element_type` and `true_divide.Tensor` of 0-dim float64
    inputs, which had no lowering. Now the regions are the static graph's, and so are their ops
    but for two kinds of node the dynamic graph alone has: Dynamo's whole-axis slices
    `x[:, 0:INT64_MAX]` (no ops) and the 0-dim float64 ops of those floats, each in the region
    of the op it feeds. Unfused: the static graph's reasons (the `alias` of the logits' hidden
    states, `hidden_states[:, -0:]`, which the dynamic graph writes as whole-axis slices, was one
    more until `alias` was lowered: a view between regions now, reported by neither). Equal to
    eager at two sizes, one graph, no kernel planned for the second.
    The static graph is compiled with its packed-sequence cumsum left to eager, as a symbolic
    sequence length leaves it (fx/rewrite_scan.py fuses it for static sizes only)."""
    from pyfuser.frontend.fx import rewrite_scan
    monkeypatch.setenv("PYFUSER_RED_SPLITS", "1")
    monkeypatch.setenv("PYFUSER_RED_BDIMX", "8")
    with monkeypatch.context() as m:
        m.setattr(rewrite_scan, "SCAN_MAX", 0)
        static = _inference_graph(name, False, [(2, 12)])
    dynamic, planned = _inference_graph(name, True, [(2, 12), (6, 20)], plans)
    assert planned[1] == planned[0]
    assert len(dynamic.regions) == len(static.regions)
    plain = lambda n: not _full_slice(n) and not _zero_dim(n)       # noqa: E731
    assert _ops(dynamic, plain) == _ops(static, plain)
    assert not [n for r in static.regions for n in r.region.nodes if _full_slice(n)]
    extra = Counter(op for ops in _ops(dynamic, _zero_dim) for op in ops) - \
        Counter(op for ops in _ops(static, _zero_dim) for op in ops)
    assert extra and set(extra) <= _FLOAT_INPUT_OPS, extra
    floats = [n.meta["val"] for n in dynamic.gm.graph.nodes if n.op == "placeholder"
              and _zero_dim(n)]
    assert floats and all(v.dtype == torch.float64 and v.device.type == "cpu" for v in floats)
    want, got = Counter(static.unsupported.values()), Counter(dynamic.unsupported.values())
    assert want == got
    assert all(r.eager_calls == 0 for r in dynamic.regions)
