"""Broadcasts, non-contiguous / permuted / sliced / misaligned inputs, views, scalars, empty tensors,
odd sizes and multiple outputs: interpreter results and output strides equal eager's, and every
kernel compiles for sm_90."""
import pytest
import torch

from codegen_cases import B, DataType, check, make_fusion, run_plan

F, I64, I32, H, BF = DataType.Float, DataType.Int, DataType.Int32, DataType.Half, DataType.BFloat16


def t(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def add_build(dts, ranks_sizes):
    def build():
        xs = [B.define_tensor(s, d) for d, s in zip(dts, ranks_sizes)]
        out = xs[0]
        for x in xs[1:]:
            out = B.elementwise("add", out, x)
        return B.elementwise("mul", out, 2)
    return build


@pytest.mark.parametrize("a,b", [
    ((5, 7, 9), (9,)), ((5, 7, 9), (7, 1)), ((5, 1, 9), (5, 7, 1)), ((16, 64), (64,)),
    ((300, 256), (256,)), ((3, 256, 7, 8), (256, 1, 1)), ((1, 1, 5), (4, 3, 1)),
])
def test_broadcasts(a, b):
    x, y = t(*a), t(*b, seed=1)
    check(add_build([F, F], [[1 if s == 1 else -1 for s in a], [1 if s == 1 else -1 for s in b]]),
          [x, y], lambda x, y: (x + y) * 2)


LAYOUTS = {
    "transposed": lambda x: x.t().contiguous().t(),
    "sliced": lambda x: torch.cat([x, x], 1)[:, 3:3 + x.shape[1]],
    "strided_rows": lambda x: torch.cat([x, x], 0)[::2],
    "misaligned": lambda x: torch.cat([x.flatten(), x.flatten()])[1:1 + x.numel()].view(x.shape),
    "expanded": lambda x: x[:1].expand(x.shape),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", [(8, 64), (7, 33)])
def test_noncontiguous(layout, shape):
    x = LAYOUTS[layout](t(*shape))
    y = t(*shape, seed=2)
    check(add_build([F, F], [[-1, -1], [-1, -1]]), [x, y], lambda x, y: (x + y) * 2)
    check(add_build([F, F], [[-1, -1], [-1, -1]]), [y, x], lambda x, y: (x + y) * 2)


def test_channels_last_and_permuted_3d():
    x = t(2, 16, 5, 6).contiguous(memory_format=torch.channels_last)
    w = t(16, 1, 1, seed=3)
    check(add_build([F, F], [[-1, -1, -1, -1], [-1, 1, 1]]), [x, w], lambda x, w: (x + w) * 2)
    p = t(4, 5, 6).permute(2, 0, 1)
    check(add_build([F, F], [[-1, -1, -1], [-1, -1, -1]]), [p, p.contiguous()], lambda x, y: (x + y) * 2)


def test_permute_and_view_inside():
    def build():
        x = B.define_tensor([-1, -1, -1], F)
        y = B.define_tensor([-1, -1, -1], F)
        p = B.permute(B.elementwise("exp", x), [2, 0, 1])
        s = B.elementwise("add", p, y)
        v = B.reshape(s, [6, 20])
        return B.elementwise("mul", v, 0.5)
    x, y = t(4, 5, 6), t(6, 4, 5, seed=1)
    check(build, [x, y], lambda x, y: ((x.exp().permute(2, 0, 1) + y).reshape(6, 20) * 0.5))

    def build2():
        x = B.define_tensor([-1, -1], F)
        v = B.reshape(x, [2, -1, 5])
        b = B.define_tensor([5], F)
        return B.elementwise("sub", v, b)
    check(build2, [t(4, 15), t(5, seed=4)], lambda x, b: x.reshape(2, -1, 5) - b)


def test_scalar_inputs_and_full():
    def build():
        x = B.define_tensor([-1, -1], F)
        s = B.symbolic_scalar(DataType.Double)
        k = B.symbolic_scalar(DataType.Int)
        from pyfuser.ir.fusion import Fusion
        Fusion.current().add_input(s)
        Fusion.current().add_input(k)
        y = B.elementwise("mul", x, s)
        return [B.elementwise("add", y, k), B.elementwise("gt", y, 0.25)]
    x = t(9, 31)
    check(build, [x, 0.3, 7], lambda x, s, k: [x * s + k, (x * s) > 0.25])

    def build_full():
        x = B.define_tensor([-1, -1], I32)
        z = B.full([3, 8], 2.5, F)
        return B.elementwise("add", B.cast(x, F), z)
    check(build_full, [t(3, 8, dtype=torch.int32)], lambda x: x.float() + torch.full((3, 8), 2.5))


def test_half_bf16_chains_round_each_op():
    def build():
        a = B.define_tensor([-1, -1], H)
        b = B.define_tensor([-1, -1], BF)
        x = B.elementwise("gelu", B.elementwise("mul", a, 1.7))
        return [x, B.elementwise("silu", B.elementwise("add", b, B.cast(a, BF))), B.cast(x, BF)]
    a, b = t(8, 48, dtype=torch.float16), t(8, 48, dtype=torch.bfloat16, seed=2)

    def ref(a, b):
        x = torch.nn.functional.gelu(a * 1.7)
        return [x, torch.nn.functional.silu(b + a.to(torch.bfloat16)), x.to(torch.bfloat16)]
    check(build, [a, b], ref)


def test_integer_wraparound_and_bool():
    def build():
        a = B.define_tensor([-1], I64)
        b = B.define_tensor([-1], DataType.Char)
        c = B.define_tensor([-1], DataType.Bool)
        return [B.elementwise("mul", a, a), B.elementwise("add", b, B.cast(a, DataType.Char)),
                B.elementwise("where", c, B.elementwise("neg", a), a)]
    a = torch.tensor([2 ** 62, -2 ** 63, 3, 2 ** 40] * 5)
    b = torch.tensor([100, -100, 127, 1] * 5, dtype=torch.int8)
    c = torch.tensor([True, False, True, True] * 5)
    check(build, [a, b, c], lambda a, b, c: [a * a, b + a.to(torch.int8), torch.where(c, -a, a)])


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0,)])
def test_empty(shape):
    x = torch.empty(shape)
    plan = check(add_build([F, F], [[-1] * len(shape), [-1] * len(shape)]), [x, x], lambda x, y: (x + y) * 2)
    from pyfuser.ir.shapes import bind
    f = plan.schedule.orig
    outs = plan.allocate_outputs(bind(f, [x, x]), [x, x], "cpu")
    assert 0 in plan.kernel.launch_config(bind(f, [x, x]), [x, x, *outs]).grid


def test_rank0_and_size1():
    check(add_build([F, F], [[], []]), [torch.tensor(1.5), torch.tensor(2.0)], lambda x, y: (x + y) * 2)
    check(add_build([F, F], [[1, -1, 1], [-1, -1]]), [t(1, 6, 1), t(6, 5, seed=1)], lambda x, y: (x + y) * 2)


def test_64bit_index_plan_on_meta():
    from pyfuser.codegen import api
    x = torch.empty(2 ** 16, 2 ** 15 + 2, device="meta")
    f = make_fusion(add_build([F, F], [[-1, -1], [-1]]))
    inputs = [x, torch.empty(2 ** 15 + 2, device="meta")]
    assert api.signature(f, inputs)[1] is True
    plan = api.plan_kernel(f, inputs)
    assert plan.index_type == "int64_t" and "typedef int64_t nidx_t" in plan.kernel.source
    from codegen_cases import compile_source
    compile_source(plan.kernel.source, plan.kernel.name)


def test_vectorization_is_defeated_by_odd_sizes_and_misalignment():
    from pyfuser.codegen import api
    f = make_fusion(add_build([F, F], [[-1, -1], [-1, -1]]))
    x = t(8, 64)
    assert api.plan_kernel(f, [x, x]).schedule.params.vec == 4
    odd = t(7, 33)
    assert api.plan_kernel(f, [odd, odd]).schedule.params.vec == 1
    mis = LAYOUTS["misaligned"](x)
    sig_a, sig_b = api.signature(f, [x, x]), api.signature(f, [mis, x])
    assert sig_a != sig_b
    assert api.plan_kernel(f, [mis, x]).schedule.params.vec == 1
    run_plan(f, [mis, x])


# ---- views between compute ops ------------------------------------------------------------------
def _relu_view_mul(shape, perm=None):
    def build():
        x = B.define_tensor([-1, -1], F)
        w = B.define_tensor([-1], F)
        v = B.reshape(B.elementwise("relu", x), shape)
        if perm is not None:
            v = B.permute(v, perm)
        return B.elementwise("mul", v, w)
    return build


def _accesses(plan):
    return {a.tv.name: a for a in plan.schedule.accesses}


def test_view_between_compute_ops_keeps_vectors():
    """relu(x).view(4, 16, 48) * w: x is read at the view output's row-major index, an affine
    offset, so the kernel is one collapsed axis of 16-byte vectors with no div/mod per element."""
    x, w = t(64, 48), t(48, seed=1)
    plan = check(_relu_view_mul([4, 16, 48]), [x, w], lambda x, w: x.relu().view(4, 16, 48) * w)
    p = plan.schedule.params
    loads = [a for a in plan.schedule.accesses if not a.is_store]
    xa = next(a for a in loads if a.sizes == (64, 48))
    assert xa.linear and xa.mode == "vector" and p.vec == 4
    assert p.groups[-1][-1] == 2 and [k for g in p.groups for k in g] == [0, 1, 2]
    body = [ln for ln in plan.body.splitlines() if "nbx =" not in ln and "r" in ln]
    assert not [ln for ln in body if "%" in ln], "a view decomposed per element"


@pytest.mark.parametrize("case", ["transposed input", "permute after the view", "inferred size",
                                  "misaligned", "size-1 axes", "broadcast operand"])
def test_view_between_compute_ops_other_layouts(case):
    """Where the offset is not the row-major index the access stays general; either way the
    results equal eager's."""
    x, w = t(64, 48), t(48, seed=1)
    if case == "transposed input":
        x = t(48, 64).t()
        plan = check(_relu_view_mul([4, 16, 48]), [x, w],
                     lambda x, w: x.relu().reshape(4, 16, 48) * w)
        assert not _linear(plan, x)
    elif case == "permute after the view":
        w = t(16, seed=1)
        plan = check(_relu_view_mul([4, 48, 16], perm=[1, 0, 2]), [x, w],
                     lambda x, w: x.relu().view(4, 48, 16).permute(1, 0, 2) * w)
        assert _linear(plan, x) and _access_of(plan, x).mode == "vector"   # eager keeps x's order
    elif case == "inferred size":                  # the -1 extent's facts are in the signature
        plan = check(_relu_view_mul([4, -1, 48]), [x, w],
                     lambda x, w: x.relu().view(4, -1, 48) * w)
        assert _linear(plan, x) and plan.schedule.params.vec == 4
    elif case == "misaligned":
        base = t(64 * 48 + 1)
        x = base[1:].view(64, 48)
        plan = check(_relu_view_mul([4, 16, 48]), [x, w],
                     lambda x, w: x.relu().view(4, 16, 48) * w)
        assert _linear(plan, x) and plan.schedule.params.vec == 1
    elif case == "broadcast operand":
        y = t(64, 1, seed=2)                       # broadcast along the view input's axis 1

        def build():
            xx = B.define_tensor([-1, -1], F)
            yy = B.define_tensor([-1, 1], F)
            ww = B.define_tensor([-1], F)
            v = B.reshape(B.elementwise("add", xx, yy), [4, 16, 48])
            return B.elementwise("mul", v, ww)
        plan = check(build, [x, y, w], lambda x, y, w: (x + y).view(4, 16, 48) * w)
        assert _linear(plan, x) and not _linear(plan, y)
    else:
        x = t(64, 1, 48)

        def build():
            xx = B.define_tensor([-1, 1, -1], F)
            ww = B.define_tensor([-1], F)
            v = B.reshape(B.elementwise("neg", xx), [8, 1, 8, 48])
            return B.elementwise("add", v, ww)
        plan = check(build, [x, w], lambda x, w: (-x).view(8, 1, 8, 48) + w)
        assert _linear(plan, x)


def _access_of(plan, x):
    return next(a for a in plan.schedule.accesses if not a.is_store and a.sizes == tuple(x.shape))


def _linear(plan, x) -> bool:
    return _access_of(plan, x).linear


def test_inferred_view_extents_are_in_the_signature():
    """A `-1` view extent bound at run time: whether it is 1 and its power of two are signature
    facts, so a plan made for one size is reused only where its decisions hold, and is right."""
    from pyfuser.codegen import api
    f = make_fusion(_relu_view_mul([4, -1, 48]))
    w = t(48, seed=1)
    sig = [api.signature(f, [t(4 * n, 48), w]) for n in (16, 32, 3, 1)]
    assert sig[0] == sig[1] and sig[0] != sig[2] and sig[2] != sig[3]
    plan = api.plan_kernel(f, [t(64, 48), w])
    x = t(128, 48, seed=3)                          # same signature, other size
    _, outs = run_plan(f, [x, w], plan)
    assert torch.equal(outs[0], x.relu().view(4, -1, 48) * w)
    plan3 = check(_relu_view_mul([4, -1, 48]), [t(12, 48), w],
                  lambda x, w: x.relu().view(4, -1, 48) * w)
    assert plan3.schedule.params.vec == 4          # 3 rows of 48: still whole vectors
    plan1 = check(_relu_view_mul([4, -1, 48]), [t(4, 48), w],
                  lambda x, w: x.relu().view(4, -1, 48) * w)
    assert 1 in plan1.schedule.params.dropped      # the size-1 view axis, a signature fact


def test_views_in_a_chain_stay_linear():
    """x -> neg -> view [4, 16, 48] -> exp -> view [8, 384] -> * w: each view keeps the row-major
    index, so x's offset is the last view's linear index: one vectorized axis. A permute between
    the views breaks that: div/mod indexing, same results."""
    def build(permute):
        def b():
            x = B.define_tensor([-1, -1], F)
            w = B.define_tensor([-1], F)
            v = B.reshape(B.elementwise("neg", x), [4, 16, 48])
            v = B.elementwise("exp", v)
            if permute:
                v = B.permute(v, [1, 0, 2])
            return B.elementwise("mul", B.reshape(v, [8, 384]), w)
        return b
    x, w = t(64, 48), t(384, seed=1)
    plan = check(build(False), [x, w], lambda x, w: (-x).view(4, 16, 48).exp().view(8, 384) * w)
    assert _linear(plan, x) and plan.schedule.params.vec == 4
    plan = check(build(True), [x, w],
                 lambda x, w: (-x).view(4, 16, 48).exp().permute(1, 0, 2).reshape(8, 384) * w)
    assert not _linear(plan, x)



def _t_contiguous(x):
    return x.t().contiguous() + 1


def _mul_t_contiguous(x):
    return (x * 2).t().contiguous()


def _transpose_clone(x):
    return x.transpose(0, 1).clone(memory_format=torch.contiguous_format)


@pytest.mark.parametrize("fn", [_t_contiguous, _mul_t_contiguous, _transpose_clone])
def test_contiguous_copy_of_a_permuted_value_is_row_major_as_eagers(fn):
    """`contiguous()` / a clone into contiguous_format lays its result out row-major whatever
    its input's layout (the SetOp's `contiguous` flag); it used to keep the input's transposed
    strides, unlike eager."""
    import pyfuser
    x = t(8, 16)
    pf = pyfuser.jit(torch.jit.script(fn))
    got, want = pf(x), fn(x)
    assert torch.equal(got, want) and got.stride() == want.stride() == (8, 1)
    assert pf.last_run.kernels == 1 and pf.last_run.eager_groups == 0
