"""AOTAutograd's output on disk (frontend/fx/graph_cache.py): a new process, or a reset of the
in-memory state, compiles a Dynamo graph it has compiled before without AOTAutograd's tracing
and partitioning, and gets eager's results and a cold compile's (forward, loss, gradients,
optimizer step, random draws); a change of the model's code, shapes, dtypes, grad mode,
autocast or options misses; what cannot be keyed safely (dynamic shapes) is not cached (its
fallbacks: test_compile_graph_cache_fallbacks.py); each test runs with the cache on (the
default) and a cache directory of its own."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compile_graph as CG
from pyfuser.frontend.fx import graph_cache
from graph_cache_cases import Block, OtherBlock, _eager, _model, _same, _stats, _train
from test_compile_cache import _fresh_process_state  # noqa: E402 - tests/cpu is on the path

pytestmark = pytest.mark.usefixtures("graph_cache_on")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_reset_hits_and_matches_eager_and_the_cold_compile():
    base = _model()
    x = torch.randn(4, 16)
    cold = _train(copy.deepcopy(base), x)
    s = _stats()
    assert s["stores"] == 2 and s["hits"] == 0, s        # the inference and the training graph
    _fresh_process_state()
    warm = _train(copy.deepcopy(base), x)
    s = _stats()
    assert s["hits"] == 2 and s["stores"] == 2, s
    _same(warm, cold, exact=True)
    _same(warm, _eager(copy.deepcopy(base), x))


def test_retain_graph_backwards_through_a_miss_and_a_hit():
    """The cache compiles a backward with its forward, before a backward() says whether it
    retains the graph; backward(retain_graph=True) then a second backward work as without
    the cache (a backward compiled with donated saved tensors refused it), on a miss and on a
    hit, with eager's gradients."""
    base = _model()
    x = torch.randn(4, 16)

    def twice(model, fn):
        model.zero_grad(set_to_none=True)
        loss = (fn(x) ** 2).mean()
        loss.backward(retain_graph=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    eager = twice(*(lambda m: (m, m))(copy.deepcopy(base)))
    for hits in (0, 1):
        if hits:
            _fresh_process_state()
        m = copy.deepcopy(base)
        got = twice(m, torch.compile(m, backend=pyfuser.backend))
        assert _stats()["hits"] == hits and _stats()["stores"] == 1, _stats()
        for g, w in zip(got, eager):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _names(graph) -> str:
    import re
    return re.sub(r"region_\d+", "region_N", str(graph))


def test_a_hit_compiles_the_same_fused_graphs():
    base = _model()
    x = torch.randn(4, 16)
    _train(copy.deepcopy(base), x, steps=1)
    cold = [(g.kind, _names(g.gm.graph), g.report()) for g in CG.compiled_graphs()]
    _fresh_process_state()
    _train(copy.deepcopy(base), x, steps=1)
    assert _stats()["hits"] == 2
    warm = [(g.kind, _names(g.gm.graph), g.report()) for g in CG.compiled_graphs()]
    assert sorted(k for k, _, _ in warm) == ["backward", "forward", "inference"]
    assert sorted(warm) == sorted(cold)


def test_a_hit_skips_aot_autograds_tracing_and_partitioning(monkeypatch):
    import torch._functorch._aot_autograd.graph_compile as gc
    base = _model()
    x = torch.randn(4, 16)
    _train(copy.deepcopy(base), x, steps=1)
    _fresh_process_state()
    traced = []
    for owner in (gc, torch._functorch.aot_autograd):
        orig = getattr(owner, "aot_stage1_graph_capture", None)
        if orig is not None:
            monkeypatch.setattr(owner, "aot_stage1_graph_capture",
                                lambda *a, _o=orig, **k: traced.append(1) or _o(*a, **k))
    from pyfuser.frontend.fx import backend
    part = backend._recomputing_partition
    monkeypatch.setattr(backend, "_recomputing_partition",
                        lambda *a, **k: traced.append(2) or part(*a, **k))
    _train(copy.deepcopy(base), x, steps=1)
    assert _stats()["hits"] == 2 and traced == []


@pytest.mark.parametrize("change", ["code", "shape", "dtype", "constant", "autocast",
                                    "requires_grad", "env"])
def test_a_change_misses(change, monkeypatch):
    base = _model()
    x = torch.randn(4, 16)
    _train(copy.deepcopy(base), x, steps=1)
    assert _stats()["stores"] == 2
    _fresh_process_state()
    model = copy.deepcopy(base)
    if change == "code":
        model = _model(OtherBlock)
    elif change == "shape":
        x = torch.randn(5, 16)
    elif change == "dtype":
        model, x = model.double(), x.double()
    elif change == "constant":
        model = _model(scale=0.25)                  # a Python constant of the graph
    elif change == "env":
        monkeypatch.setenv("PYFUSER_PARTITIONER", "default")
    if change == "requires_grad":
        for p in model.up.parameters():
            p.requires_grad_(False)
    if change == "autocast":
        fn = torch.compile(model, backend=pyfuser.backend)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = fn(x)
            want = model(x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert _stats()["hits"] == 0
        return
    got = _train(copy.deepcopy(model), x, steps=1)
    assert _stats()["hits"] == 0, _stats()
    _same(got, _eager(copy.deepcopy(model), x, steps=1))


def test_dynamic_shapes_are_not_cached():
    model = _model()
    fn = torch.compile(model, backend=pyfuser.backend, dynamic=True)
    x = torch.randn(4, 16)
    torch.testing.assert_close(fn(x), model(x))
    assert _stats()["stores"] == 0 and _stats()["bypass"] >= 1
    assert "dynamic" in graph_cache.last_bypass[0] or "symbolic" in graph_cache.last_bypass[0]


def test_random_draws_match_the_cold_compile():
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return F.dropout(F.gelu(self.lin(x)), p=0.3, training=True) * 2

    torch.manual_seed(0)
    base = Drop()
    x = torch.randn(8, 16)

    def run():
        model = copy.deepcopy(base)
        fn = torch.compile(model, backend=pyfuser.backend)
        torch.manual_seed(123)
        out = fn(x)
        out.sum().backward()
        return out.detach(), model.lin.weight.grad.clone()

    cold = run()
    _fresh_process_state()
    warm = run()
    assert _stats()["hits"] == 1
    torch.testing.assert_close(warm[0], cold[0], rtol=0, atol=0)
    torch.testing.assert_close(warm[1], cold[1], rtol=0, atol=0)


def test_input_mutations_and_aliased_outputs_survive_a_hit():
    def f(buf, x):
        buf.add_(x)                      # an input mutation
        y = torch.relu(x) * 2
        return y, y.view(-1), x.t()      # an output aliasing another, one aliasing an input

    def run():
        buf, x = torch.zeros(4, 4), torch.randn(4, 4)
        fn = torch.compile(f, backend=pyfuser.backend)
        out = fn(buf, x)
        return buf, x, out

    b0, x0, o0 = run()
    _fresh_process_state()
    b1, x1, o1 = run()
    assert _stats()["hits"] == 1
    torch.testing.assert_close(b1, x1)
    torch.testing.assert_close(o1[0], torch.relu(x1) * 2)
    assert o1[1]._base is o1[0] or o1[1].data_ptr() == o1[0].data_ptr()
    assert o1[2].data_ptr() == x1.data_ptr()


def test_user_functions_in_the_graph_are_not_keyed():
    gm = torch.fx.symbolic_trace(lambda x: _user(x) + 1)
    key, why = graph_cache.key_for(gm, [torch.randn(2)], {})
    assert key is None and "_user" in why


def _user(x):
    return x * 3


class _Pool(torch.nn.Module):
    """A convolution, max pool and ReLU: Dynamo's graph calls F.max_pool2d, which torch makes
    with a factory (boolean_dispatch's local `fn`): keyed by its module's name."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        return F.relu(F.max_pool2d(self.conv(x), 2)).flatten(1)


def test_a_max_pool_model_hits():
    torch.manual_seed(0)
    base = _Pool()
    x = torch.randn(2, 2, 8, 8)
    cold = _train(copy.deepcopy(base), x)
    s = _stats()
    assert s["stores"] == 2 and s["bypass"] == 0, (s, graph_cache.last_bypass)
    _fresh_process_state()
    warm = _train(copy.deepcopy(base), x)
    assert _stats()["hits"] == 2, _stats()
    _same(warm, cold, exact=True)
    _same(warm, _eager(copy.deepcopy(base), x))


torch.fx.wrap("_user")


_CHILD = textwrap.dedent("""
    import copy, json, sys, torch
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {here!r})
    import pyfuser
    from pyfuser.frontend.fx import graph_cache
    from graph_cache_cases import Block, _train
    torch.manual_seed(0)
    base = Block()
    x = torch.randn(4, 16)
    fwd, losses, grads, params = _train(copy.deepcopy(base), x)
    print("RESULT " + json.dumps({{"stats": graph_cache.stats, "fwd": fwd.tolist(),
        "losses": [l.item() for l in losses], "grads": [[g.tolist() for g in gs] for gs in grads],
        "params": [p.tolist() for p in params]}}))
""")


def _process(env) -> dict:
    code = _CHILD.format(root=ROOT, here=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, out.stderr[-3000:]
    return json.loads(line[-1][7:])


def test_a_new_process_hits_and_gives_the_same_training_results(tmp_path):
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(tmp_path / "shared"), PYTHONPATH=ROOT,
               PYFUSER_GRAPH_CACHE="1")
    cold = _process(env)
    warm = _process(env)
    assert cold["stats"]["stores"] == 2 and cold["stats"]["hits"] == 0, cold["stats"]
    assert warm["stats"]["hits"] == 2 and warm["stats"]["misses"] == 0, warm["stats"]
    for k in ("fwd", "losses", "grads", "params"):
        assert warm[k] == cold[k], k
    torch.manual_seed(0)
    base = Block()
    want = _eager(copy.deepcopy(base), torch.randn(4, 16))
    torch.testing.assert_close(torch.tensor(warm["fwd"]), want[0], rtol=1e-5, atol=1e-6)
    for got, w in zip(warm["params"], want[3]):
        torch.testing.assert_close(torch.tensor(got), w, rtol=1e-5, atol=1e-6)


def test_custom_ops_are_not_keyed():
    @torch.library.custom_op("pyfuser_test_graph_cache::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.pyfuser_test_graph_cache.twice.default, (x,)))
    key, why = graph_cache.key_for(torch.fx.GraphModule({}, g), [torch.randn(2)], {})
    assert key is None and "custom op" in why


def test_graphs_holding_tensors_are_not_keyed():
    """A tensor constant of the graph is a buffer of its module, which AOTAutograd's wrapper
    passes first at each call: the cache's rebuilt function does not, so such a graph is not
    cached."""
    root = torch.nn.Module()
    root.c = torch.full((2,), 1.0)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    c = g.get_attr("c")
    g.output(g.call_function(torch.ops.aten.add.Tensor, (x, c)))
    key, why = graph_cache.key_for(torch.fx.GraphModule(root, g), [torch.randn(2)], {})
    assert key is None and "buffers" in why

    def f(x):
        return torch.relu(x) + torch.tensor([1.0, 2.0])
    fn = torch.compile(f, backend=pyfuser.backend)
    x = torch.randn(2)
    torch.testing.assert_close(fn(x), f(x))


def test_input_aliasing_is_keyed():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.call_function(torch.ops.aten.add.Tensor, (a, b)))
    gm = torch.fx.GraphModule({}, g)
    base = torch.randn(8)
    k_apart, _ = graph_cache.key_for(gm, [torch.randn(4), torch.randn(4)], {})
    k_shared, _ = graph_cache.key_for(gm, [base[:4], base[4:]], {})
    assert k_apart is not None and k_shared is not None and k_apart != k_shared


def test_a_hit_the_channels_last_pass_would_change_is_refused(monkeypatch):
    """Graphs the channels-last pass changes are not stored; should a stored graph's pass
    change it when rebuilt (here: the CUDA test stubbed after the store), the entry is refused
    and the graph compiled as without the cache; only that compile's graphs are reported."""
    import channels_last_cases as CL
    from pyfuser.frontend.fx import compiled_graphs, layout_policy
    monkeypatch.setenv("PYFUSER_CHANNELS_LAST", "auto")
    torch.manual_seed(0)
    model, x = CL.conv_net(), torch.randn(2, 3, 8, 8)
    CL.step_beside_eager(copy.deepcopy(model), x, False)
    assert _stats()["stores"] == 1
    _fresh_process_state()
    monkeypatch.setattr(layout_policy, "_on_cuda", lambda convs: True)
    CL.step_beside_eager(copy.deepcopy(model), x, False)
    s = _stats()
    assert s["hits"] == 0 and s["refused"] == 1, s
    (g,) = compiled_graphs()
    assert g.layout is not None


def test_cuda_graph_training_through_a_hit(fake_graphs, no_graphed_calls):
    """mode="reduce-overhead" after a hit (the CPU stand-in graphs): the forward and backward
    are GraphedTraining again, with the facts the cold compile read from AOTAutograd's metadata
    (inputs read in place, written inputs, user outputs), stored in the entry; the steps equal
    eager's and the graphs replay."""
    from pyfuser.frontend.fx import cuda_graphs
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                               torch.nn.GELU(), torch.nn.Linear(16, 4))
    xs = [torch.randn(5, 8) for _ in range(4)]

    def steps(model, compiled):
        fn = torch.compile(model, backend=pyfuser.backend, mode="reduce-overhead") \
            if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in xs:
            opt.zero_grad(set_to_none=True)
            fn(x).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    def facts():
        got = {g.__name__.split("_")[1]: g for g in cuda_graphs.graphed_calls()}
        assert sorted(got) == ["backward", "forward"], got
        return {k: (type(g).__name__, g.static_idx, g.written, g.user_outputs, g.replays > 0)
                for k, g in got.items()}

    cold = steps(copy.deepcopy(base), True)
    cold_facts = facts()
    assert _stats()["stores"] == 1, _stats()
    _fresh_process_state()
    cuda_graphs._LIVE.clear()
    warm = steps(copy.deepcopy(base), True)
    assert _stats()["hits"] == 1, _stats()
    assert facts() == cold_facts
    assert cold_facts["forward"][0] == "GraphedTraining" and cold_facts["forward"][4]
    for a, b, c in zip(warm, cold, steps(copy.deepcopy(base), False)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
