"""The torch.compile backend's graph shaping for autocast graphs: the casts of graph inputs
joined into one region (partition._join_input_regions) and casts moved above views
(rewrites.sink_views). Results are compared with eager; region and kernel counts are asserted."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.fx.rewrites import sink_views
from fx_regions import graph_targets, views_between_compute

bf16 = torch.bfloat16


pytestmark = pytest.mark.usefixtures("fresh_compile")


def _regions():
    return [r for g in compiled_graphs() for r in g.regions]


def test_casts_of_graph_inputs_are_one_region_that_runs_first():
    def f(x, w1, b1, w2, b2):
        h = torch.addmm(b1.to(bf16), x, w1.to(bf16).t())
        return torch.addmm(b2.to(bf16), h, w2.to(bf16).t())
    torch.manual_seed(0)
    args = (torch.randn(4, 8, dtype=bf16), torch.randn(6, 8), torch.randn(6), torch.randn(3, 6),
            torch.randn(3))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    want = f(*args)
    assert got.dtype == want.dtype and torch.equal(got, want)
    regions = _regions()
    assert len(regions) == 1
    assert sorted(regions[0].ops) == ["aten._to_copy.default"] * 4 + ["aten.t.default"] * 2
    graph = compiled_graphs()[0].gm.graph
    calls = [n for n in graph.nodes if n.op in ("call_function", "call_method")]
    assert calls[0].target is regions[0]            # before the first matmul
    assert "t" not in [n.target for n in calls]     # the weights' t() are the region's outputs


def test_a_region_reading_inputs_with_a_reduction_or_other_regions_is_not_joined():
    def f(x, w, b):
        s = w.sum(1)                                # reads an input, but reduces
        y = torch.mm(x, w.to(torch.float64).t())    # the cast joins nothing else
        return s, y, (y * 2) + b                    # reads the mm: not inputs only
    args = (torch.randn(4, 8, dtype=torch.float64), torch.randn(6, 8), torch.randn(6))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    for g, w in zip(got, f(*args)):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
    ops = sorted(tuple(r.ops) for r in _regions())
    assert ("aten._to_copy.default", "aten.t.default") in ops
    assert any("aten.sum.dim_IntList" in o for o in ops)
    assert len(ops) == 3


def test_layer_norm_then_view_then_cast_is_one_kernel():
    """GPT-2 under autocast: layer_norm(x + r).view(-1, H).to(bf16) feeds a matmul."""
    def f(x, r, w, b):
        h = x + r
        y = F.layer_norm(h, (32,), w, b)
        return h, y.view(-1, 32).to(bf16)
    torch.manual_seed(0)
    args = (torch.randn(2, 8, 32), torch.randn(2, 8, 32), torch.randn(32), torch.randn(32))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    want = f(*args)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=1e-2)
    (region,) = _regions()
    assert "aten.view.default" in region.ops and not views_between_compute(region)
    assert region.kernels() == 1
    assert not [n for n in compiled_graphs()[0].gm.graph.nodes if n.target == "view"]


def _aten_graph(f, *args):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    FakeTensorProp(gm, FakeTensorMode()).propagate(*args)
    return gm


def test_sink_views_keeps_values_and_strides_and_skips_what_it_cannot_prove():
    def moved(x):
        return (x * 2).view(4, 6).to(bf16)

    def kept(x):                          # a view of a non-contiguous tensor: left as it is
        return x.t().view(6, 4).to(bf16), x.view(24).to(bf16, memory_format=torch.preserve_format)
    x = torch.randn(4, 6)
    gm = _aten_graph(moved, x)
    assert sink_views(gm.graph) == 1
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.index(torch.ops.aten._to_copy.default) < targets.index(torch.ops.aten.view.default)
    got, want = gm(x), moved(x)
    assert torch.equal(got, want) and got.stride() == want.stride()
    x2 = torch.randn(4, 6)
    gm2 = _aten_graph(kept, x2)
    before = [n.target for n in gm2.graph.nodes]
    assert sink_views(gm2.graph) == 1                    # only the contiguous source's view
    after = [n.target for n in gm2.graph.nodes]
    assert len(after) == len(before)
    gm2.recompile()
    for g, w in zip(gm2(x2), kept(x2)):
        assert torch.equal(g, w) and g.stride() == w.stride()


def test_sink_views_moves_a_view_past_a_chain_of_casts():
    """GPT-2's bias gradient under autocast: sum(0, keepdim, f32) -> view -> bf16 -> f32. The
    view sinks past both casts (it once stopped after the first, and the view between the casts
    cost a kernel of its own after every bias-gradient sum)."""
    def f(g):
        s = g.sum(0, keepdim=True, dtype=torch.float32)
        return s.view(6).to(bf16).to(torch.float32)
    g = torch.randn(4, 6, dtype=bf16)
    gm = _aten_graph(f, g)
    assert sink_views(gm.graph) == 2
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[-1] is torch.ops.aten.view.default
    assert targets.count(torch.ops.aten.view.default) == 1
    got, want = gm(g), f(g)
    assert got.dtype == want.dtype and torch.equal(got, want) and got.stride() == want.stride()
    with torch.no_grad():
        fused = pyfuser.compile(f)(g)
    assert torch.equal(fused, want) and fused.shape == want.shape
    (region,) = _regions()
    assert not views_between_compute(region) and region.kernels() == 1


def test_autocast_training_step_with_joined_casts_matches_eager():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.b = torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.b(self.norm(F.gelu(self.a(x))).view(-1, 32))

    torch.manual_seed(0)
    model = Net()
    ref = Net()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 16)
    compiled = pyfuser.compile(model)
    for m, fn in ((ref, ref), (model, compiled)):
        with torch.autocast("cpu", dtype=bf16):
            loss = fn(x).float().pow(2).mean()
        loss.backward()
        m.loss = loss.detach()
    torch.testing.assert_close(model.loss, ref.loss, rtol=2e-2, atol=2e-2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.dtype == q.grad.dtype
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-2)
    fwd = [g for g in compiled_graphs() if g.kind == "forward"][0]
    views = {"aten.t.default", "aten.view.default"}          # the weights' t(), x's view to 2-D
    joined = [r for r in fwd.regions if set(r.ops) - views == {"aten._to_copy.default"}]
    assert len(joined) == 1                                    # x, two weights, two biases
    assert joined[0].ops.count("aten._to_copy.default") == 5


def test_float32_bias_add_joins_the_region_of_its_fused_readers():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(16, 16)          # read by a matmul: keeps its addmm
            self.o = torch.nn.Linear(16, 16)          # view, residual add, layer norm
            self.f = torch.nn.Linear(16, 32)          # gelu
            self.n = torch.nn.LayerNorm(16)

        def forward(self, x):
            q = self.q(x)
            h = self.o(q @ q.transpose(1, 2) @ x)
            return self.n(h + x), F.gelu(self.f(x))
    torch.manual_seed(0)
    m, x = Net(), torch.randn(2, 5, 16)
    with torch.no_grad():
        got = pyfuser.compile(m)(x)
        want = m(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.stride() == w.stride()
        torch.testing.assert_close(g, w)
    (graph,) = compiled_graphs()
    targets = graph_targets(graph)
    assert targets.count(torch.addmm) == 1               # q's
    assert targets.count(torch.mm) >= 2                  # o's and f's (and q @ ... as bmm)
    ops = sorted(tuple(o for o in r.ops if o != "aten.view.default") for r in graph.regions)
    assert ("aten.add.Tensor", "aten.gelu.default") in ops
    assert any(o.count("aten.add.Tensor") == 2 and "aten.native_layer_norm.default" in o for o in ops)
    assert all(r.kernels() == 1 for r in graph.regions)


def test_bfloat16_and_unfused_readers_keep_the_addmm():
    def f(b, x, w, b16, x16, w16):
        return torch.addmm(b, x, w).sum(), torch.relu(torch.addmm(b16, x16, w16))
    args = (torch.randn(3), torch.randn(2, 4), torch.randn(4, 3))
    args = args + tuple(a.to(bf16) for a in args)
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    for g, w in zip(got, f(*args)):
        torch.testing.assert_close(g, w)
    targets = graph_targets(compiled_graphs()[0])
    assert targets.count(torch.addmm) == 1               # the bf16 one; the f32 sum's is split
    assert targets.count(torch.mm) == 1


def test_hoist_views_moves_a_view_of_an_unfused_results_cast_below_the_cast():
    from pyfuser.frontend.fx.rewrites import hoist_views

    def f(x, w, r):
        y = torch.mm(x, w).to(torch.float32).view(2, 3, 5)     # backward: mm, cast, view
        return F.layer_norm(y + r, (5,)), torch.mm(x, w).to(torch.float32).view(6, 5).t()
    args = (torch.randn(6, 4, dtype=bf16), torch.randn(4, 5, dtype=bf16), torch.randn(2, 3, 5))
    gm = _aten_graph(f, *args)
    mm_nodes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert hoist_views(gm.graph, lambda n: n not in mm_nodes and n.op == "call_function") == 2
    gm.recompile()
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten._to_copy.default:
            assert n.args[0].target is torch.ops.aten.view.default      # casts read the views
    for got, want in zip(gm(*args), f(*args)):
        assert torch.equal(got, want) and got.stride() == want.stride()
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    for g, w in zip(got, f(*args)):
        assert g.dtype == w.dtype and g.stride() == w.stride()
        torch.testing.assert_close(g, w)
    ln = next(r for r in _regions() if "aten.native_layer_norm.default" in r.ops)
    assert "aten._to_copy.default" in ln.ops and ln.kernels() == 1


def test_pointwise_regions_only_the_graph_returns_join_into_one():
    """A backward graph under autocast casts each weight gradient to float32 right after its
    matmul; those casts are only returned, so they join into one region."""
    def f(a, b, c, d):
        return torch.mm(a, b).float(), torch.mm(c, d).float() * 2, torch.mm(a, d.t()).float()
    args = (torch.randn(3, 4, dtype=bf16), torch.randn(4, 5, dtype=bf16),
            torch.randn(2, 6, dtype=bf16), torch.randn(6, 4, dtype=bf16))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    for g, w in zip(got, f(*args)):
        assert g.dtype == w.dtype and torch.equal(g, w)
    (region,) = _regions()
    assert sorted(region.ops) == ["aten._to_copy.default"] * 3 + ["aten.mul.Tensor"]
    assert region.kernels() == 1                                    # one horizontal kernel


def _ce_step(f, h, w, labels, g_logits):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, logits = f(h, w, labels)
    torch.autograd.backward([loss, logits], [torch.ones_like(loss), g_logits])
    return loss, logits, h.grad, w.grad


def test_cross_entropy_gradient_meeting_the_logits_tangent_is_one_kernel():
    """A causal LM returns its logits and a cross-entropy of them viewed flat: the backward
    adds the loss's gradient (through the view) to the logits' own tangent. The add moves above
    the view (sink_views_past_binary), the aliases the backend's detach decomposition leaves
    are skipped (skip_detach), and the gradient of the logits is one kernel: no [N, C]
    gradient written and read again. The forward saves the bfloat16 logits and two numbers a
    row (log_softmax and nll_loss_backward decomposed), not the float32 log-probabilities."""
    def f(h, w, labels):
        logits = h @ w
        loss = F.cross_entropy(logits.float().view(-1, 24), labels.view(-1))
        return loss, logits
    torch.manual_seed(0)
    h, w = torch.randn(2, 5, 8, dtype=bf16), torch.randn(8, 24, dtype=bf16)
    labels, g_logits = torch.randint(0, 24, (2, 5)), torch.randn(2, 5, 24, dtype=bf16)
    got = _ce_step(pyfuser.compile(f), h, w, labels, g_logits)
    want = _ce_step(f, h, w, labels, g_logits)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        torch.testing.assert_close(g.float(), e.float(), rtol=2e-2, atol=2e-2)
    backward = next(g for g in compiled_graphs() if g.kind == "backward")
    (ce,) = [r for r in backward.regions if "aten.where.self" in r.ops]
    assert "aten.add.Tensor" in ce.ops and not views_between_compute(ce)
    assert ce.kernels() == 1
    assert not {torch.ops.aten.detach.default, torch.ops.aten.alias.default} & \
        {n.target for n in backward.gm.graph.nodes}
    forward = next(g for g in compiled_graphs() if g.kind == "forward")
    (out,) = [n for n in forward.gm.graph.nodes if n.op == "output"]
    saved = [o.meta["val"] for o in out.args[0] if isinstance(o, torch.fx.Node)]
    assert not [v for v in saved if v.dtype == torch.float32 and v.numel() == 10 * 24], saved


def test_sink_views_past_binary_keeps_values_and_skips_fused_readers():
    from pyfuser.frontend.fx.rewrites import sink_views_past_binary

    def moved(x, t):                       # the add's reader is a cast: it moves too
        return ((x * 2).view(4, 6) + t).to(bf16)

    def kept(x, t):                        # the add's reader is fused compute: left alone
        return ((x * 2).view(4, 6) + t).exp()
    x, t = torch.randn(2, 12), torch.randn(4, 6)
    fusible = lambda n: n.op == "call_function" and n.target in (  # noqa: E731
        torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.exp.default,
        torch.ops.aten._to_copy.default)
    gm = _aten_graph(moved, x, t)
    assert sink_views_past_binary(gm.graph, fusible) == 1
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[-1] is torch.ops.aten.view.default        # the result's view is last
    got, want = gm(x, t), moved(x, t)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
    gm2 = _aten_graph(kept, x, t)
    assert sink_views_past_binary(gm2.graph, fusible) == 0


def test_a_clone_into_contiguous_format_is_written_row_major_by_the_kernel():
    """`transpose(...).contiguous()` (attention's heads back to [B, S, H*D]) fuses: the kernel
    writes eager's row-major layout itself, with no relayout copy after it."""
    import pyfuser.frontend.fx.region as R

    def f(x, y):
        a = (x * 2).transpose(1, 2).clone(memory_format=torch.contiguous_format)
        b = y.transpose(1, 2).contiguous()
        return a.view(2, 8, -1) + 1, b.view(2, 8, -1)
    x, y = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    relayouts = []
    real = R._relayout
    R._relayout = lambda t, order: (relayouts.append(order), real(t, order))[1]
    try:
        with torch.no_grad():
            got = pyfuser.compile(f)(x, y)
    finally:
        R._relayout = real
    for g, w in zip(got, f(x, y)):
        assert torch.equal(g, w) and g.stride() == w.stride()
    (region,) = _regions()
    assert region.ops.count("aten.clone.default") == 2 and region.kernels() == 2
    assert relayouts == []


def test_hoist_views_past_binary_keeps_values_and_skips_what_it_cannot_prove():
    """view(t + cast(m)) with t and m no fused op makes: the add reads views of them (the cast
    moves with its operand's view); a view of an add of a fused value, or of an add another op
    reads too, is left alone."""
    from pyfuser.frontend.fx.rewrites import hoist_views_past_binary

    def moved(t, m):
        return (t + (m @ m.new_ones(6, 6)).to(torch.float32)).view(2, 2, 6)

    def fused_operand(t, m):
        return (t + (t * 2)).view(2, 2, 6)

    def two_readers(t, m):
        s = t + m.to(torch.float32)
        return s.view(2, 2, 6), s * 3
    t, m = torch.randn(4, 6), torch.randn(4, 6, dtype=bf16)
    fusible = lambda n: n.op == "call_function" and n.target in (  # noqa: E731
        torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten._to_copy.default)
    gm = _aten_graph(moved, t, m)
    assert hoist_views_past_binary(gm.graph, fusible) == 1
    gm.recompile()
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert tuple(add.meta["val"].shape) == (2, 2, 6)              # the add in the view's shape
    assert [u.op for u in add.users] == ["output"]
    got, want = gm(t, m), moved(t, m)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
    for f in (fused_operand, two_readers):
        g = _aten_graph(f, t, m)
        assert hoist_views_past_binary(g.graph, fusible) == 0, f.__name__


def test_a_residual_gradient_add_fuses_into_the_layer_norm_backward():
    """A backward graph's add of a flattened output's own gradient and a matmul's gradient,
    viewed into a layer norm's backward (a model returning its last hidden state beside the
    logits): the add joins the dx kernel (no pointwise kernel writing the sum first)."""
    ln = torch.nn.LayerNorm(32)
    w = torch.randn(32, 48)

    def f(x):
        h = ln(x * 2).view(-1, 32)
        return h @ w, h
    x = torch.randn(4, 8, 32, requires_grad=True)
    logits, h = pyfuser.compile(f)(x)
    (logits.sum() + (h * h).sum()).backward()
    xe = x.detach().clone().requires_grad_()
    le, he = f(xe)
    (le.sum() + (he * he).sum()).backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-4, atol=1e-4)
    bw = [g for g in compiled_graphs() if g.kind == "backward"][0]
    (region,) = [r for r in bw.regions if "aten.native_layer_norm_backward.default" in r.ops]
    from pyfuser.runtime import dispatch
    report = dispatch.last_report(region.fusion)
    scheds = [s.scheduler for s in report.segments if s.kind == "kernel"]
    assert "pointwise" not in scheds, report


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_cast_naming_the_current_device_without_an_index_moves_and_fuses(device):
    """Traced graphs may name the device of a cast without an index (`device="cuda"`); on the
    tensor's own (current) device that is no move: `sink_views` moves the cast above the view
    and the cast stays fusible (fake CUDA tensors, no GPU needed). cuda:1 is a move."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from pyfuser.frontend.fx.rewrites import _same_device
    from pyfuser.frontend.fx.support import node_support
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    s = g.call_function(aten.sum.dim_IntList, (x, [0], True))
    v = g.call_function(aten.view.default, (s, [48]))
    c = g.call_function(aten._to_copy.default, (v,),
                        {"dtype": bf16, "device": torch.device(device)})
    g.output((c,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fake_x = torch.empty(8, 48, device="cuda")
    FakeTensorProp(gm, mode).propagate(fake_x)
    assert node_support(c, set())[0]
    assert sink_views(gm.graph) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [aten.sum.dim_IntList, aten._to_copy.default, aten.view.default]
    assert not _same_device(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not _same_device("cpu", torch.device("cuda", 0))
    # a 0-dim CPU tensor cast onto the device is read as a scalar: fusible; a [2] one is a move
    for shape, fusible in (((), True), ((2,), False)):
        g = torch.fx.Graph()
        t = g.placeholder("t")
        c = g.call_function(aten._to_copy.default, (t,),
                            {"dtype": bf16, "device": torch.device(device)})
        g.output((c,))
        gm = torch.fx.GraphModule(torch.nn.Module(), g)
        with mode:
            fake_t = torch.empty(shape)
        FakeTensorProp(gm, mode).propagate(fake_t)
        assert node_support(c, set())[0] is fusible
