"""The graph cache's key (frontend/fx/graph_cache_key.py), without compiling: each thing
AOTAutograd's result depends on, changed alone, changes the key (a stale entry is never found);
what the key cannot describe (code it cannot see, symbols, modes around the compile) gives no
key, with its reason. End-to-end hits and misses: test_compile_graph_cache.py."""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from pyfuser.frontend.fx import backend
from pyfuser.frontend.fx.graph_cache_key import key_for
from pyfuser.runtime import plan_store

aten = torch.ops.aten


def _graph(scale=2.0, child=None):
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    s = g.call_function(aten.sin.default, (a,))
    g.output(g.call_function(aten.mul.Tensor, (g.call_function(aten.mul.Tensor, (s, b)), scale)))
    gm = torch.fx.GraphModule({}, g)
    if child is not None:                      # a graph no node names (saved-tensors hooks)
        gm.add_submodule("saved_tensors_hooks_pack_0", child)
    return gm


def _hook_graph(op):
    g = torch.fx.Graph()
    g.output(g.call_function(op, (g.placeholder("t"),)))
    return torch.fx.GraphModule({}, g)


def _inputs():
    return [torch.ones(4, 4), torch.ones(4, 4)]


def _key(gm=None, inputs=None, opts=None):
    key, why = key_for(gm if gm is not None else _graph(),
                       inputs if inputs is not None else _inputs(), opts or {})
    assert key is not None, why
    return key


@contextlib.contextmanager
def _setting(get, set_, value):
    old = get()
    set_(value)
    try:
        yield
    finally:
        set_(old)


def _other_decomposition(monkeypatch):
    table = backend.decompositions()
    op = aten._log_softmax.default
    other = {**table, op: lambda *a, **k: NotImplemented}
    monkeypatch.setattr(backend, "decompositions", lambda: other)


# name -> f(monkeypatch) -> (graph, inputs, options, context): one thing changed
CHANGES = {
    "graph constant": lambda mp: (_graph(scale=3.0), None, None, None),
    "node metadata": lambda mp: (_annotated(), None, None, None),
    "hooks subgraph": lambda mp: (_graph(child=_hook_graph(aten.neg.default)), None, None, None),
    "dtype": lambda mp: (None, [t.double() for t in _inputs()], None, None),
    "shape": lambda mp: (None, [torch.ones(4, 5), torch.ones(4, 5)], None, None),
    "strides": lambda mp: (None, [torch.ones(4, 4).t(), torch.ones(4, 4)], None, None),
    "storage offset": lambda mp: (None, [torch.ones(20)[4:].view(4, 4), torch.ones(20)[4:]
                                         .view(4, 4).clone()], None, None),
    "requires_grad": lambda mp: (None, [torch.ones(4, 4, requires_grad=True),
                                        torch.ones(4, 4)], None, None),
    "aliased inputs": lambda mp: (None, [torch.ones(4, 4)] * 2, None, None),
    "grad mode": lambda mp: (None, None, None, torch.no_grad()),
    "inference mode": lambda mp: (None, None, None, torch.inference_mode()),
    "autocast": lambda mp: (None, None, None, torch.autocast("cpu", dtype=torch.bfloat16)),
    "autocast dtype": lambda mp: (None, None, None, torch.autocast("cpu", dtype=torch.float16)),
    "default dtype": lambda mp: (None, None, None, _setting(
        torch.get_default_dtype, torch.set_default_dtype, torch.float64)),
    "deterministic": lambda mp: (None, None, None, _setting(
        torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, True)),
    "matmul precision": lambda mp: (None, None, None, _setting(
        torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "medium")),
    "attention backend": lambda mp: (None, None, None, _setting(
        torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp, False)),
    "functorch config": lambda mp: (None, None, None,
                                    torch._functorch.config.patch(activation_memory_budget=0.5)),
    "inductor config": lambda mp: (None, None, None,
                                   torch._inductor.config.patch(fallback_random=True)),
    "dynamo config": lambda mp: (None, None, None,
                                 torch._dynamo.config.patch(capture_scalar_outputs=True)),
    "cache_key_tag": lambda mp: (None, None, None,
                                 torch.compiler.config.patch(cache_key_tag="another")),
    "symbolic shapes config": lambda mp: (None, None, None, _fx_config_patch()),
    "torch version": lambda mp: (mp.setattr(torch, "__version__", "0.0.1"), None, None, None),
    "torch commit": lambda mp: (mp.setattr(torch.version, "git_version", "0" * 40), None, None,
                                None),
    "pyfuser source": lambda mp: (mp.setattr(plan_store, "source_hash", lambda: "other"), None,
                                  None, None),
    "partitioner": lambda mp: (mp.setenv("PYFUSER_PARTITIONER", "default"), None, None, None),
    "channels-last pass": lambda mp: (mp.setenv("PYFUSER_CHANNELS_LAST", "1"), None, None, None),
    "CPU executor": lambda mp: (mp.setenv("PYFUSER_CPU_EXECUTOR", "evaluator"), None, None, None),
    "CUDA-graph mode": lambda mp: (None, None, {"cuda_graphs": True}, None),
    "decomposition": lambda mp: (_other_decomposition(mp), None, None, None),
}


def _annotated():
    gm = _graph()
    next(n for n in gm.graph.nodes if n.op == "call_function").meta["custom"] = {"stage": 1}
    return gm


def _fx_config_patch():
    import torch.fx.experimental._config as fx_config
    return fx_config.patch(use_duck_shape=not fx_config.use_duck_shape)


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("PYFUSER_PARTITIONER", "PYFUSER_CHANNELS_LAST", "PYFUSER_CPU_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_one_change_changes_the_key(change, clean_env):
    base = _key()
    assert _key() == base                                    # the key is a function of these
    with pytest.MonkeyPatch.context() as mp:
        gm, inputs, opts, ctx = CHANGES[change](mp)
        with ctx if ctx is not None else contextlib.nullcontext():
            other = _key(gm, inputs, opts)
    assert other != base, change
    assert _key() == base                          # the change undone, the key is back


def test_autocast_dtypes_are_told_apart():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = _key()
    with torch.autocast("cpu", dtype=torch.float16):
        f16 = _key()
    assert bf16 != f16


def test_two_hooks_subgraphs_are_told_apart():
    assert _key(_graph(child=_hook_graph(aten.neg.default))) != \
        _key(_graph(child=_hook_graph(aten.exp.default)))


class _Mode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _no_key_under(ctx, gm=None) -> str:
    with ctx:
        key, why = key_for(gm if gm is not None else _graph(), _inputs(), {})
    assert key is None
    return why


def test_code_the_key_cannot_see_gives_no_key():
    cfg = torch._functorch.config
    why = _no_key_under(cfg.patch(joint_custom_pass=lambda g, inputs: g))
    assert "joint_custom_pass" in why
    why = _no_key_under(cfg.patch(activation_memory_budget_solver=lambda *a: a))
    assert "activation_memory_budget_solver" in why
    gm = _graph()
    gm.meta["_checkpoint_context_fn"] = functools.partial(print)     # a checkpointing policy
    assert "_checkpoint_context_fn" in _no_key_under(contextlib.nullcontext(), gm)
    gm = _graph()
    gm.add_submodule("act", torch.nn.ReLU())                        # a module, not a graph
    assert "submodule" in _no_key_under(contextlib.nullcontext(), gm)


def test_modes_around_the_compile_give_no_key():
    assert "dispatch mode" in _no_key_under(_Mode())
    seen = []

    def under_vmap(t):
        seen.append(key_for(_graph(), _inputs(), {}))
        return t
    torch.func.vmap(under_vmap)(torch.ones(2))
    assert seen[0][0] is None and "functorch" in seen[0][1]
    from torch._subclasses import FakeTensorMode
    ctx = torch._guards.TracingContext(FakeTensorMode())
    ctx.fakify_first_call = True
    assert "fakifies" in _no_key_under(torch._guards.tracing(ctx))


def test_a_symbol_inside_a_static_graph_gives_no_key():
    """nonzero's size is an unbacked symbol though the inputs are static."""
    got = []

    def capture(gm, example_inputs):
        got.append(key_for(gm, example_inputs, {}))
        return gm.forward
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        fn = torch.compile(lambda x: torch.nonzero(x > 0).sum(), backend=capture, fullgraph=True)
        x = torch.tensor([1.0, -1.0, 2.0])
        assert fn(x).item() == 2
    torch._dynamo.reset()
    assert got and got[0][0] is None and "symbolic" in got[0][1], got


def test_selective_checkpointing_gives_no_key():
    """A checkpoint's policy (context_fn) is Python code on the subgraph's metadata."""
    from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                        create_selective_checkpoint_contexts)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == aten.mm.default else \
            CheckpointPolicy.PREFER_RECOMPUTE
    lin = torch.nn.Linear(4, 4)
    got = []

    def capture(gm, example_inputs):
        got.append(key_for(gm, example_inputs, {}))
        return gm.forward

    def f(x):
        return checkpoint(lambda v: torch.sin(lin(v)), x, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                       policy))
    fn = torch.compile(f, backend=capture)
    x = torch.randn(2, 4, requires_grad=True)
    torch.testing.assert_close(fn(x), torch.sin(lin(x)))
    torch._dynamo.reset()
    assert got and got[0][0] is None and "_checkpoint_context_fn" in got[0][1], got


def _call_graph(fn):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(fn, (x, 2)))
    return torch.fx.GraphModule({}, g)


def test_a_torch_function_made_by_a_factory_is_named_by_its_module():
    # F.max_pool2d is boolean_dispatch's local `fn`, bound to torch.nn.functional.max_pool2d
    # (a Dynamo graph of a ResNet calls it): keyed by that name, apart from max_pool1d's
    f = torch.nn.functional
    assert "<locals>" in f.max_pool2d.__qualname__
    k2 = key_for(_call_graph(f.max_pool2d), [torch.ones(1, 1, 4, 4)], {})
    k1 = key_for(_call_graph(f.max_pool1d), [torch.ones(1, 1, 4, 4)], {})
    assert k2[0] is not None and k1[0] is not None, (k2, k1)
    assert k2[0] != k1[0]


def test_a_local_function_of_user_code_gives_no_key():
    def pool(x, k):
        return x
    key, why = key_for(_call_graph(pool), [torch.ones(1, 1, 4, 4)], {})
    assert key is None and "a call of" in why and "pool" in why
