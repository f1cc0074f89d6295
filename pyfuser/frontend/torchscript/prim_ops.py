"""Handlers of `prim::` nodes for the eager runner, as a dispatch table.

`PRIM_HANDLERS[kind](ctx, node, args) -> list of outputs`. `ctx` is the runner's RunContext
(it runs nested blocks and maps devices). Control flow follows TorchScript: `prim::If` runs
block 0 or 1; `prim::Loop(max_trips, cond, *carried)` runs its body while `i < max_trips and
cond`, the body getting (i, *carried) and returning (cond, *carried). Guards (`TypeCheck`,
`RequiresGradCheck`, `CudaFusionGuard`, ...) pass their inputs through and report success
when the runtime tensors fit (the runner works without autograd, so requires_grad checks
pass). A handler raising ValueError/TypeError/... is reported by the runner as RunnerError.
"""
from __future__ import annotations

import torch

from pyfuser.errors import RunnerError

from .constants import constant_value
from .types import (DTYPE_TO_CODE, BoolType, DictType, FloatType, IntType, ListType,
                    NoneType, NumberType, OptionalType, StringType, TensorType, TupleType)


def fits_type(v, t) -> bool:
    """Whether a runtime value matches a declared type (dtype/sizes/device for tensors)."""
    if isinstance(t, TensorType):
        if not isinstance(v, torch.Tensor):
            return False
        if t.dtype is not None and v.dtype != t.dtype:
            return False
        if t.sizes is not None:
            if v.dim() != len(t.sizes):
                return False
            if any(s is not None and s != d for s, d in zip(t.sizes, v.shape)):
                return False
        return True
    if isinstance(t, OptionalType):
        return v is None or fits_type(v, t.elem)
    if isinstance(t, BoolType):
        return isinstance(v, bool)
    if isinstance(t, IntType):
        return isinstance(v, int) and not isinstance(v, bool)
    if isinstance(t, FloatType):
        return isinstance(v, float)
    if isinstance(t, NumberType):
        return isinstance(v, (int, float, complex))
    if isinstance(t, StringType):
        return isinstance(v, str)
    if isinstance(t, NoneType):
        return v is None
    if isinstance(t, ListType):
        return isinstance(v, list) and all(fits_type(e, t.elem) for e in v)
    if isinstance(t, TupleType):
        return isinstance(v, tuple) and len(v) == len(t.elems) and all(
            fits_type(e, et) for e, et in zip(v, t.elems))
    if isinstance(t, DictType):
        return isinstance(v, dict)
    return True                      # Any, classes, devices, ...: not checked


def _if(ctx, node, args):
    return ctx.run_block(node.blocks[0 if args[0] else 1], [])


def _loop(ctx, node, args):
    max_trips, cond, carried = args[0], args[1], list(args[2:])
    body = node.blocks[0]
    i = 0
    while cond and i < max_trips:
        out = ctx.run_block(body, [i] + carried)
        cond, carried = out[0], list(out[1:])
        i += 1
    return carried


def _raise(ctx, node, args):
    msg = args[0] if args else "exception"
    raise RunnerError(f"the graph raised an exception: {msg}")


def _get_attr(ctx, node, args):
    obj = args[0]
    if obj is None:
        raise ValueError("prim::GetAttr needs the module object as the graph's first input")
    return [getattr(obj, node.s("name"))]


def _set_attr(ctx, node, args):
    setattr(args[0], node.s("name"), args[1])
    return []


def _call_method(ctx, node, args):
    return _as_outputs(node, getattr(args[0], node.s("name"))(*args[1:]))


def _call_function(ctx, node, args):
    if not callable(args[0]):
        raise ValueError("the called function is not available (its value was not printed)")
    return _as_outputs(node, args[0](*args[1:]))


def _as_outputs(node, result):
    if len(node.outputs) == 1:
        return [result]
    if len(node.outputs) == 0:
        return []
    return list(result)


def _unpack(ctx, node, args):
    seq = list(args[0])
    if len(seq) != len(node.outputs):
        raise ValueError(f"cannot unpack {len(seq)} values into {len(node.outputs)} outputs")
    return seq


def _type_check(ctx, node, args):
    types = node.attr("types") if node.has_attr("types") else []
    ok = len(types) == len(args) and all(fits_type(a, t) for a, t in zip(args, types))
    return list(args) + [ok]


def _minmax(fn):
    def h(ctx, node, args):
        return [fn(args[0]) if len(args) == 1 else fn(args[0], args[1])]
    return h


def _num_to_tensor(ctx, node, args):
    v = args[0]
    if isinstance(v, bool):
        return [torch.tensor(v)]
    if isinstance(v, int):
        return [torch.tensor(v, dtype=torch.int64)]
    return [torch.tensor(v, dtype=torch.float64)]


def _isinstance(ctx, node, args):
    types = node.attr("types")
    return [any(fits_type(args[0], t) for t in types)]


def _tuple_slice(ctx, node, args):
    return [tuple(args[0][node.i("beg"):node.i("end")])]


def _one(fn):
    return lambda ctx, node, args: [fn(*args)]


PRIM_HANDLERS = {
    "prim::Constant": lambda ctx, node, args: [constant_value(node, ctx.map_device)],
    "prim::If": _if,
    "prim::Loop": _loop,
    "prim::ListConstruct": lambda ctx, node, args: [list(args)],
    "prim::TupleConstruct": lambda ctx, node, args: [tuple(args)],
    "prim::DictConstruct": lambda ctx, node, args: [dict(zip(args[0::2], args[1::2]))],
    "prim::ListUnpack": _unpack,
    "prim::TupleUnpack": _unpack,
    "prim::TupleIndex": _one(lambda t, i: t[i]),
    "prim::TupleSlice": _tuple_slice,
    "prim::DictIndex": _one(lambda d, k: d[k]),
    "prim::dtype": _one(lambda t: DTYPE_TO_CODE[t.dtype]),
    "prim::device": _one(lambda t: t.device),
    "prim::layout": _one(lambda t: 0),
    "prim::requires_grad": _one(lambda t: t.requires_grad),
    "prim::is_cuda": _one(lambda t: t.is_cuda),
    "prim::shape": _one(lambda t: list(t.shape)),
    "prim::data": _one(lambda t: t.detach()),
    "prim::grad": _one(lambda t: t.grad),
    "prim::NumToTensor": _num_to_tensor,
    "prim::RaiseException": _raise,
    "prim::Uninitialized": lambda ctx, node, args: [None],
    "prim::unchecked_cast": _one(lambda v: v),
    "prim::unchecked_unwrap_optional": _one(lambda v: v),
    "prim::profile": lambda ctx, node, args: list(args)[:len(node.outputs)],
    "prim::profile_ivalue": lambda ctx, node, args: list(args)[:len(node.outputs)],
    "prim::Guard": _one(lambda v: v),
    "prim::min": _minmax(min),
    "prim::max": _minmax(max),
    "prim::abs": _one(abs),
    "prim::isinstance": _isinstance,
    "prim::GetAttr": _get_attr,
    "prim::SetAttr": _set_attr,
    "prim::CallMethod": _call_method,
    "prim::CallFunction": _call_function,
    "prim::TypeCheck": _type_check,
    "prim::RequiresGradCheck": lambda ctx, node, args: list(args) + [True],
    "prim::CudaFusionGuard": lambda ctx, node, args: [True],
    "prim::TensorExprDynamicGuard": lambda ctx, node, args: [True],
    "prim::AutogradZero": lambda ctx, node, args: [None],
    "prim::AutogradAdd": _one(lambda a, b: b if a is None else a if b is None else a + b),
    "prim::ConstantChunk": lambda ctx, node, args: list(
        torch.chunk(args[0], node.i("chunks"), node.i("dim"))),
    "prim::BroadcastSizes": _one(lambda *s: list(torch.broadcast_shapes(*s))),
    "prim::Print": lambda ctx, node, args: print(*args) or [],
    "prim::StringIndex": _one(lambda s, i: s[i]),
    "prim::rangelist": _one(lambda n: list(range(n))),
}
