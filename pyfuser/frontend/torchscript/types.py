"""TorchScript value types, as the IR text declares them.

Each type is an immutable (hashable, comparable) dataclass whose `str()` is exactly the text
PyTorch's IR printer writes for it (`Float(2, 3, strides=[3, 1], requires_grad=0, device=cpu)`,
`int[]?`, `(Tensor, int)`, `Dict(str, Tensor)`, ...). The parser builds them; the printer and
runner only read them. Also holds the tables between TorchScript's integer codes for dtypes /
layouts / memory formats and torch objects (TorchScript passes those as plain ints).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch

# c10::ScalarType names in enum order (the integer code TorchScript uses for a dtype).
_SCALAR_TYPE_NAMES = [
    ("Byte", "uint8"), ("Char", "int8"), ("Short", "int16"), ("Int", "int32"), ("Long", "int64"),
    ("Half", "float16"), ("Float", "float32"), ("Double", "float64"), ("ComplexHalf", "complex32"),
    ("ComplexFloat", "complex64"), ("ComplexDouble", "complex128"), ("Bool", "bool"),
    ("QInt8", "qint8"), ("QUInt8", "quint8"), ("QInt32", "qint32"), ("BFloat16", "bfloat16"),
    ("QUInt4x2", "quint4x2"), ("QUInt2x4", "quint2x4"), ("Bits1x8", "bits1x8"),
    ("Bits2x4", "bits2x4"), ("Bits4x2", "bits4x2"), ("Bits8", "bits8"), ("Bits16", "bits16"),
    ("Float8_e5m2", "float8_e5m2"), ("Float8_e4m3fn", "float8_e4m3fn"),
    ("Float8_e5m2fnuz", "float8_e5m2fnuz"), ("Float8_e4m3fnuz", "float8_e4m3fnuz"),
    ("UInt16", "uint16"), ("UInt32", "uint32"), ("UInt64", "uint64"),
]
NAME_TO_DTYPE: dict[str, torch.dtype] = {}
DTYPE_TO_NAME: dict[torch.dtype, str] = {}
CODE_TO_DTYPE: dict[int, torch.dtype] = {}
DTYPE_TO_CODE: dict[torch.dtype, int] = {}
for _code, (_name, _attr) in enumerate(_SCALAR_TYPE_NAMES):
    _dt = getattr(torch, _attr, None)
    if isinstance(_dt, torch.dtype):
        NAME_TO_DTYPE[_name] = _dt
        DTYPE_TO_NAME[_dt] = _name
        CODE_TO_DTYPE[_code] = _dt
        DTYPE_TO_CODE[_dt] = _code

CODE_TO_LAYOUT = {0: torch.strided, 1: torch.sparse_coo}
CODE_TO_MEMORY_FORMAT = {0: torch.contiguous_format, 1: torch.preserve_format,
                         2: torch.channels_last, 3: torch.channels_last_3d}


class JitType:
    """Base of all types. Subclasses are frozen dataclasses with a PyTorch-identical __str__."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"


def _simple(name: str, text: str):
    cls = dataclass(frozen=True)(type(name, (JitType,), {"__str__": lambda self: text,
                                                         "__repr__": JitType.__repr__,
                                                         "__module__": __name__}))
    cls.__doc__ = f"The TorchScript type printed as `{text}`."
    return cls


IntType = _simple("IntType", "int")
FloatType = _simple("FloatType", "float")
BoolType = _simple("BoolType", "bool")
StringType = _simple("StringType", "str")
ComplexType = _simple("ComplexType", "complex")
DeviceType = _simple("DeviceType", "Device")
NoneType = _simple("NoneType", "NoneType")
NumberType = _simple("NumberType", "Scalar")
AnyType = _simple("AnyType", "Any")
FunctionType = _simple("FunctionType", "Function")
LayoutType = _simple("LayoutType", "Layout")
ScalarTypeType = _simple("ScalarTypeType", "ScalarType")
MemoryFormatType = _simple("MemoryFormatType", "MemoryFormat")
GeneratorType = _simple("GeneratorType", "Generator")
StorageType = _simple("StorageType", "Storage")
StreamType = _simple("StreamType", "Stream")
CapsuleType = _simple("CapsuleType", "Capsule")

# Bare words that name a type, for the parser ("number" is an alias PyTorch accepts for Scalar).
SIMPLE_TYPES: dict[str, JitType] = {
    "int": IntType(), "float": FloatType(), "bool": BoolType(), "str": StringType(),
    "complex": ComplexType(), "Device": DeviceType(), "NoneType": NoneType(), "None": NoneType(),
    "Scalar": NumberType(), "number": NumberType(), "Any": AnyType(), "Function": FunctionType(),
    "Layout": LayoutType(), "ScalarType": ScalarTypeType(), "MemoryFormat": MemoryFormatType(),
    "Generator": GeneratorType(), "Storage": StorageType(), "Stream": StreamType(),
    "Capsule": CapsuleType(),
}


def _dim(d: Optional[int]) -> str:
    return "*" if d is None else str(d)


@dataclass(frozen=True)
class TensorType(JitType):
    """A tensor; every field None means unknown. sizes/strides hold None for unknown dims."""
    dtype: Optional[torch.dtype] = None
    sizes: Optional[tuple] = None
    strides: Optional[tuple] = None
    device: Optional[str] = None
    requires_grad: Optional[bool] = None
    undefined: Optional[bool] = None

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "TensorType":
        return TensorType(t.dtype, tuple(t.shape), tuple(t.stride()), str(t.device),
                          bool(t.requires_grad))

    @property
    def rank(self) -> Optional[int]:
        return None if self.sizes is None else len(self.sizes)

    def is_complete(self) -> bool:
        """True when dtype and every size are known (enough to build a tensor)."""
        return self.dtype is not None and self.sizes is not None and None not in self.sizes

    def __str__(self) -> str:
        head = DTYPE_TO_NAME.get(self.dtype, "Tensor") if self.dtype is not None else "Tensor"
        extras = []
        if self.requires_grad is not None:
            extras.append(f"requires_grad={int(self.requires_grad)}")
        if self.device is not None:
            extras.append(f"device={self.device}")
        if self.sizes is not None:
            parts = [_dim(d) for d in self.sizes]
            st = self.strides
            if st is not None and len(st) == len(self.sizes) and st and None not in st:
                parts.append("strides=[" + ", ".join(str(s) for s in st) + "]")
            text = head + "(" + ", ".join(parts + extras) + ")"
        else:
            if self.dtype is not None:
                head += "Tensor"
            text = head + ("(" + ", ".join(extras) + ")" if extras else "")
        if self.undefined:
            text += "[Undefined]"
        return text


@dataclass(frozen=True)
class ListType(JitType):
    elem: JitType

    def __str__(self) -> str:
        return f"{self.elem}[]"


@dataclass(frozen=True)
class OptionalType(JitType):
    elem: JitType

    def __str__(self) -> str:
        return f"{self.elem}?"


@dataclass(frozen=True)
class TupleType(JitType):
    elems: tuple
    names: Optional[tuple] = None      # NamedTuple field names, when printed as NamedTuple(...)

    def __str__(self) -> str:
        if self.names is not None:
            fields = ", ".join(f"{n} : {t}" for n, t in zip(self.names, self.elems))
            return f"NamedTuple({fields})"
        return "(" + ", ".join(str(e) for e in self.elems) + ")"


@dataclass(frozen=True)
class DictType(JitType):
    key: JitType
    value: JitType

    def __str__(self) -> str:
        return f"Dict({self.key}, {self.value})"


@dataclass(frozen=True)
class UnionType(JitType):
    elems: tuple

    def __str__(self) -> str:
        return "Union(" + ", ".join(str(e) for e in self.elems) + ")"


@dataclass(frozen=True)
class ContainerType(JitType):
    """Future[T], RRef[T], Await[T] (printed with square brackets like PyTorch)."""
    name: str
    elem: JitType

    def __str__(self) -> str:
        return f"{self.name}[{self.elem}]"


@dataclass(frozen=True)
class EnumType(JitType):
    """A TorchScript enum, printed `Enum<__torch__.Color>`; `name` is its qualified name."""
    name: str

    def __str__(self) -> str:
        return f"Enum<{self.name}>"


@dataclass(frozen=True)
class ClassType(JitType):
    """A TorchScript class or module type such as `__torch__.M` (dotted qualified name)."""
    name: str

    def __str__(self) -> str:
        return self.name


def type_of_python_value(v) -> JitType:
    """The TorchScript type of a Python constant (used by Graph.insert_constant)."""
    if v is None:
        return NoneType()
    if isinstance(v, bool):
        return BoolType()
    if isinstance(v, int):
        return IntType()
    if isinstance(v, float):
        return FloatType()
    if isinstance(v, complex):
        return ComplexType()
    if isinstance(v, str):
        return StringType()
    if isinstance(v, torch.device):
        return DeviceType()
    if isinstance(v, torch.dtype):
        return IntType()
    if isinstance(v, torch.Tensor):
        return TensorType.from_tensor(v)
    if isinstance(v, enum.Enum):
        return EnumType(enum_class_name(type(v)))
    if isinstance(v, tuple):
        return TupleType(tuple(type_of_python_value(e) for e in v))
    if isinstance(v, list):
        elem = type_of_python_value(v[0]) if v else TensorType()
        if isinstance(elem, TensorType):
            elem = TensorType()
        return ListType(elem)
    raise TypeError(f"no TorchScript type for constant {v!r}")


def enum_class_name(cls) -> str:
    """TorchScript's qualified name of a Python enum class (`__torch__.mod.Color`)."""
    return torch._jit_internal._qualified_name(cls)


def enum_member(qualified: str):
    """The Python enum member `__torch__.mod.Color.RED` names; None when its class is not
    known to torch in this process (it is registered when scripted code uses it)."""
    cls_name, _, member = qualified.rpartition(".")
    try:
        cls = torch.jit._state._get_python_class(cls_name)
    except Exception:      # noqa: BLE001 - a private torch helper
        cls = None
    if cls is None or not isinstance(cls, type) or not issubclass(cls, enum.Enum):
        return None
    return cls.__members__.get(member)
