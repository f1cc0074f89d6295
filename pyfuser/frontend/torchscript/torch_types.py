"""TorchScript types read from torch's own type objects (`torch._C.Type`) into ours (types.py).

`from_torch_type(t) -> JitType` walks the type through its API (`kind()`, `scalarType()`,
`varyingSizes()`, `strides()`, `getElementType()`, `containedTypes()`, ...), never through
its printed text. Invariant: `str(from_torch_type(t))` is what PyTorch's graph printer writes
for `t`, except that a tensor whose `requires_grad` torch leaves unknown prints without it
(torch's Python API answers True for "unknown"; a type with nothing else known is taken as
unknown). NamedTuple field names come from the Python class torch registered for the type,
when there is one. Kinds this module does not know become a ClassType named as torch names
the type, so a graph with exotic types still converts (and runs, where the runner can).
"""
from __future__ import annotations

import torch

from .types import (SIMPLE_TYPES, AnyType, BoolType, ClassType, ComplexType, ContainerType,
                    DeviceType, DictType, EnumType, FloatType, FunctionType, IntType, JitType,
                    ListType, NAME_TO_DTYPE, NoneType, NumberType, OptionalType, StringType,
                    TensorType, TupleType, UnionType)

_SIMPLE_KINDS = {
    "IntType": IntType(), "SymIntType": IntType(), "FloatType": FloatType(),
    "SymFloatType": FloatType(), "BoolType": BoolType(), "SymBoolType": BoolType(),
    "StringType": StringType(), "ComplexType": ComplexType(), "DeviceObjType": DeviceType(),
    "NoneType": NoneType(), "NumberType": NumberType(), "AnyType": AnyType(),
    "FunctionType": FunctionType(), "LayoutType": SIMPLE_TYPES["Layout"],
    "ScalarTypeType": SIMPLE_TYPES["ScalarType"], "MemoryFormatType": SIMPLE_TYPES["MemoryFormat"],
    "GeneratorType": SIMPLE_TYPES["Generator"], "StorageType": SIMPLE_TYPES["Storage"],
    "StreamObjType": SIMPLE_TYPES["Stream"], "CapsuleType": SIMPLE_TYPES["Capsule"],
}
_CONTAINER_KINDS = {"FutureType": "Future", "RRefType": "RRef", "AwaitType": "Await"}


def from_torch_type(t) -> JitType:
    kind = t.kind()
    simple = _SIMPLE_KINDS.get(kind)
    if simple is not None:
        return simple
    if kind == "TensorType":
        return _tensor_type(t)
    if kind == "ListType":
        return ListType(from_torch_type(t.getElementType()))
    if kind == "OptionalType":
        return OptionalType(from_torch_type(t.getElementType()))
    if kind == "TupleType":
        elems = tuple(from_torch_type(e) for e in t.elements())
        return TupleType(elems, _named_tuple_fields(t, len(elems)))
    if kind == "DictType":
        return DictType(from_torch_type(t.getKeyType()), from_torch_type(t.getValueType()))
    if kind == "UnionType":
        return UnionType(tuple(from_torch_type(e) for e in t.containedTypes()))
    if kind in _CONTAINER_KINDS:
        (elem,) = t.containedTypes()
        return ContainerType(_CONTAINER_KINDS[kind], from_torch_type(elem))
    if kind == "EnumType":
        return EnumType(t.annotation_str)
    name = t.qualified_name() if hasattr(t, "qualified_name") else t.annotation_str
    return ClassType(name)


def _tensor_type(t) -> TensorType:
    name = t.scalarType()
    dtype = NAME_TO_DTYPE.get(name) if name is not None else None
    sizes = t.varyingSizes()
    sizes = None if sizes is None else tuple(sizes)
    strides = None
    if sizes is not None:
        st = t.strides()
        strides = tuple(st) if st is not None and len(st) == len(sizes) else None
    device = t.device()
    device = None if device is None else str(device)
    rg = bool(t.requires_grad())
    if rg and dtype is None and sizes is None and device is None:
        rg = None                      # torch answers True where it does not know
    undefined = t.undefined() or None
    return TensorType(dtype, sizes, strides, device, rg, undefined)


def _named_tuple_fields(t, n: int):
    """Field names of a NamedTuple type (from its registered Python class), else None."""
    qual = t.annotation_str
    if not qual.startswith("__torch__."):
        return None
    try:
        cls = torch.jit._state._get_python_class(qual)
    except Exception:      # noqa: BLE001 - a private torch helper; names are optional
        cls = None
    fields = getattr(cls, "_fields", None)
    return tuple(fields) if fields is not None and len(fields) == n else None


__all__ = ["from_torch_type"]
