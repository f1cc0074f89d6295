"""What a call plan's key fixes of each value (plan.py's levels), and the node facts that decide it.

Levels, from most to least fixed: VALUE (the value itself), FACTS (a tensor's dtype, sizes,
strides, data_ptr % 16 and device), TYPE (only the Python type) and DYN. `input_level` gives a
graph input's level from its declared type; `written` tells whether some node may write a value
in place (which lowers it); `nondeterministic` and `shape_determined` tell whether an op's
outputs are fixed when its inputs are (plan_writer.Writer.out_level uses them). Pure functions of
the TorchScript graph and the recording run's chosen overloads: nothing here emits code.
"""
from __future__ import annotations

import torch

from .ops import overload
from .passes.aliasing import node_effects
from .types import (BoolType, DeviceType, FloatType, IntType, ListType, NoneType, StringType,
                    TensorType)

VALUE, FACTS, TYPE, DYN = 3, 2, 1, 0
_STABLE_TYPES = (TensorType, IntType, FloatType, BoolType, StringType, DeviceType, NoneType)
_META_READS = {"aten::size", "aten::dim", "aten::numel", "aten::stride", "aten::len",
               "prim::dtype", "prim::device", "prim::shape", "prim::layout", "prim::is_cuda",
               "prim::requires_grad", "aten::is_contiguous", "aten::is_floating_point"}
_DATA_SCALARS = {"prim::NumToTensor", "aten::Int", "aten::IntImplicit", "aten::Float",
                 "aten::FloatImplicit", "aten::Bool", "aten::ScalarImplicit", "aten::item"}
_STRUCTURAL = {"prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack",
               "prim::TupleUnpack", "prim::TupleIndex"}


def input_level(t) -> int:
    """What a plan key fixes of a graph input of declared type `t`."""
    if isinstance(t, TensorType):
        return FACTS
    if isinstance(t, (IntType, BoolType, StringType, NoneType)):
        return VALUE
    if isinstance(t, ListType) and isinstance(t.elem, (IntType, BoolType, FloatType)):
        return VALUE
    return TYPE if _stable(t) else DYN


def _stable(t) -> bool:
    return isinstance(t, _STABLE_TYPES)


def _written(v) -> bool:
    """Some node may write `v` in place."""
    for u in v.uses:
        n = u.user
        if n.kind == "prim::Return":
            continue
        e = node_effects(n)
        if e.opaque or u.offset in e.writes:
            return True
    return False


def _nondeterministic(how) -> bool:
    if how is None or isinstance(how, str):
        return isinstance(how, str) and how not in ("python", "prim")
    tags = _tags(how)
    return torch.Tag.nondeterministic_seeded in tags


def _tags(schema):
    try:
        return overload("aten::" + schema.name.split("::", 1)[-1], schema).tags \
            if schema.name.startswith("aten::") else ()
    except Exception:  # noqa: BLE001
        return ()


def _shape_determined(node, how, writer) -> bool:
    """Whether a node with fixed inputs gives outputs whose facts the inputs fix."""
    if node.kind == "prim::add_optional" or node.kind == "prim::inplace_cast":
        return True
    if how is None or isinstance(how, str) or not node.kind.startswith("aten::"):
        return False
    tags = _tags(how)
    if torch.Tag.data_dependent_output in tags:
        return False
    if torch.Tag.dynamic_output_shape in tags:
        # aten::index with integer index tensors has a static shape
        return node.kind == "aten::index" and writer.rec.extra.get(node) is False
    # a view at an offset read from a tensor's data: its alignment is not fixed
    rets = how.returns
    if rets and rets[0].alias_info is not None and not rets[0].alias_info.is_write:
        return all(writer.lvl(v) == VALUE for v in node.inputs[1:]
                   if isinstance(v.type, TensorType))
    return True
