"""Data types of the Fusion IR and PyTorch's type promotion.

Invariants:
- Every DataType maps one-to-one to a torch.dtype; `DataType.from_torch` and `.torch` invert each other.
- Promotion follows PyTorch's n-ary elementwise rule exactly (tests compare every combination
  with `torch._prims_common.elementwise_dtypes`), so pyfuser's result dtypes follow eager,
  including the rules for 0-dim tensors and Python scalars ("wrapped numbers"), which only take
  part when no dimensioned tensor of the same category does.
- Two rules for scalars (`result_type(..., scalars=)`): "eager" (TorchScript graphs) gives a
  scalar only its category, as eager does with a Python number (a float scalar that wins counts
  as the default dtype, float32); "nvfuser" (FusionDefinition) keeps the scalar's own dtype, as
  nvFuser does (a Double constant that wins gives float64, an Int32 one int32). Both agree
  whenever a tensor operand's category is at least the scalars' (docs/nvfuser_frontend.md).
"""
from __future__ import annotations

import enum

import torch


class DataType(enum.Enum):
    # value: (torch dtype, CUDA storage type, short name used in printed IR, bytes)
    Bool = (torch.bool, "bool", "b", 1)
    Byte = (torch.uint8, "uint8_t", "i", 1)
    Char = (torch.int8, "int8_t", "i", 1)
    Short = (torch.int16, "int16_t", "i", 2)
    Int32 = (torch.int32, "int", "i", 4)
    Int = (torch.int64, "int64_t", "i", 8)
    Half = (torch.float16, "__half", "f", 2)
    BFloat16 = (torch.bfloat16, "__nv_bfloat16", "f", 2)
    Float = (torch.float32, "float", "f", 4)
    Double = (torch.float64, "double", "d", 8)
    ComplexFloat = (torch.complex64, "cuFloatComplex", "c", 8)
    ComplexDouble = (torch.complex128, "cuDoubleComplex", "c", 16)

    @property
    def torch(self) -> torch.dtype:
        return self._value_[0]      # not `value`: enum's property costs a call (a hot path)

    @property
    def cuda_type(self) -> str:
        return self.value[1]

    @property
    def short(self) -> str:
        return self.value[2]

    @property
    def itemsize(self) -> int:
        return self.value[3]

    @property
    def is_floating(self) -> bool:
        return self.torch.is_floating_point

    @property
    def is_complex(self) -> bool:
        return self.torch.is_complex

    @property
    def is_bool(self) -> bool:
        return self is DataType.Bool

    @property
    def is_integral(self) -> bool:
        """Integer types, not counting bool."""
        return not (self.is_floating or self.is_complex or self.is_bool)

    @property
    def is_reduced_float(self) -> bool:
        """Half and BFloat16: stored narrow, computed in float (as eager's opmath does)."""
        return self in (DataType.Half, DataType.BFloat16)

    @property
    def compute(self) -> "DataType":
        """The type arithmetic on values of this type is carried out in."""
        return DataType.Float if self.is_reduced_float else self

    @staticmethod
    def from_torch(dtype: torch.dtype) -> "DataType":
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise ValueError(f"pyfuser has no DataType for torch dtype {dtype}") from None

    @staticmethod
    def from_python(value) -> "DataType":
        """The dtype PyTorch gives a Python scalar of this kind when it stands alone."""
        if isinstance(value, bool):
            return DataType.Bool
        if isinstance(value, int):
            return DataType.Int
        if isinstance(value, float):
            return DataType.Double
        if isinstance(value, complex):
            return DataType.ComplexDouble
        raise TypeError(f"not a scalar: {value!r}")

    def __repr__(self) -> str:
        return f"DataType.{self.name}"


_FROM_TORCH = {d.torch: d for d in DataType}

# Aliases nvFuser users write.
DataType.Int64 = DataType.Int  # type: ignore[attr-defined]
DataType.Float32 = DataType.Float  # type: ignore[attr-defined]
DataType.Float64 = DataType.Double  # type: ignore[attr-defined]
DataType.Float16 = DataType.Half  # type: ignore[attr-defined]
# nvFuser's "no dtype" (e.g. `fd.ops.sum(t, axes, keepdim, dtype=DataType.Null)`): None here.
DataType.Null = None  # type: ignore[attr-defined]


class Operand:
    """What promotion needs to know of one operand: its dtype and whether it is a tensor with
    dimensions (rank > 0), a 0-dim tensor, or a scalar (a Python number / fusion scalar)."""

    __slots__ = ("dtype", "kind")
    TENSOR, ZERO_DIM, SCALAR = "tensor", "zero_dim", "scalar"

    def __init__(self, dtype: DataType, kind: str):
        self.dtype, self.kind = dtype, kind

    def stand_in(self):
        if self.kind == Operand.TENSOR:
            return torch.empty((1,), dtype=self.dtype.torch)
        if self.kind == Operand.ZERO_DIM:
            return torch.empty((), dtype=self.dtype.torch)
        # A fusion scalar behaves as a Python number of its category.
        if self.dtype.is_bool:
            return True
        if self.dtype.is_complex:
            return 1j
        if self.dtype.is_floating:
            return 1.5
        return 1


class Promotion(enum.Enum):
    """PyTorch's elementwise type-promotion kinds (the op table names one per op)."""
    DEFAULT = "default"            # common dtype of the operands
    NO_OPMATH = "no_opmath"        # like DEFAULT (computation dtype is not widened)
    INT_TO_FLOAT = "int_to_float"  # integers and bool become the default float (div, erf, sigmoid...)
    ALWAYS_BOOL = "always_bool"    # comparisons, logical ops
    COMPLEX_TO_FLOAT = "complex_to_float"  # abs of complex
    BOOL_TO_LONG = "bool_to_long"  # sum of bools
    NONE = "none"                  # the op fixes its own output dtype (cast, where's condition...)

    @property
    def torch_kind(self):
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K
        return getattr(K, self.name)


SCALAR_RULES = ("eager", "nvfuser")


def result_type(*operands: Operand, promotion: Promotion = Promotion.DEFAULT,
                scalars: str = "eager") -> DataType:
    """The dtype an elementwise op over `operands` gives under `promotion`.

    scalars="eager": eager PyTorch's n-ary rule (what `torch._prims_common.elementwise_dtypes`
    computes; tests/cpu/test_ir_promotion.py checks every combination against it), so tensors,
    0-dim tensors and Python scalars rank exactly as in eager. It is evaluated here, not by
    calling that function, which imports sympy (0.6 s on a first call).
    scalars="nvfuser": operands of one dtype give that dtype; otherwise PyTorch's ranking of
    dimensioned tensors, 0-dim tensors and scalars, with each scalar counting as its own dtype
    (half/bfloat16 scalars as the default dtype). The promotion kind then applies as in eager.
    """
    assert operands, "result_type needs at least one operand"
    assert promotion is not Promotion.NONE
    if scalars == "nvfuser":
        common = _nvfuser_common_dtype(operands)
    else:
        assert scalars == "eager", scalars
        common = _eager_common_dtype(operands)
    return DataType.from_torch(_apply_kind(common, promotion))


def _category(dt: "torch.dtype") -> int:
    """0 bool, 1 integer, 2 floating point, 3 complex."""
    if dt.is_complex:
        return 3
    if dt.is_floating_point:
        return 2
    return 0 if dt is torch.bool else 1


def _as_complex(dt: "torch.dtype") -> "torch.dtype":
    return {torch.float16: torch.complex32, torch.bfloat16: torch.complex64,
            torch.float32: torch.complex64, torch.float64: torch.complex128}.get(dt, dt)


def _eager_common_dtype(operands) -> "torch.dtype":
    """Eager's result dtype before the promotion kind: the highest category of any operand
    (scalars count by category only); within it, the highest dtype of the dimensioned tensors
    of that category, else of the 0-dim ones, else the category's default dtype. For complex,
    floating-point tensors take part as their complex counterparts."""
    top = max(_category(o.dtype.torch) for o in operands)
    if top == 0:
        return torch.bool
    dim = zero = None
    for o in operands:
        if o.kind == Operand.SCALAR:
            continue
        dt = o.dtype.torch
        cat = _category(dt)
        if cat != top and not (top == 3 and cat == 2):
            continue
        if top == 3:
            dt = _as_complex(dt)
        if o.kind == Operand.TENSOR:
            dim = _promote(dim, dt)
        else:
            zero = _promote(zero, dt)
    found = dim if dim is not None else zero
    if found is not None:
        return found
    if top == 1:
        return torch.int64
    default = torch.get_default_dtype()
    return default if top == 2 else _as_complex(default)


def _apply_kind(dt: "torch.dtype", promotion: Promotion) -> "torch.dtype":
    """The result dtype of promotion kind `promotion` for common dtype `dt`."""
    if promotion is Promotion.INT_TO_FLOAT:
        return torch.get_default_dtype() if _category(dt) <= 1 else dt
    if promotion is Promotion.COMPLEX_TO_FLOAT and dt.is_complex:
        return {torch.complex32: torch.float16, torch.complex64: torch.float32,
                torch.complex128: torch.float64}[dt]
    if promotion is Promotion.BOOL_TO_LONG and dt is torch.bool:
        return torch.int64
    if promotion is Promotion.ALWAYS_BOOL:
        return torch.bool
    return dt


def _promote(a, b):
    return b if a is None else (a if b is None else torch.promote_types(a, b))


def _combine_categories(higher, lower):
    """PyTorch's rule for letting a lower-priority group (0-dim, then scalars) raise the type."""
    if higher is None:
        return lower
    if lower is None or higher.is_complex:
        return higher
    if lower.is_complex:
        return _to_complex(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher is torch.bool or lower.is_floating_point:
        return _promote(higher, lower)
    return higher


def _to_complex(dt):
    return {torch.float64: torch.complex128}.get(dt, torch.complex64)


def _nvfuser_common_dtype(operands) -> "torch.dtype":
    if len({o.dtype for o in operands}) == 1:
        return operands[0].dtype.torch
    dim = zero = wrapped = None
    for o in operands:
        if o.kind == Operand.TENSOR:
            dim = _promote(dim, o.dtype.torch)
        elif o.kind == Operand.ZERO_DIM:
            zero = _promote(zero, o.dtype.torch)
        else:
            t = torch.get_default_dtype() if o.dtype.is_reduced_float else o.dtype.torch
            wrapped = _promote(wrapped, t)
    return _combine_categories(dim, _combine_categories(zero, wrapped))
