"""Type promotion of the builder against eager PyTorch: mixed tensor dtypes, Python scalars,
0-dim tensors and fusion scalar inputs. The result dtype and values must equal eager's."""
import itertools

import pytest
import torch

from pyfuser.errors import FusionDefinitionError
from pyfuser.ir import OPS, DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.verifier import verify

D = DataType
PAIRS = [(D.Half, D.Float), (D.BFloat16, D.Half), (D.Int32, D.Half), (D.Bool, D.Int32),
         (D.Int32, D.Int), (D.Float, D.Double), (D.Bool, D.BFloat16), (D.Int, D.Float)]
SCALARS = [2, 2.5, True]
BINARY = sorted(n for n, i in OPS.items() if i.arity == 2 and not i.scalar_args)


def sample(dtype: DataType, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 + 0.5).to(dtype.torch)
    return torch.randint(1, 6, shape, generator=g).to(dtype.torch)


def run_binary(name, a, b):
    """Fusion result of `name(a, b)`; a is a tensor, b a tensor or a Python scalar."""
    f = Fusion()
    with f:
        ta = B.define_tensor([-1] * a.dim(), DataType.from_torch(a.dtype))
        tb = B.define_tensor([-1] * b.dim(), DataType.from_torch(b.dtype)) \
            if isinstance(b, torch.Tensor) else b
        f.add_output(B.elementwise(name, ta, tb))
    verify(f)
    return evaluate(f, [a] + ([b] if isinstance(b, torch.Tensor) else []))[0]


def eager_or_none(fn):
    try:
        return fn()
    except (RuntimeError, TypeError):
        return None


def eager(name, a, b):
    ref = eager_or_none(lambda: OPS[name].ref(a, b))
    if ref is None and not isinstance(b, torch.Tensor):
        # torch.maximum, atan2...: no Python numbers; eager's answer for the scalar as a 0-dim
        # tensor of the promoted dtype (what the evaluator passes).
        ref = eager_or_none(lambda: OPS[name].ref(a, torch.tensor(b, dtype=torch.result_type(a, b))))
    return ref


def check(name, a, b):
    ref = eager(name, a, b)
    try:
        out = run_binary(name, a, b)
    except FusionDefinitionError as e:
        assert name in str(e)
        return False
    except RuntimeError as e:  # e.g. integer division by a False operand: eager fails too
        assert ref is None, f"{name} failed where eager did not: {e}"
        return False
    assert ref is not None, f"{name} accepted operands eager rejects"
    assert out.dtype == ref.dtype, f"{name}: {out.dtype} != eager {ref.dtype}"
    torch.testing.assert_close(out, ref, equal_nan=True, atol=1e-3, rtol=1e-2)
    return True


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("name", BINARY)
def test_mixed_tensor_dtypes(name, pair):
    a, b = sample(pair[0], (3, 4), 0), sample(pair[1], (3, 4), 1)
    check(name, a, b)
    check(name, b, a)


@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
@pytest.mark.parametrize("dtype", [D.Half, D.BFloat16, D.Float, D.Int32, D.Int, D.Bool],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "eq", "lt",
                                  "bitwise_and", "remainder", "atan2"])
def test_tensor_with_python_scalar(name, dtype, scalar):
    check(name, sample(dtype, (5,), 2), scalar)


@pytest.mark.parametrize("dtype", [D.Half, D.Float, D.Int32])
def test_zero_dim_tensor_does_not_promote_dimensioned_tensor(dtype):
    a = sample(dtype, (4,), 3)
    b = torch.tensor(2.5, dtype=torch.float64)
    assert check("mul", a, b)


def test_fusion_scalar_input_promotes_as_python_scalar():
    x = sample(D.Half, (4,), 4)
    f = Fusion()
    with f:
        t = B.define_tensor([-1], D.Half)
        s = B.symbolic_scalar(D.Double)
        f.add_input(s)
        i = B.symbolic_scalar(D.Int)
        f.add_input(i)
        f.add_output(B.elementwise("mul", t, s))
        f.add_output(B.elementwise("add", B.cast(t, D.Int32), i))
    h, n = evaluate(f, [x, 0.3, 7])
    assert h.dtype == torch.float16 and torch.equal(h, x * 0.3)
    assert n.dtype == torch.int32 and torch.equal(n, x.to(torch.int32) + 7)


@pytest.mark.parametrize("dtypes", list(itertools.product([D.Half, D.Int32, D.Bool], repeat=2)),
                         ids=lambda p: f"{p[0].name}-{p[1].name}")
def test_where_promotes_branches_only(dtypes):
    cond = sample(D.Bool, (4,), 5)
    a, b = sample(dtypes[0], (4,), 6), sample(dtypes[1], (4,), 7)
    f = Fusion()
    with f:
        tc, ta, tb = (B.define_tensor([-1], DataType.from_torch(v.dtype)) for v in (cond, a, b))
        f.add_output(B.elementwise("where", tc, ta, tb))
    (out,) = evaluate(f, [cond, a, b])
    ref = torch.where(cond, a, b)
    assert out.dtype == ref.dtype and torch.equal(out, ref)


def test_half_chain_rounds_like_eager():
    x = torch.randn(1000, dtype=torch.float16, generator=torch.Generator().manual_seed(8))
    f = Fusion()
    with f:
        t = B.define_tensor([-1], D.Half)
        y = B.elementwise("mul", B.elementwise("add", t, 0.1), 3.3)
        f.add_output(B.elementwise("gelu", B.elementwise("erf", y)))
    (out,) = evaluate(f, [x])
    ref = torch.nn.functional.gelu(torch.erf((x + 0.1) * 3.3))
    assert out.dtype == torch.float16 and torch.equal(out, ref)


def _oracle(operands, promotion):
    from torch._prims_common import elementwise_dtypes
    stand_ins = [o.stand_in() for o in operands]
    return elementwise_dtypes(*stand_ins, type_promotion_kind=promotion.torch_kind)[1]


def test_result_type_is_elementwise_dtypes_for_every_combination():
    """dtypes.result_type evaluates eager's n-ary rule itself (elementwise_dtypes imports sympy,
    0.6 s on a process's first lowering); every operand combination up to three operands, each
    dtype and kind (tensor, 0-dim, scalar), every promotion kind, gives the same dtype."""
    from pyfuser.ir.dtypes import Operand, Promotion, result_type
    kinds = (Operand.TENSOR, Operand.ZERO_DIM, Operand.SCALAR)
    ops = [Operand(d, k) for d in DataType for k in kinds]
    promos = [p for p in Promotion if p is not Promotion.NONE]
    checked = 0
    for n in (1, 2, 3):
        for combo in itertools.combinations_with_replacement(range(len(ops)), n):
            operands = [ops[i] for i in combo]
            if n == 3 and combo[0] % 5:        # triples: a fifth of them (about 2,000)
                continue
            for p in promos:
                try:
                    want = DataType.from_torch(_oracle(operands, p))
                except ValueError:             # complex32 (no DataType): both must refuse
                    with pytest.raises(ValueError):
                        result_type(*operands, promotion=p)
                    continue
                assert result_type(*operands, promotion=p) == want, (operands, p)
                checked += 1
    assert checked > 10000
