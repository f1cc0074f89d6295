"""Lowerings of elementwise aten ops (arithmetic, activations, comparisons, casts).

Every handler receives the node's arguments already lowered: TensorViews and symbolic Scalars for
values computed or passed at run time, Python values for constants. Handlers only call the
builder; the op table decides dtypes, so promotion is PyTorch's.
"""
from __future__ import annotations

import torch

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.dtypes import DataType, Operand, result_type
from ...ir.ops import OPS
from ...ir.tensor import TensorView
from ..torchscript.types import CODE_TO_DTYPE, DTYPE_TO_NAME
from .registry import POINTWISE, lowers
from .scalar_operands import binary

ew = B.elementwise
_TS_CONTIGUOUS_FORMAT = 0          # c10::MemoryFormat::Contiguous, as a TorchScript constant


def _dtype(code) -> DataType:
    """A dtype argument as TorchScript gives it (ScalarType's int code) or as an aten call in an
    FX graph does (a torch.dtype)."""
    if isinstance(code, DataType):
        return code
    if isinstance(code, torch.dtype):
        try:
            return DataType.from_torch(code)
        except ValueError:
            raise UnsupportedOpError(f"dtype {code} is not supported") from None
    try:
        return DataType.from_torch(CODE_TO_DTYPE[code])
    except (KeyError, ValueError):
        raise UnsupportedOpError(f"dtype code {code!r} is not supported") from None


def _is_one(x) -> bool:
    return not isinstance(x, (TensorView, Scalar)) and x == 1


def _kind_of(x) -> str:
    """'bool', 'int' or 'float' for a lowered operand (TensorView, Scalar, Python value)."""
    if isinstance(x, (TensorView, Scalar)):
        dt = x.dtype
        return "bool" if dt.is_bool else ("float" if dt.is_floating or dt.is_complex else "int")
    if isinstance(x, bool):
        return "bool"
    return "int" if isinstance(x, int) else "float"


def _scaled(self_, other, alpha):
    """`other * alpha` for add/sub/rsub. In eager alpha takes no part in type promotion: with
    bool operands the result stays bool (so a non-unit alpha is left to eager), and integral
    operands with a floating alpha raise in eager (left to eager too)."""
    if _is_one(alpha):
        return other
    kinds = {_kind_of(self_), _kind_of(other)}
    if kinds == {"bool"}:
        raise UnsupportedOpError("alpha other than 1 on bool operands (left to eager)")
    if "float" not in kinds and _kind_of(alpha) == "float":
        raise UnsupportedOpError("For integral input tensors, argument alpha must not be a "
                                 "floating point number (eager raises)")
    # alpha takes no part in promotion: scale `other` in the dtype of `self op other` (an int
    # tensor times 0.5 must not promote a bfloat16 sum to float32)
    common = _promoted(self_, other)
    if isinstance(other, (TensorView, Scalar)) and other.dtype != common:
        other = B.cast(other, common)
    return ew("mul", other, alpha)


def _promoted(*xs) -> DataType:
    """Eager's result dtype of a binary op over lowered operands (promotion only)."""
    ops = [B._operand(x) if isinstance(x, (TensorView, Scalar)) else
           Operand(DataType.from_python(x), Operand.SCALAR) for x in xs]
    return result_type(*ops)


def _arith(op: str, a, b):
    """add / sub / mul / div as eager computes them, also with a 0-dim operand it reads as a
    scalar (scalar_operands.py)."""
    if isinstance(a, TensorView) or isinstance(b, TensorView):
        return binary(op, a, b, _promoted(a, b))
    return ew(op, a, b)


@lowers("aten::add", n_args=(2, 3))
def _add(a, b, alpha=1):
    return _arith("add", a, b) if _is_one(alpha) else ew("add", a, _scaled(a, b, alpha))


@lowers("aten::sub", n_args=(2, 3))
def _sub(a, b, alpha=1):
    return _arith("sub", a, b) if _is_one(alpha) else ew("sub", a, _scaled(a, b, alpha))


@lowers("aten::mul", n_args=(2,))
def _mul(a, b):
    return _arith("mul", a, b)


@lowers("aten::rsub", n_args=(2, 3))
def _rsub(a, b, alpha=1):
    return ew("sub", b, _scaled(b, a, alpha))


@lowers("prim::add_optional", n_args=(2,))
def _add_optional(a, b):
    return a if b is None else ew("add", a, b)


@lowers("aten::div", "aten::true_divide", n_args=(2, 3), const_args=(2,))
def _div(a, b, rounding_mode=None):
    """div (true_divide: its alias without a rounding mode)."""
    names = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}
    if rounding_mode not in names:
        raise UnsupportedOpError(f"aten::div: rounding_mode {rounding_mode!r}")
    return _arith("div", a, b) if rounding_mode is None else ew(names[rounding_mode], a, b)


@lowers("aten::floor_divide", n_args=(2,))
def _floor_divide(a, b):
    """`floor_divide(a, b)`: eager's `div(a, b, rounding_mode="floor")`."""
    return ew("div_floor", a, b)


# Ops whose aten arguments map one to one onto op-table operands.
_DIRECT = {
    "remainder": "remainder", "fmod": "fmod", "neg": "neg",
    "abs": "abs", "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "log10": "log10",
    "log1p": "log1p", "expm1": "expm1", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin",
    "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
    "sigmoid": "sigmoid", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "relu": "relu",
    "silu": "silu", "mish": "mish", "hardswish": "hardswish", "hardsigmoid": "hardsigmoid",
    "frac": "frac",
    "sign": "sign", "sgn": "sign", "atan2": "atan2", "maximum": "maximum", "minimum": "minimum",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
    "logical_not": "logical_not", "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor", "bitwise_not": "bitwise_not", "__and__": "bitwise_and",
    "__or__": "bitwise_or", "__xor__": "bitwise_xor", "isnan": "isnan", "isinf": "isinf",
    "isfinite": "isfinite", "clamp_min": "clamp_min", "clamp_max": "clamp_max",
    "leaky_relu": "leaky_relu", "lerp": "lerp", "where": "where", "threshold": "threshold",
    "softplus": "softplus", "hardtanh": "hardtanh",
    "greater": "gt", "less": "lt", "greater_equal": "ge", "less_equal": "le",
    "not_equal": "ne",
}


def _direct(table_name):
    def handler(*args):
        return ew(table_name, *args)
    return handler


for _aten, _name in _DIRECT.items():
    lowers(f"aten::{_aten}", n_args=(OPS[_name].arity,))(_direct(_name))


def _rounding(table_name):
    def handler(x):
        """Eager rounds an integer tensor to itself, a copy (a bool one raises: left to it)."""
        if isinstance(x, TensorView) and x.dtype.is_integral:
            return B.set_(x)
        return ew(table_name, x)
    return handler


for _name in ("floor", "ceil", "round", "trunc"):
    lowers(f"aten::{_name}", n_args=(1,))(_rounding(_name))


@lowers("aten::pow", n_args=(2,))
def _pow(base, exp):
    """Eager raises "Integers to negative integer powers are not allowed" for an integral
    tensor base and a negative integral *scalar* exponent (tensor exponents give 0 instead):
    a negative constant exponent, or a run-time int whose sign only eager sees, stays eager."""
    if isinstance(base, TensorView) and not base.dtype.is_floating and not isinstance(exp, TensorView):
        if isinstance(exp, Scalar) and not exp.dtype.is_floating:
            raise UnsupportedOpError("aten::pow: integral tensor to a run-time integer power "
                                     "(eager raises when it is negative)")
        if isinstance(exp, int) and exp < 0:
            raise UnsupportedOpError("aten::pow: integers to negative integer powers are not "
                                     "allowed (eager raises)")
    special = _pow_special(base, exp)
    return special if special is not None else ew("pow", base, exp)


def _pow_special(base, exp):
    """What eager computes for a floating tensor to a constant power it special-cases (its CUDA
    kernel, and the CPU's for these): x * x, x * x * x, 1 / (x * x) with each product rounded to
    the tensor's dtype, sqrt, rsqrt, reciprocal; None otherwise."""
    if not (isinstance(base, TensorView) and base.dtype.is_floating) or \
            isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return None
    if exp == 2:
        return ew("mul", base, base)
    if exp == 3:
        return ew("mul", ew("mul", base, base), base)
    if exp == -2:
        return ew("reciprocal", ew("mul", base, base))
    named = {0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}.get(exp)
    return ew(named, base) if named else None


@lowers("aten::relu6", n_args=(1,))
def _relu6(x):
    return ew("hardtanh", x, 0.0, 6.0)


@lowers("aten::gelu", n_args=(1, 2), const_args=(1,))
def _gelu(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(f"aten::gelu: approximate={approximate!r}")
    return ew("gelu" if approximate == "none" else "gelu_tanh", x)


@lowers("aten::clamp", n_args=(1, 2, 3))
def _clamp(x, lo=None, hi=None):
    if lo is None and hi is None:
        raise UnsupportedOpError("aten::clamp: at least one of min and max must be given")
    if hi is None:
        return ew("clamp_min", x, lo)
    if lo is None:
        return ew("clamp_max", x, hi)
    return ew("clamp", x, lo, hi)


@lowers("aten::addcmul", n_args=(3, 4))
def _addcmul(s, a, b, value=1):
    return ew("addcmul", s, a, b, value)


@lowers("aten::xlogy", n_args=(2,))
def _xlogy(x, y):
    """x * log(y), 0 where x == 0, NaN where y is NaN (eager's kernel: kl_div's); float32 /
    float64 tensors of one dtype (eager computes half / bfloat16 in their own dtype: left to
    eager)."""
    floats = (DataType.Float, DataType.Double)
    if isinstance(x, TensorView) and isinstance(y, TensorView) and x.dtype is not y.dtype:
        if x.dtype in floats and not (y.dtype.is_floating or y.dtype.is_complex):
            y = B.cast(y, x.dtype)          # a bool / integer operand promotes to the other's
        elif y.dtype in floats and not (x.dtype.is_floating or x.dtype.is_complex):
            x = B.cast(x, y.dtype)          # (autograd's xlogy(self != 0, other))
    if not (isinstance(x, TensorView) and isinstance(y, TensorView)) or x.dtype is not y.dtype \
            or x.dtype not in floats:
        raise UnsupportedOpError("xlogy of other than float32 / float64 tensors of one dtype "
                                 "(left to eager)")
    out = ew("where", ew("eq", x, 0.0), 0.0, ew("mul", x, ew("log", y)))
    return ew("where", ew("isnan", y), float("nan"), out)


@lowers("aten::nan_to_num", n_args=(1, 2, 3, 4), const_args=(1, 2, 3))
def _nan_to_num(x, nan=None, posinf=None, neginf=None):
    """NaN -> `nan` (0), +inf -> `posinf`, -inf -> `neginf` (the dtype's largest finite values
    where not given), each replacement cast to x's dtype as eager's kernel does; an integer or
    bool x is copied (eager's clone). Complex x is left to eager."""
    if not isinstance(x, TensorView) or x.dtype.is_complex:
        raise UnsupportedOpError("nan_to_num of a complex or non-tensor value (left to eager)")
    if not x.dtype.is_floating:
        return B.set_(x)
    info = torch.finfo(x.dtype.torch)
    pos = info.max if posinf is None else float(posinf)
    neg = info.min if neginf is None else float(neginf)
    out = ew("where", ew("eq", x, float("-inf")), neg, x)
    out = ew("where", ew("eq", x, float("inf")), pos, out)
    return ew("where", ew("isnan", x), 0.0 if nan is None else float(nan), out)


@lowers("aten::masked_fill", n_args=(3,))
def _masked_fill(x, mask, value):
    if isinstance(value, TensorView) and value.ndim != 0:
        raise UnsupportedOpError("aten::masked_fill: value must be a scalar or a 0-dim tensor")
    return ew("where", mask, B.cast(value, x.dtype), x)


# ---- casts ------------------------------------------------------------------------------------
def _to_dtype(x, dtype):
    return x if dtype is None else B.cast(x, _dtype(dtype))


@lowers("aten::_to_copy", "prims::convert_element_type", n_args=(1, 2, 3, 4, 5, 6, 7),
        const_args=(1, 2, 3, 4, 5, 6))
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    """A copy in `dtype` (prims.convert_element_type(x, dtype): the same, as AOTAutograd writes
    the casts of Dynamo's unspecialised float inputs)."""
    y = _to_dtype(x, dtype)
    return B.set_(y) if y is x else y


@lowers("aten::to", n_args=(2, 3, 4, 5, 6, 8), const_args=(1, 2, 3, 4, 5, 6, 7))
def _to(x, *args):
    """Every `aten::to` overload: by dtype, by device (+dtype), by dtype_layout, by other."""
    if args and isinstance(args[0], TensorView):          # to.other
        return B.cast(x, args[0].dtype)
    if len(args) == 7:                                    # to.dtype_layout
        return _to_dtype(x, args[0])
    if args and isinstance(args[0], str):                 # to.device(device, dtype, ...)
        return _to_dtype(x, args[1] if len(args) > 1 else None)
    return _to_dtype(x, args[0] if args else None)        # to.dtype(dtype, ...)


@lowers("aten::type_as", n_args=(2,))
def _type_as(x, other):
    return B.cast(x, other.dtype)


def check_inplace_cast(result_dtype, self_dtype) -> None:
    """Eager's rule for an in-place op: the result type must be castable to self's dtype."""
    if not torch.can_cast(result_dtype, self_dtype):
        raise RuntimeError(f"result type {DTYPE_TO_NAME.get(result_dtype, result_dtype)} can't be "
                           f"cast to the desired output type {DTYPE_TO_NAME.get(self_dtype, self_dtype)}")


@lowers("prim::inplace_cast", n_args=(2,))
def _inplace_cast(result, self_):
    """What the in-place pass leaves after `x.add_(y)` became `add(x, y)`: cast back to x's dtype."""
    try:
        check_inplace_cast(result.dtype.torch, self_.dtype.torch)
    except RuntimeError as e:
        raise UnsupportedOpError(f"in-place op: {e}") from None
    return B.cast(result, self_.dtype)


def _into_contiguous_format(memory_format) -> bool:
    return memory_format is torch.contiguous_format or \
        (type(memory_format) is int and memory_format == _TS_CONTIGUOUS_FORMAT)


@lowers("aten::clone", "aten::lift_fresh_copy", n_args=(1, 2), const_args=(1,))
def _copy(x, memory_format=None):
    """A copy; into torch.contiguous_format (TorchScript's constant 0) it is laid out row-major
    whatever x's layout, as eager's; other formats keep x's. `lift_fresh_copy` (a graph's copy
    of a constant tensor, `torch.tensor(0)` in a model) is such a copy."""
    return B.set_(x, contiguous=_into_contiguous_format(memory_format))


@lowers("aten::copy", n_args=(2, 3), const_args=(2,))
def _functional_copy(self_, src, non_blocking=False):
    """`aten.copy(self, src)`, AOTAutograd's functional form of `self.copy_(src)`: a new tensor
    of src's values in self's dtype (cast as `.to()` casts) and shape. A source that broadcasts
    (fewer axes, a size-1 axis where self has more, an expanded view: DeepSeek's rotary key
    copied into every head) is expanded to self's sizes and written out (eager materialises
    it too); a broadcast axis of self takes src's size-1 axis as it is."""
    if not isinstance(self_, TensorView) or not isinstance(src, TensorView):
        raise UnsupportedOpError("aten::copy of other than two tensors")
    if src.ndim > self_.ndim:
        raise UnsupportedOpError("aten::copy of a source of more axes (eager raises)")
    if src.ndim != self_.ndim or any(
            a.is_broadcast != b.is_broadcast or a.expanded_extent is not None
            for a, b in zip(src.logical, self_.logical)):
        src = _broadcast_to(src, self_)
        return B.set_(_to_dtype(src, self_.dtype))
    y = _to_dtype(src, self_.dtype)
    return B.set_(y) if y is src else y


def _broadcast_to(src: TensorView, like: TensorView) -> TensorView:
    """src broadcast to like's sizes (leading axes added; its size-1 axes expanded)."""
    if src.ndim < like.ndim:
        src = B.broadcast(src, [True] * (like.ndim - src.ndim) + [False] * src.ndim)
    sizes = [-1 if not a.is_broadcast or b.is_broadcast else b.full_extent
             for a, b in zip(src.logical, like.logical)]
    return B.expand(src, sizes)


@lowers("aten::contiguous", n_args=(1, 2), const_args=(1,))
def _contiguous(x, memory_format=None):
    """`x.contiguous()`: a row-major copy, or x itself where x already is row-major (eager
    returns its input then: the segmenter runs it on the host as x, segment/host.py)."""
    row_major = memory_format is None or _into_contiguous_format(memory_format)
    return B.set_(x, contiguous=row_major, may_alias=row_major)


def _dropout_class(node) -> str:
    """Dropout is the identity (eager returns its input) in eval mode or with p = 0; in
    training it draws random numbers: not grouped (a group it joined could not lower)."""
    from .lower import constant_value, is_constant
    p, train = node.inputs[1], node.inputs[2]
    if is_constant(train) and (constant_value(train) in (False, 0) or
                               (is_constant(p) and constant_value(p) == 0)):
        return POINTWISE
    return "random"


@lowers("aten::dropout", "aten::feature_dropout", n_args=(3,), const_args=(1, 2),
        classify=_dropout_class)
def _dropout(x, p, train):
    if train and p != 0:
        raise UnsupportedOpError("dropout in training mode is random; left to eager")
    return x
