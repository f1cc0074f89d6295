"""Slice, cat and constant pad inside pointwise kernels (schedule/pointwise_graph.py's "sh" keys,
lowering/aten_resize.py): a rotary embedding's forward and backward each one kernel, results
bit-equal to eager (no arithmetic changes: only which element is read), symbolic sizes read at
run time, empty operands, and the kernels compile with NVRTC for sm_90."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.codegen import api
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.runtime import dispatch, nvrtc
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels, check_fn
from test_inner_outer import _fusion

pytestmark = pytest.mark.usefixtures("fresh_compile")
ew = B.elementwise


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotary(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _unfused(kind):
    return {r for g in compiled_graphs() if g.kind == kind for r in g.unsupported.values()}


def test_rotary_forward_and_backward_fuse():
    """Llama's rotary embedding (q and k with different head counts, cos/sin shared): no cat,
    slice_backward or neg is left to eager, forward or backward, and the gradients are eager's."""
    def f(q, k, cos, sin):
        a, b = rotary(q, k, cos, sin)
        return a.sum(-1) + b.sum(-1).sum(1, keepdim=True)
    check_fn(f, (2, 4, 6, 16), (2, 2, 6, 16), (6, 16), (6, 16),
              loss=lambda out: (out * torch.arange(out.numel()).view(out.shape)).sum())
    for kind in ("forward", "backward"):
        ops = {op for g in compiled_graphs() if g.kind == kind for r in g.regions for op in r.ops}
        left = [n for g in compiled_graphs() if g.kind == kind for n in g.unsupported]
        assert not any(n.startswith(("cat", "slice_backward", "neg")) for n in left), (kind, left)
        want = {"aten.cat.default"} if kind == "forward" else {"aten.slice_backward.default"}
        assert want <= ops, (kind, ops)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert_ran_as_sm90_kernels(regions)


def test_rotary_values_bit_equal_to_eager():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 7, 32), torch.randn(2, 2, 7, 32)
    cos, sin = torch.randn(7, 32), torch.randn(7, 32)
    got = pyfuser.compile(rotary)(q, k, cos, sin)
    want = rotary(q, k, cos, sin)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        assert torch.equal(g, w)


@pytest.mark.parametrize("case", ["pad", "pad_negative", "cat3", "slice_mid", "pad_value",
                                  "stack_mid", "stack_last", "stack_first_reduced"])
def test_pads_cats_and_slices_match_eager(case):
    fns = {
        "stack_mid": lambda x, y: torch.stack([x[:, :5] * 2, y[:, 1:6].exp(), x[:, 1:]], 1) * 3,
        "stack_last": lambda x, y: torch.stack([x.sin(), y[:, :6]], -1).neg(),
        "stack_first_reduced": lambda x, y: torch.stack([x, y[:, 1:] + 1]).amax(0) * 2,
        "pad": lambda x, y: F.pad(x.exp(), (2, 3, 0, 1)) * 2,
        "pad_negative": lambda x, y: F.pad(x + 1, (-1, 2)),
        "cat3": lambda x, y: torch.cat([x * 2, y, x[:, :2] - 1], dim=1).sigmoid(),
        "slice_mid": lambda x, y: (x[:, 1:4] * y[:, 2:5]).relu(),
        "pad_value": lambda x, y: F.pad(torch.tanh(x), (1, 1), value=-0.5) + 1,
    }
    f = fns[case]
    torch.manual_seed(1)
    x, y = torch.randn(5, 6), torch.randn(5, 7)
    got, want = pyfuser.compile(f)(x, y), f(x, y)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions and all(r.eager_calls == 0 for r in regions)
    if case.startswith("stack"):                  # fused, not left to eager (it was until now)
        assert any("aten.stack.default" in r.ops for r in regions), [r.ops for r in regions]
        assert not any(n.startswith("stack") for g in compiled_graphs() for n in g.unsupported)
        assert_ran_as_sm90_kernels(regions)


def test_dynamic_sizes_reuse_the_kernel():
    """With dynamic=True the cat boundary and the open slice end are read at run time: new
    sequence lengths and head sizes give eager's results without recompiling."""
    g = pyfuser.compile(rotary, dynamic=True)
    for n, d in ((5, 16), (9, 16), (3, 8)):
        q, k = torch.randn(2, 3, n, d), torch.randn(2, 1, n, d)
        cos, sin = torch.randn(n, d), torch.randn(n, d)
        for a, b in zip(g(q, k, cos, sin), rotary(q, k, cos, sin)):
            assert torch.equal(a, b), (n, d)
    assert len([x for x in compiled_graphs() if x.kind == "inference"]) == 1


def test_cat_with_an_empty_operand_and_symbolic_sizes():
    """A cat operand of size 0 at run time (a KV cache that starts empty): its loads never run,
    the result is eager's."""
    def build():
        a = B.define_tensor([-1, -1], DataType.Float)
        b = B.define_tensor([-1, -1], DataType.Float)
        return [ew("mul", B.cat([a, ew("neg", b)], 1), 2.0)]
    f = _fusion(build)
    for na in (0, 3):
        a, b = torch.randn(4, na), torch.randn(4, 5)
        (out,) = dispatch.execute_fusion(f, [a, b], "interpret")
        assert torch.equal(out, torch.cat([a, -b], 1) * 2)


def _rotary_fusion(dtype):
    x = B.define_tensor([-1, -1, 64], dtype)
    c = B.define_tensor([-1, 64], dtype)
    rot = B.cat([ew("neg", B.slice_axis(x, 2, 32, None)), B.slice_axis(x, 2, 0, 32)], 2)
    return [ew("add", ew("mul", rot, c), rot)]


def _pad_fusion(dtype):
    x = B.define_tensor([-1, -1, 64], dtype)
    c = B.define_tensor([-1, 64], dtype)
    return [B.pad(ew("mul", x, c), [(0, 0), (1, 2), (0, 0)], 0.5)]


def _rotary_eager(x, c):
    rot = torch.cat([-x[..., 32:], x[..., :32]], -1)
    return rot * c + rot


def _pad_eager(x, c):
    return F.pad(x * c, (0, 0, 1, 2), value=0.5)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("build,eager", [(_rotary_fusion, _rotary_eager),
                                         (_pad_fusion, _pad_eager)], ids=["rotary", "pad"])
def test_kernels_compile_with_nvrtc_for_sm90(build, eager, dtype):
    f = _fusion(lambda: build(dtype))
    inputs = [torch.randn(3, 5, 64).to(dtype.torch), torch.randn(5, 64).to(dtype.torch)]
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "pointwise"
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (out,) = dispatch.execute_fusion(f, inputs, "interpret")
    want = eager(*inputs)
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_fusion_definition_pad_slice_cat_run_as_one_kernel():
    """nvFuser's fd.ops.pad / slice / cat: one pointwise kernel, eager's values."""
    from pyfuser.frontend.definition import Fusion as FS, FusionDefinition
    fs = FS()
    with FusionDefinition(fs) as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DataType.Float)
        t1 = fd.ops.slice(t0, start_indices=[0, 2], end_indices=[4, 6])
        t2 = fd.ops.pad(fd.ops.exp(t1), [1, 2], 0.25)
        t3 = fd.ops.cat([t2, fd.ops.neg(t1)], 1)
        fd.add_output(fd.ops.mul(t3, 3.0))
    x = torch.randn(4, 9)
    (out,) = fs.execute([x])
    s = x[:, 2:6]
    want = torch.cat([F.pad(s.exp(), (1, 2), value=0.25), -s], 1) * 3.0
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert "fd.ops.pad(" in repr(fd)
    report = dispatch.last_report(fs._ir)
    assert report is not None and report.eager_segments == 0 and report.kernels == 1, report


@pytest.mark.parametrize("case", ["pad_of_size_one", "iota_compare"])
def test_index_dependent_nodes_are_vectorized_only_where_aligned(case):
    """Fuzzer seed 50018: a pad of a size-1 input (a broadcast axis, so every load is affine)
    was vectorized, and the pad's condition saw the vector's first index for every lane: the
    pad value went missing. A pad's bounds must be multiples of the vector width (here they
    are not: one element a step); an iota along the vectors adds each lane's index."""
    if case == "pad_of_size_one":
        def f(x):
            v = F.pad(x, [0, 1])
            return torch.exp(v), v
        args = (torch.tensor([0.5]),)
    else:
        t = torch.tensor([1, 0, 3, 2, 3, 1, 0, 2])

        def f(x):
            return F.nll_loss(x * 2, t, reduction="sum")
        args = (torch.randn(8, 4, requires_grad=True),)
    got, want = pyfuser.compile(f)(*args), f(*args)
    if case == "iota_compare":
        got = torch.autograd.grad(got, args)[0]
        want = torch.autograd.grad(want, args)[0]
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w), (g, w)



def _halves(split):
    def f(x, c):
        return torch.cat((-x[..., split:], x[..., :split]), dim=-1) * c
    return f


def _inner_pad(lo):
    def f(x, y):         # y: an input of the padded size (its size facts are the pad's)
        return F.pad(x * 2.0, (lo, 0), value=-1.0) + y
    return f


def _cat3(a, b, c):       # no op joins the cat's extent to an input's: its operands' facts
    return torch.cat((a, b, c), dim=-1)


@pytest.mark.parametrize("fn,shapes,dtype,vec", [
    (_cat3, [(4, 8, 48), (4, 8, 40), (4, 8, 48)], torch.bfloat16, 8),
    (_cat3, [(4, 8, 48), (4, 8, 44), (4, 8, 48)], torch.bfloat16, 4),
    (_halves(32), [(2, 3, 16, 64), (16, 64)], torch.bfloat16, 8),
    (_halves(30), [(2, 3, 16, 64), (16, 64)], torch.bfloat16, 2),
    (_halves(32), [(2, 3, 16, 64), (16, 64)], torch.float32, 4),
    (_inner_pad(8), [(3, 5, 56), (3, 5, 64)], torch.bfloat16, 8),
    (_inner_pad(3), [(3, 5, 61), (3, 5, 64)], torch.bfloat16, 1),
], ids=["cat3-bf16", "cat3-44", "rotary-bf16", "split-30", "rotary-f32", "pad-8", "pad-3"])
def test_slices_cats_and_pads_keep_vectors_where_their_bounds_are_aligned(fn, shapes, dtype, vec,
                                                                           monkeypatch):
    """A rotary embedding's halves (a cat of two slices at 32 of 64) read and write 16-byte
    vectors: every vector lies on one side of each bound, so the cat's choice and the loads'
    bounds tests made with the vector's first index hold for all its lanes. A split at 30
    keeps vectors of 2, a pad of 3 none. Values are eager's bit for bit; NVRTC compiles them."""
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")      # plan here, not from disk
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda f, i: plans.append(real(f, i)) or plans[-1])
    torch.manual_seed(0)
    args = [torch.randn(*s, dtype=dtype) for s in shapes]
    with torch.no_grad():
        got = pyfuser.compile(fn)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (plan,) = [p for p in plans if p.scheduler == "pointwise"]
    assert plan.params.vec == vec, plan.params
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None


def test_stack_refusals_name_the_op():
    """What stack's lowering refuses (eager raises for both) is an UnsupportedOpError naming the
    op: the node stays an eager call, which raises as eager does."""
    from pyfuser.errors import UnsupportedOpError
    from pyfuser.frontend.lowering.aten_resize import _stack
    from pyfuser.ir.fusion import Fusion
    with Fusion():
        a = B.define_tensor([-1], DataType.Float)
        b = B.define_tensor([-1, -1], DataType.Float)
        with pytest.raises(UnsupportedOpError, match="aten::stack of tensors of different ranks"):
            _stack([a, b], 0)
        with pytest.raises(UnsupportedOpError, match="aten::stack takes a list of tensors"):
            _stack([], 0)
        with pytest.raises(UnsupportedOpError, match="aten::stack: dim 3 is out of range"):
            _stack([a, a], 3)


def test_select_and_slice_gradients_fuse_into_one_backward_region():
    """A select's gradient (`select_backward`: the unsqueezed gradient padded with zeros, one
    element wide, as ViT's class token gets it) and a slice's of a gradient of symbolic size
    fuse with the arithmetic around them: the backward graph is one region, nothing left to
    eager, the input's gradient bit-equal to eager's, the kernels NVRTC-compiled for sm_90."""
    def f(x, y):
        return (x[:, 0] * y).sin() + x[:, -1, 1:].exp().sum(-1, keepdim=True)
    torch.manual_seed(0)
    x, y = torch.randn(3, 5, 4, requires_grad=True), torch.randn(3, 4)
    x2 = x.detach().clone().requires_grad_()
    out = pyfuser.compile(f)(x, y)
    want = f(x2, y)
    torch.testing.assert_close(out, want)
    w = torch.randn(out.shape)
    (out * w).sum().backward()
    (want * w).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    bw = [g for g in compiled_graphs() if g.kind == "backward"]
    assert len(bw) == 1 and not bw[0].unsupported, bw[0].unsupported
    assert len(bw[0].regions) == 1
    ops = bw[0].regions[0].ops
    assert ops.count("aten.select_backward.default") == 2 and "aten.slice_backward.default" in ops
    assert_ran_as_sm90_kernels(bw[0].regions)


def test_select_backward_refusals_name_the_op():
    """An index out of range, or a gradient whose constant size does not fit the op's sizes, is
    refused (eager raises): the node stays an eager call, which raises as eager does."""
    from pyfuser.errors import UnsupportedOpError
    from pyfuser.frontend.lowering.aten_resize import _select_backward, _slice_backward
    from pyfuser.ir.fusion import Fusion
    with Fusion():
        g = B.slice_axis(B.define_tensor([-1, -1], DataType.Float), 0, 0, 3)   # [3, symbolic]
        assert [a.known_size() for a in g.logical] == [3, None]
        with pytest.raises(UnsupportedOpError, match="index 5 is out of range for size 5"):
            _select_backward(g, [3, 5, 4], 1, 5)
        with pytest.raises(UnsupportedOpError, match="axis 0 has 3 elements, the sizes say 2"):
            _select_backward(g, [2, 5, 4], 1, -1)
        with pytest.raises(UnsupportedOpError, match="not one axis more"):
            _select_backward(g, [3, 4], 1, 0)
        with pytest.raises(UnsupportedOpError, match="axis 0 has 3 elements, the sizes say 2"):
            _slice_backward(g, [4, 6], 0, 1, 3, 1)
        assert _select_backward(g, [3, 5, 4], 1, -2).ndim == 3       # symbolic axis: taken to fit


def test_select_between_compute_ops_fuses():
    """`x[:, i]` between compute ops is an index shift in the kernel (a one-wide slice,
    squeezed): one region, values and strides equal to eager's, on expanded, transposed and
    size-1 axes too; a negative index on an axis of symbolic size fuses too (a one-wide slice
    from size + index, a host scalar)."""
    cases = [
        (lambda x: (x * 2)[:, 1].sin() + x[:, 0], torch.randn(3, 5, 4)),
        (lambda x: (x.expand(3, 5, 4) + 1)[:, 3].sin(), torch.randn(3, 1, 4)),
        (lambda x: (x + 1)[:, 3].sin(), torch.randn(3, 1, 4).expand(3, 5, 4)),
        (lambda x: (x * 2).select(-1, 2).exp() + x.sum(-1), torch.randn(3, 5, 4)),
        (lambda x: (x * 2)[1].cos(), torch.randn(4, 5, 3).transpose(0, 2)),
    ]
    for f, x in cases:
        torch._dynamo.reset()
        got, want = pyfuser.compile(f)(x), f(x)
        assert torch.equal(got, want) and got.stride() == want.stride()
        g = compiled_graphs()[-1]
        assert not g.unsupported and len(g.regions) == 1, (g.unsupported, g.regions)
        assert "aten.select.int" in g.regions[0].ops
        assert_ran_as_sm90_kernels(g.regions)
    torch._dynamo.reset()
    f = lambda x: (x * 2)[..., -1].exp()                             # noqa: E731
    x = torch.randn(3, 4)
    got, want = pyfuser.compile(f)(x), f(x)
    assert torch.equal(got, want) and got.stride() == want.stride()
    g = compiled_graphs()[-1]
    assert not g.unsupported and "aten.select.int" in g.regions[0].ops
    assert_ran_as_sm90_kernels(g.regions)


@pytest.mark.parametrize("mode", ["evaluator", "interpret"])
def test_select_in_a_torchscript_group_is_checked_at_run_time(mode):
    """A TorchScript group holds the select (one group, one kernel); its axis is symbolic, so a
    later call whose axis is too short for the index is not read past the axis' end: the sizes'
    check fails and the group runs eagerly, which raises as eager does."""
    from pyfuser.frontend.torchscript.fuse_api import jit

    def h(x):
        return (x * 2).select(1, 3).sin()
    f = jit(torch.jit.script(h), cpu_executor=mode)
    x = torch.randn(3, 5, 4)
    assert torch.equal(f(x), h(x))
    assert (f.last_run.groups, f.last_run.kernels, f.last_run.eager_groups) == (1, 1, 0)
    with pytest.raises(Exception, match="index 3 out of range"):
        f(torch.randn(3, 2, 4))


def rotate_every_two(x):
    """GPT-J's interleaved rotary: pairs (x0, x1) -> (-x1, x0), from stepped slices."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def test_interleaved_rotary_forward_and_backward_fuse():
    """GPT-J's rotary with static sizes: the stepped slices (forward) and their stepped
    slice_backwards (backward) are in fused regions, none left to eager, and the results and
    gradients are as close to float64 eager's as float32 eager's are."""
    def f(q, cos, sin):
        h = torch.tanh(q)
        return (h * cos + rotate_every_two(h) * sin) * 2
    check_fn(f, (2, 4, 6, 16), (6, 16), (6, 16))
    for kind, op in (("forward", "aten.slice.Tensor"), ("backward", "aten.slice_backward.default")):
        ops = [o for g in compiled_graphs() if g.kind == kind for r in g.regions for o in r.ops]
        assert ops.count(op) >= 2, (kind, ops)
        assert not [r for r in _unfused(kind) if "slice" in r], _unfused(kind)
    assert_ran_as_sm90_kernels([r for g in compiled_graphs() for r in g.regions])
