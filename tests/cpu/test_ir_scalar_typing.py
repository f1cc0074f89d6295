"""The two scalar typing rules of the builder: eager's (TorchScript graphs) and nvFuser's
(FusionDefinition), side by side, and the evaluator computing in the dtype the rule chose."""
import pytest
import torch

from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import Operand, result_type
from pyfuser.ir.evaluator import evaluate

D, S, T, Z = DataType, Operand.SCALAR, Operand.TENSOR, Operand.ZERO_DIM

# (operands, eager's dtype, nvFuser's dtype)
CASES = [
    ([(D.Double, S), (D.Double, S)], D.Float, D.Double),
    ([(D.Int32, S), (D.Int32, S)], D.Int, D.Int32),
    ([(D.Int, T), (D.Double, S)], D.Float, D.Double),
    ([(D.Bool, T), (D.Double, S)], D.Float, D.Double),
    ([(D.Int, T), (D.ComplexDouble, S)], D.ComplexFloat, D.ComplexDouble),
    ([(D.Float, T), (D.Double, S)], D.Float, D.Float),
    ([(D.Half, T), (D.Double, S)], D.Half, D.Half),
    ([(D.ComplexFloat, T), (D.ComplexDouble, S)], D.ComplexFloat, D.ComplexFloat),
    ([(D.Int32, T), (D.Int, S)], D.Int32, D.Int32),
    ([(D.Float, Z), (D.Double, T)], D.Double, D.Double),
]


@pytest.mark.parametrize("ops,eager,nvf", CASES, ids=lambda c: str(c))
def test_result_type_rules(ops, eager, nvf):
    operands = [Operand(d, k) for d, k in ops]
    assert result_type(*operands) is eager
    assert result_type(*operands, scalars="nvfuser") is nvf
    # eager's rule is torch's own
    stand = [torch.empty((1,) if k == T else (), dtype=d.torch) if k != S else
             {D.Double: 1.5, D.Int32: 1, D.Int: 1, D.ComplexDouble: 1j}[d] for d, k in ops]
    if len(ops) == 2 and any(k != S for _, k in ops):
        assert torch.result_type(*stand) is eager.torch


def _where_of_constants(rule, value, dtype=None):
    f = Fusion()
    f.scalar_typing = rule
    with f:
        c = B.define_tensor([-1], DataType.Bool)
        f.add_output(B.elementwise("where", c, B.constant(value, dtype), B.constant(-value, dtype)))
    return f


def test_where_of_double_constants_computes_in_float64_under_nvfuser_rule():
    cond = torch.tensor([True, False, True])
    (out,) = evaluate(_where_of_constants("nvfuser", 0.1), [cond])
    assert out.dtype == torch.float64
    assert torch.equal(out, torch.tensor([0.1, -0.1, 0.1], dtype=torch.float64))
    (eager,) = evaluate(_where_of_constants("eager", 0.1), [cond])
    assert torch.equal(eager, torch.where(cond, 0.1, -0.1))     # float32, as eager
    (i32,) = evaluate(_where_of_constants("nvfuser", 3, DataType.Int32), [cond])
    assert i32.dtype == torch.int32 and i32.tolist() == [3, -3, 3]


def test_integer_tensor_times_double_constant():
    x = torch.tensor([1, 2, 3])
    for rule, want in (("eager", x * 0.1), ("nvfuser", x.double() * 0.1)):
        f = Fusion()
        f.scalar_typing = rule
        with f:
            t = B.define_tensor([-1], DataType.Int)
            f.add_output(B.elementwise("mul", t, 0.1))
        (out,) = evaluate(f, [x])
        assert out.dtype == want.dtype and torch.equal(out, want)


def test_scalar_arithmetic_on_the_host_keeps_double_precision():
    f = Fusion()
    f.scalar_typing = "nvfuser"
    with f:
        a, b = B.symbolic_scalar(DataType.Double), B.symbolic_scalar(DataType.Double)
        f.add_input(a)
        f.add_input(b)
        s = B.elementwise("add", a, b)
        assert s.dtype is DataType.Double
        t = B.full([2], 0.0, DataType.Double)
        f.add_output(B.elementwise("add", t, s))
    (out,) = evaluate(f, [0.1, 0.2])
    assert out.tolist() == [0.1 + 0.2] * 2
