"""Between Python values and `prim::Constant` attributes.

A constant's attribute kind alone is ambiguous in the text (`value=1` is an int or a bool,
`value="cuda:0"` a str or a Device), so the runtime value is decided by the attribute *and*
the output's declared type: `constant_value(node)`. `attr_for_value` is the reverse, used by
`Graph.insert_constant`. Devices are kept as strings in attributes, dtypes as their int code.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .types import (DTYPE_TO_CODE, BoolType, ClassType, DeviceType, EnumType, FloatType,
                    IntType, ListType, OptionalType, TensorType, TupleType, enum_member)


def attr_for_value(v: Any) -> Optional[tuple]:
    """(kind, value) of the `value` attribute for a Python constant; None for None."""
    if v is None:
        return None
    if isinstance(v, bool):
        return ("i", int(v))
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", v)
    if isinstance(v, complex):
        return ("c", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, torch.device):
        return ("s", str(v))
    if isinstance(v, torch.dtype):
        return ("i", DTYPE_TO_CODE[v])
    if isinstance(v, torch.Tensor):
        return ("t", v)
    if isinstance(v, list) and v and all(type(e) is int for e in v):
        return ("is", list(v))
    if isinstance(v, list) and v and all(type(e) is float for e in v):
        return ("fs", list(v))
    if isinstance(v, list) and v and all(type(e) is str for e in v):
        return ("ss", list(v))
    return ("ival", v)


def _convert(value: Any, type_, map_device: Callable) -> Any:
    """Coerce a parsed literal to what its declared type says."""
    if isinstance(type_, OptionalType):
        return None if value is None else _convert(value, type_.elem, map_device)
    if isinstance(type_, BoolType) and isinstance(value, (int, bool)):
        return bool(value)
    if isinstance(type_, FloatType) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(type_, IntType) and isinstance(value, bool):
        return int(value)
    if isinstance(type_, DeviceType) and isinstance(value, (str, torch.device)):
        return map_device(torch.device(value))
    if isinstance(type_, ListType) and isinstance(value, (list, tuple)):
        return [_convert(e, type_.elem, map_device) for e in value]
    if isinstance(type_, TupleType) and isinstance(value, (list, tuple)):
        if len(type_.elems) == len(value):
            return tuple(_convert(e, t, map_device) for e, t in zip(value, type_.elems))
        return tuple(value)
    if isinstance(type_, TensorType) and isinstance(value, torch.Tensor):
        return tensor_for_type(value, type_, map_device)
    if isinstance(type_, EnumType) and isinstance(value, ClassType):
        member = enum_member(value.name)
        if member is None:
            raise ValueError(f"enum value {value.name} is unknown in this process (its class "
                             "is registered with torch when scripted code uses it)")
        return member
    return value


def tensor_for_type(t: torch.Tensor, type_: TensorType, map_device: Callable) -> torch.Tensor:
    """Give a literal tensor the dtype/shape/device its declared type asks for."""
    if type_.dtype is not None and t.dtype != type_.dtype:
        t = t.to(type_.dtype)
    if type_.sizes is not None and None not in type_.sizes and t.numel() == _numel(type_.sizes):
        t = t.reshape(type_.sizes)
    dev = map_device(torch.device(type_.device)) if type_.device else map_device(t.device)
    return t.to(dev)


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def constant_value(node, map_device: Callable = lambda d: d) -> Any:
    """The runtime value of a `prim::Constant` node (see module docstring)."""
    out_type = node.output().type if node.outputs else None
    if node.value_object is not None:
        return node.value_object
    if "value" not in node.attributes:
        return None
    kind, value = node.attributes["value"]
    if kind in ("t", "ts") and value is None:
        raise ValueError("the tensor's contents were not printed (`<Tensor>`); build the graph "
                         "from the torch object to keep them")
    if kind == "g":
        raise ValueError("a graph constant cannot be evaluated")
    return _convert(value, out_type, map_device)
