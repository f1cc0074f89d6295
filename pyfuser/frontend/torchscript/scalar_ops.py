"""`aten::` ops on Python values (ints, floats, bools, strings, lists, dicts), run in Python.

TorchScript registers these (`aten::add.int`, `aten::__getitem__.t`, `aten::len.t`, ...) but
`torch.ops` cannot take Python lists for generic `t[]` arguments, so the runner evaluates them
here. `PY_OPS[kind](ctx, *args)` returns the result, or NotImplemented to let the runner call
the torch op instead (a Tensor argument, a form not handled here). Ops in TENSOR_AWARE may be
called with tensors too; the rest are only tried when no argument is a Tensor.
Semantics follow TorchScript: `div` is true division, `pow` of ints gives a float,
`floordiv`/`remainder` round toward -inf like Python.
"""
from __future__ import annotations

import math
import operator

import torch

from .types import CODE_TO_DTYPE


def _binary(fn):
    def op(ctx, a, b, *rest):
        if rest:
            return NotImplemented
        return fn(a, b)
    return op


def _unary(fn):
    def op(ctx, a, *rest):
        if rest:
            return NotImplemented
        return fn(a)
    return op


def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return float(a) ** b
    return a ** b


def _range_length(ctx, lo, hi, step):
    if step == 0:
        raise ValueError("range() arg 3 must not be zero")
    return max(0, -((lo - hi) // step)) if step > 0 else max(0, -((hi - lo) // -step))


def _slice(ctx, seq, *rest):
    if isinstance(seq, torch.Tensor) or len(rest) > 3:
        return NotImplemented
    start, end, step = (list(rest) + [None, None, 1][len(rest):])
    return seq[start:end:step]


def _format(ctx, fmt, *args):
    return fmt.format(*[str(a) for a in args])


def _tensor(ctx, data, dtype=None, device=None, requires_grad=False):
    dt = CODE_TO_DTYPE.get(dtype) if isinstance(dtype, int) else dtype
    dev = ctx.map_device(torch.device(device)) if device is not None else None
    return torch.tensor(data, dtype=dt, device=dev)


def _append(ctx, lst, v):
    lst.append(v)
    return lst


def _set_item(ctx, c, k, v):
    if isinstance(c, torch.Tensor):
        return NotImplemented
    c[k] = v
    return None


def _getitem(ctx, c, k):
    if isinstance(c, torch.Tensor):
        return NotImplemented
    return c[k]


def _item(ctx, t):
    return t.item() if isinstance(t, torch.Tensor) else t


def _to_int(ctx, v):
    return int(v.item()) if isinstance(v, torch.Tensor) else int(v)


def _to_float(ctx, v):
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _to_bool(ctx, v):
    return bool(v.item()) if isinstance(v, torch.Tensor) else bool(v)


def _dict_get(ctx, d, k, default=None):
    return d.get(k, default)


def _minmax(fn):
    def op(ctx, *args):
        if len(args) == 1:
            return fn(args[0])
        return fn(args[0], args[1])
    return op


_ARITH = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "remainder": operator.mod, "pow": _pow,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "gt": operator.gt,
    "le": operator.le, "ge": operator.ge, "__and__": operator.and_, "__or__": operator.or_,
    "__xor__": operator.xor, "__lshift__": operator.lshift, "__rshift__": operator.rshift,
    "__contains__": lambda a, b: b in a, "fmod": math.fmod, "atan2": math.atan2,
    "copysign": math.copysign,
}
_UNARY = {
    "neg": operator.neg, "abs": abs, "__not__": operator.not_, "floor": math.floor,
    "ceil": math.ceil, "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "sin": math.sin,
    "cos": math.cos, "tanh": math.tanh, "round": round, "len": len, "list": list,
    "str": str, "keys": lambda d: list(d.keys()), "values": lambda d: list(d.values()),
    "dim": lambda t: t.dim(), "numel": lambda t: t.numel(), "clear": lambda x: x.clear(),
    "copy": lambda x: x.copy() if isinstance(x, (list, dict)) else NotImplemented,
}

PY_OPS: dict = {}
for _name, _fn in _ARITH.items():
    PY_OPS[f"aten::{_name}"] = _binary(_fn)
for _name, _fn in _UNARY.items():
    PY_OPS[f"aten::{_name}"] = _unary(_fn)
PY_OPS.update({
    "aten::__range_length": _range_length,
    "aten::__derive_index": lambda ctx, i, start, step: start + i * step,
    "aten::slice": _slice,
    "aten::format": _format,
    "aten::tensor": _tensor,
    "aten::as_tensor": _tensor,
    "aten::append": _append,
    "aten::_set_item": _set_item,
    "aten::__getitem__": _getitem,
    "aten::get": _dict_get,
    "aten::item": _item,
    "aten::ScalarImplicit": _item,
    "aten::Int": _to_int,
    "aten::IntImplicit": _to_int,
    "aten::Float": _to_float,
    "aten::FloatImplicit": _to_float,
    "aten::Bool": _to_bool,
    "aten::__is__": lambda ctx, a, b: a is b or (a is None and b is None),
    "aten::__isnot__": lambda ctx, a, b: not (a is b or (a is None and b is None)),
    "aten::warn": lambda ctx, *a: None,
    "aten::extend": lambda ctx, a, b: a.extend(b),
    "aten::insert": lambda ctx, a, i, v: a.insert(i, v),
    "aten::pop": lambda ctx, a, i=-1: a.pop(i) if isinstance(a, list) else NotImplemented,
    "aten::max": _minmax(max),
    "aten::min": _minmax(min),
    "aten::sum": lambda ctx, a, *r: sum(a) if isinstance(a, list) and not r else NotImplemented,
})

# May be called with Tensor arguments (they handle or decline them themselves).
TENSOR_AWARE = {"aten::len", "aten::__getitem__", "aten::append", "aten::format",
                "aten::item", "aten::ScalarImplicit", "aten::Int", "aten::IntImplicit",
                "aten::Float", "aten::FloatImplicit", "aten::Bool", "aten::__is__",
                "aten::__isnot__", "aten::dim", "aten::numel", "aten::list", "aten::warn",
                "aten::_set_item", "aten::slice", "aten::__contains__", "aten::keys",
                "aten::values", "aten::get", "aten::str", "aten::extend", "aten::insert",
                "aten::tensor", "aten::as_tensor"}


def _has_tensor(args) -> bool:
    return any(isinstance(a, torch.Tensor) for a in args)


def try_python_op(ctx, kind: str, args: list):
    """The op's result computed in Python, or NotImplemented."""
    fn = PY_OPS.get(kind)
    if fn is None:
        return NotImplemented
    if kind not in TENSOR_AWARE and _has_tensor(args):
        return NotImplemented
    if kind == "aten::len" and args and isinstance(args[0], torch.Tensor):
        return len(args[0])
    if kind in ("aten::dim", "aten::numel") and not _has_tensor(args):
        return NotImplemented
    return fn(ctx, *args)
