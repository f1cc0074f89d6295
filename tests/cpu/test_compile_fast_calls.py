"""The torch.compile backend's fast bindings of the nodes left to FX (rewrites.fast_calls): each
aten OpOverload with a tensor method or torch function binding exactly that overload is called
through it (the generated argument parser, not the boxed call); the results are eager's values,
strides, storage offsets and view relations; what has no exact binding stays the OpOverload."""
from __future__ import annotations

import torch


def test_fast_calls_bind_the_same_ops_and_give_eagers_views():
    from pyfuser.frontend.fx.rewrites import fast_calls

    def f(x, w, b):
        y = torch.addmm(b, x.view(6, 4), w.t())             # view, t, addmm
        z = y.unsqueeze(0).transpose(1, 2).expand(2, 5, 6)
        return z.permute(2, 0, 1).select(0, 1), y.view(2, 3, 5).squeeze(0), torch.mm(x.view(6, 4), w.t())
    args = (torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5))
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    changed = fast_calls(gm.graph)
    gm.recompile()
    assert changed == len(before)                 # every one of these ops has a fast binding
    assert not any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   for n in gm.graph.nodes)
    for got, want in zip(gm(*args), f(*args)):
        assert torch.equal(got, want)
        assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset()
        assert got._base is not None or want._base is None


def test_fast_calls_of_glue_ops_match_eager():
    """detach, clone (with its memory format), embedding, gather, cumsum, arange, new_ones and an
    `_unsafe_view` the graph reads bind the same ops through methods / functions; an
    `_unsafe_view` the graph returns stays the OpOverload (a returned value is not a view)."""
    from pyfuser.frontend.fx.rewrites import fast_calls
    aten = torch.ops.aten

    def f(x, w, ids):
        e = aten.embedding.default(w, ids)
        c = aten.clone.default(x.transpose(0, 1), memory_format=torch.contiguous_format)
        u = aten._unsafe_view.default(aten.mul.Tensor(c, 2), [12])
        r = aten.arange.default(12, dtype=torch.float32, device=x.device)
        s = aten.cumsum.default(ids, 1)
        o = aten.new_ones.default(x, [3], dtype=torch.float32)
        out = aten._unsafe_view.default(aten.add.Tensor(u, r), [3, 4])
        g = aten.gather.default(w, 0, ids)
        return aten.detach.default(e), out, s, o, g
    args = (torch.randn(4, 3), torch.randn(10, 5), torch.tensor([[1, 2], [3, 4]]))
    gm = torch.fx.symbolic_trace(f)
    changed = fast_calls(gm.graph)
    gm.recompile()
    left = [n.target for n in gm.graph.nodes if n.op == "call_function" and
            isinstance(n.target, torch._ops.OpOverload)]
    assert left == [aten.mul.Tensor, aten.add.Tensor, aten._unsafe_view.default], left
    assert changed == 8
    for got, want in zip(gm(*args), f(*args)):
        assert torch.equal(got, want) and got.dtype == want.dtype
        assert got.stride() == want.stride()
    assert gm(*args)[1]._base is None          # the returned _unsafe_view: not a view


def test_fast_calls_of_convolution_pooling_and_attention_match_eager():
    """A convolution, a max pool with indices and SDPA's CPU attention forward (the CUDA
    forwards are mapped alike) bind through their torch functions: the same values, strides and
    dtypes, and no boxed call left."""
    from pyfuser.frontend.fx.rewrites import fast_calls
    aten = torch.ops.aten

    def f(x, w, b, q, k, v):
        c = aten.convolution.default(x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
        p, i = aten.max_pool2d_with_indices.default(c, [3, 3], [2, 2], [1, 1])
        a, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True,
                                                                          scale=0.5)
        return p, i, a, lse
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 3, 9, 9, generator=gen), torch.randn(4, 3, 3, 3, generator=gen),
            torch.randn(4, generator=gen), *(torch.randn(2, 2, 5, 8, generator=gen)
                                             for _ in range(3)))
    gm = torch.fx.symbolic_trace(f)
    assert fast_calls(gm.graph) == 3
    gm.recompile()
    assert not [n.target for n in gm.graph.nodes if n.op == "call_function" and
                isinstance(n.target, torch._ops.OpOverload)]
    for got, want in zip(gm(*args), f(*args)):
        assert torch.equal(got, want) and got.dtype == want.dtype
        assert got.stride() == want.stride()


def test_fast_calls_bind_split_and_static_slices_as_the_same_views():
    """aten.split.Tensor as `x.split`, aten.slice.Tensor of step 1 with static sizes as
    `x.narrow` (to the end, past the end, from a start); a strided slice stays the OpOverload."""
    from pyfuser.frontend.fx.rewrites import fast_calls
    aten = torch.ops.aten

    def f(x):
        q, k, v = aten.split.Tensor(x, 4, 1)
        a = aten.slice.Tensor(x, 1, 2, 9223372036854775807)
        b = aten.slice.Tensor(x, -1, 1, 7)
        c = aten.slice.Tensor(x, 0, 0, 100)
        d = aten.slice.Tensor(x, 1, 0, 12, 2)
        return q, k, v, a, b, c, d
    x = torch.randn(3, 12)
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(x)
    assert fast_calls(gm.graph) == 4               # the split and three slices
    gm.recompile()
    left = [n.target for n in gm.graph.nodes if n.op == "call_function" and
            isinstance(n.target, torch._ops.OpOverload)]
    assert left == [aten.slice.Tensor]             # the step-2 slice
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"].count("narrow") == 3
    for got, want in zip(gm(x), f(x)):
        assert torch.equal(got, want) and got.stride() == want.stride()
        assert got.storage_offset() == want.storage_offset() and got._base is not None


def test_fast_calls_leave_keyword_calls_alone():
    from pyfuser.frontend.fx.rewrites import fast_calls

    def f(b, x, w):
        return torch.addmm(b, x, w, beta=0.5)
    args = (torch.randn(3), torch.randn(2, 4), torch.randn(4, 3))
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    assert fast_calls(gm.graph) == 0
