"""Every op of the op table, evaluated by the reference evaluator, against eager PyTorch.

Cases are generated from OPS / REDUCTIONS, so a new op is covered without editing this file:
- for each dtype, the op is either accepted (then eager must accept it too, and the fusion's
  result must equal eager's in value and dtype) or rejected with a FusionDefinitionError naming the
  op, exactly when the computation dtype's category is outside the op's `accepts`;
- inputs are non-contiguous (sliced / transposed) and, for n-ary ops, broadcast (rank-1 against
  rank-2, size-1 axes);
- metadata ops (view, permute, expand, squeeze...) return views of their inputs as eager does.
"""
import pytest
import torch

from pyfuser.errors import FusionDefinitionError
from pyfuser.ir import OPS, REDUCTIONS, DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import Operand, Promotion, result_type
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.verifier import verify

DTYPES = [DataType.Float, DataType.Half, DataType.BFloat16, DataType.Double, DataType.Int32,
          DataType.Int, DataType.Bool]
# Values of the scalar-only operands (`scalar_args`) of ops that have them.
SCALAR_ARG_VALUES = {"leaky_relu": {1: 0.1}, "threshold": {1: 1, 2: 2}, "softplus": {1: 1, 2: 20},
                     "hardtanh": {1: -1, 2: 1}, "addcmul": {3: 2}}
LAYOUTS = {  # name -> per operand (allocated shape, transform to a view, symbolic sizes)
    "noncontig": lambda i: ((3, 10), lambda t: t[:, ::2], [-1, -1]) if i == 0 else
    ((5, 3), lambda t: t.t(), [-1, -1]),
    "broadcast": lambda i: ((3, 5), lambda t: t, [-1, -1]) if i == 0 else
    (((5,), lambda t: t, [-1]) if i == 1 else ((3, 1), lambda t: t, [-1, 1])),
}


def make_tensor(shape, dtype: DataType, gen, positive=False):
    if dtype.is_bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
        return (t.abs() + 0.25 if positive else t).to(dtype.torch)
    low = 1 if positive else -5
    return torch.randint(low, 6, shape, generator=gen).to(dtype.torch)


def op_inputs(name, info, dtype, layout, gen):
    """(values for the fusion inputs / eager call, symbolic sizes or None for scalars)."""
    vals, sizes = [], []
    for i in range(info.arity):
        if i in info.scalar_args:
            vals.append(SCALAR_ARG_VALUES[name][i])
            sizes.append(None)
            continue
        shape, view, sym = LAYOUTS[layout](i)
        d = DataType.Bool if name == "where" and i == 0 else dtype
        vals.append(view(make_tensor(shape, d, gen, positive=i > 0)))
        sizes.append(sym)
    return vals, sizes


def build(name, vals, sizes):
    f = Fusion()
    with f:
        args = [B.define_tensor(s, DataType.from_torch(v.dtype)) if s is not None else v
                for v, s in zip(vals, sizes)]
        f.add_output(B.elementwise(name, *args))
    return f


def expected_accepted(name, info, dtype) -> bool:
    kind = info.promotion if info.promotion not in (Promotion.ALWAYS_BOOL, Promotion.NONE) \
        else Promotion.DEFAULT
    ops = [Operand(dtype, Operand.TENSOR)]
    ops += [Operand(DataType.from_python(v), Operand.SCALAR)
            for i, v in SCALAR_ARG_VALUES.get(name, {}).items() if i not in info.scalar_args]
    return info.accepts_dtype(result_type(*ops, promotion=kind))


def assert_same(out, ref):
    assert out.dtype == ref.dtype, f"dtype {out.dtype} != eager {ref.dtype}"
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, equal_nan=True, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(OPS))
def test_elementwise_op_matches_eager(name, dtype):
    info = OPS[name]
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    layouts = ["noncontig"] if info.arity == 1 else ["noncontig", "broadcast"]
    for layout in layouts:
        vals, sizes = op_inputs(name, info, dtype, layout, gen)
        if not expected_accepted(name, info, dtype):
            with pytest.raises(FusionDefinitionError, match=name):
                build(name, vals, sizes)
            return
        f = build(name, vals, sizes)
        verify(f)
        (out,) = evaluate(f, [v for v, s in zip(vals, sizes) if s is not None])
        assert_same(out, info.ref(*vals))


@pytest.mark.parametrize("name", sorted(n for n, i in OPS.items() if i.scalar_args))
def test_scalar_only_operands_reject_tensors(name):
    info = OPS[name]
    f = Fusion()
    with f:
        args = [B.define_tensor([-1], DataType.Float) for _ in range(info.arity)]
        with pytest.raises(FusionDefinitionError, match=f"{name}: operand .* must be a scalar"):
            B.elementwise(name, *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_matches_eager(name, dtype):
    gen = torch.Generator().manual_seed(1)
    x = make_tensor((4, 6, 5), dtype, gen).transpose(0, 2)
    for axes, keepdim in [([0], False), ([0, 2], True), (None, False)]:
        f = Fusion()
        with f:
            t = B.define_tensor([-1, -1, -1], dtype)
            f.add_output(B.reduction(name, t, axes, keepdim))
        verify(f)
        (out,) = evaluate(f, [x])
        dims = list(range(3)) if axes is None else axes
        eager = {"sum": lambda: torch.sum(x, dims, keepdim=keepdim),
                 "max": lambda: torch.amax(x, dims, keepdim=keepdim),
                 "min": lambda: torch.amin(x, dims, keepdim=keepdim),
                 "prod": lambda: REDUCTIONS["prod"].ref(x, dims, keepdim)}[name]()
        assert_same(out, eager)


def test_sum_with_dtype_and_integer_sum_is_int64():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    f = Fusion()
    with f:
        t = B.define_tensor([-1, -1], DataType.Int32)
        f.add_output(B.reduction("sum", t, [1]))
        f.add_output(B.reduction("sum", t, [0], dtype=DataType.Double))
        f.add_output(B.reduction("max", t, [0]))
    a, b, c = evaluate(f, [x])
    assert_same(a, x.sum(1))
    assert_same(b, x.sum(0, dtype=torch.float64))
    assert c.dtype == torch.int32


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.Half])
def test_mean_and_var_mean_match_eager(dtype):
    x = make_tensor((6, 8), dtype, torch.Generator().manual_seed(2))
    f = Fusion()
    with f:
        t = B.define_tensor([-1, -1], dtype)
        var, mean = B.var_mean(t, [1], correction=1)
        f.add_output(var)
        f.add_output(mean)
        f.add_output(B.mean(t, [0], keepdim=True))
    verify(f)
    var, mean, mean0 = evaluate(f, [x])
    ref_var, ref_mean = torch.var_mean(x, 1, correction=1)
    tol = dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(var, ref_var, **tol)
    torch.testing.assert_close(mean, ref_mean, **tol)
    torch.testing.assert_close(mean0, x.mean(0, keepdim=True), **tol)


def test_metadata_ops_alias_like_eager():
    x = torch.randn(4, 6)
    f = Fusion()
    with f:
        t = B.define_tensor([-1, -1], DataType.Float)
        v = B.reshape(t, [2, 12])
        p = B.permute(t, [1, 0])
        u = B.unsqueeze(t, 1)
        s = B.squeeze(u, [1])
        c = B.set_(t)
        for o in (t, v, p, u, s, c):
            f.add_output(o)
    verify(f)
    outs = evaluate(f, [x])
    assert outs[0] is x
    for o, ref in zip(outs[1:5], [x.view(2, 12), x.t(), x.unsqueeze(1), x]):
        assert torch.equal(o, ref) and o.data_ptr() == x.data_ptr()
    assert torch.equal(outs[5], x) and outs[5].data_ptr() != x.data_ptr()


def test_expand_broadcast_in_dim_and_full():
    x = torch.randn(3, 1)
    f = Fusion()
    with f:
        t = B.define_tensor([-1, 1], DataType.Float)
        e = B.expand(t, [-1, 5])
        b = B.broadcast_in_dim(t, [2, 3, 5], [1, 2])
        fl = B.full([2, 2], 7, DataType.Int32)
        for o in (e, b, fl):
            f.add_output(o)
    verify(f)
    e, b, fl = evaluate(f, [x])
    assert torch.equal(e, x.expand(3, 5)) and e.stride() == x.expand(3, 5).stride()
    assert torch.equal(b, x.expand(2, 3, 5))
    assert torch.equal(fl, torch.full((2, 2), 7, dtype=torch.int32))


def test_unused_exprs_are_skipped_and_outputs_may_repeat():
    x = torch.randn(5)
    f = Fusion()
    with f:
        t = B.define_tensor([-1], DataType.Float)
        B.elementwise("log", t)  # unused
        y = B.elementwise("exp", t)
        f.add_output(y)
        f.add_output(y)
    a, b = evaluate(f, [x])
    assert a is b and torch.equal(a, torch.exp(x))
