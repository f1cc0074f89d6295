"""Binary arithmetic with a 0-dim floating operand of another dtype, at eager's precision.

Type promotion is eager's either way (a 0-dim tensor does not promote a dimensioned tensor of
its category: bfloat16 [N] * float32 0-dim -> bfloat16; the op table's `result_type`). What
differs is the 0-dim operand's *value* where the result is half / bfloat16 (computed in float,
eager's opmath): the generic lowering casts every tensor operand to the result dtype first, as
eager does for a tensor operand, while eager's kernels read an operand that TensorIterator
calls a scalar at the computation precision, float:
- on CUDA, a 0-dim CPU tensor (`is_cpu_scalar`: Dynamo's unspecialised Python floats, float64
  CPU inputs that the graph converts to float32 before the op) in add, sub and mul, either
  operand (their `*_with_scalars` kernels read it as `opmath_t`), and in div as `other` (eager
  multiplies by its reciprocal there, which may differ from the quotient in the last bit of
  float: pyfuser divides, as it does by a Python number); a 0-dim CUDA tensor is cast;
- on the CPU, mul and div with the 0-dim tensor as `other` (their reduced-float paths read
  `original_scalar_value<opmath_t>`); add, sub, and a 0-dim `self`, cast it to the result
  dtype first.
`binary(op, a, b)` computes those cases as cast(op(float(a), float(b)), result): the same one
rounding eager's float computation and its store make. Elsewhere it is the op table's op.

Left as the table's op: an `alpha` other than 1 (add / sub), an unknown device, and other ops
(comparisons round the scalar on both devices, as the table does).
"""
from __future__ import annotations

from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .device import device_type, is_cpu_scalar

ew = B.elementwise
_CPU_OPMATH = ("mul", "div")          # the CPU kernels reading `other` at opmath precision


def _reads_as_scalar(op: str, position: int, t) -> bool:
    """Whether eager reads 0-dim operand t (position 0: self, 1: other) of `op` in float."""
    device = device_type()
    if device == "cuda":
        return is_cpu_scalar(t) and (op != "div" or position == 1)
    return device == "cpu" and op in _CPU_OPMATH and position == 1


def binary(op: str, a, b, result: DataType):
    """`op` (add, sub, mul, div) of lowered operands a, b whose promoted dtype is `result`."""
    if result.is_reduced_float and any(
            isinstance(t, TensorView) and t.ndim == 0 and t.dtype.is_floating and
            t.dtype is not result and _reads_as_scalar(op, i, t) for i, t in enumerate((a, b))):
        f = DataType.Float
        a, b = (B.cast(t, f) if isinstance(t, TensorView) else t for t in (a, b))
        return B.cast(ew(op, a, b), result)
    return ew(op, a, b)
