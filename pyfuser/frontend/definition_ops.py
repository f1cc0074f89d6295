"""The `fd.ops` namespace of FusionDefinition.

Every elementwise op of the op table (pyfuser.ir.ops.OPS) becomes a method `fd.ops.<name>(*operands)`
generated from the table, plus nvFuser's aliases (ALIASES). Ops with their own signatures (views,
reductions, casts, `full`...) are written out below. Each method builds IR through the checked
builder via `fd._run`, which also records the call for `Fusion.fusion_definition()`.

Invariant: no method branches on an op name; an op added to the table appears here by itself.
"""
from __future__ import annotations

import math

from ..errors import FusionDefinitionError
from ..ir import builder as B
from ..ir.dtypes import DataType
from ..ir.ops import OPS
from ..ir.tensor import TensorView

# nvFuser spellings -> op table names.
ALIASES = {
    "truediv": "div", "floordiv": "div_floor", "mod": "fmod", "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift", "clamp_min": "clamp_min", "bitwise_not": "bitwise_not",
    "tanh_gelu": "gelu_tanh", "ternary_where": "where",
}
REDUCTIONS = ("sum", "prod", "max", "min")


class UnknownNameError(FusionDefinitionError, AttributeError):
    """An unknown op or attribute; an AttributeError too, so hasattr() keeps working."""


def _tensor(x, op: str) -> TensorView:
    if not isinstance(x, TensorView):
        raise FusionDefinitionError(f"{op}: expects a tensor, got {type(x).__name__} {x!r}")
    return x


def _int_list(v, op: str, what: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or any(not isinstance(i, int) or isinstance(i, bool)
                                               for i in v):
        raise FusionDefinitionError(f"{op}: {what} must be a list of ints, got {v!r}")
    return list(v)


def _resolve_shape(op: str, original: list[int], new: list[int]) -> list[int]:
    total = math.prod(original)
    if new.count(-1) > 1:
        raise FusionDefinitionError(f"{op}: new_shape {new} has more than one -1")
    if -1 in new:
        rest = math.prod(s for s in new if s != -1)
        if rest == 0 or total % rest:
            raise FusionDefinitionError(f"{op}: cannot view shape {original} as {new}")
        new = [total // rest if s == -1 else s for s in new]
    if math.prod(new) != total:
        raise FusionDefinitionError(
            f"{op}: original_shape {original} has {total} elements but new_shape {new} has "
            f"{math.prod(new)}")
    return new


def _check_original(op: str, x: TensorView, original: list[int]) -> None:
    if len(original) != x.ndim:
        raise FusionDefinitionError(
            f"{op}: original_shape {original} has {len(original)} entries; {x.name} has rank {x.ndim}")
    for i, (d, n) in enumerate(zip(x.logical, original)):
        ext = d.expanded_extent if d.expanded_extent is not None else d.extent
        if ext.is_const and ext.value != n and n != -1:
            raise FusionDefinitionError(
                f"{op}: original_shape {original} says axis {i} of {x.name} has size {n}, "
                f"but it has size {ext.value}")


class Ops:
    def __init__(self, fd):
        self._fd = fd

    def __getattr__(self, name: str):
        raise UnknownNameError(f"fd.ops has no op named {name!r}")

    # --- data movement ---------------------------------------------------------------------------
    def view(self, x, original_shape=None, new_shape=None):
        _tensor(x, "view")
        if new_shape is None:
            raise FusionDefinitionError("view needs new_shape=")
        new = _int_list(new_shape, "view", "new_shape")
        if original_shape is not None:
            orig = _int_list(original_shape, "view", "original_shape")
            _check_original("view", x, orig)
            if -1 not in orig:
                new = _resolve_shape("view", orig, new)
        return self._fd._run("ops.view", lambda: B.reshape(x, new), (x,),
                             dict(original_shape=original_shape, new_shape=new_shape))

    def reshape(self, x, *shapes, new_shape=None, original_shape=None):
        """reshape(x, new_shape) or reshape(x, original_shape, new_shape)."""
        if len(shapes) == 2:
            original_shape, new_shape = shapes
        elif len(shapes) == 1:
            new_shape = shapes[0]
        elif shapes:
            raise FusionDefinitionError("reshape takes (x, new_shape) or (x, original_shape, new_shape)")
        return self.view(x, original_shape=original_shape, new_shape=new_shape)

    def permute(self, x, dims=None):
        _tensor(x, "permute")
        if dims is None:
            raise FusionDefinitionError(
                f"permute needs dims= (a permutation of the {x.ndim} axes of {x.name})")
        dims = _int_list(dims, "permute", "dims")
        return self._fd._run("ops.permute", lambda: B.permute(x, dims), (x,), dict(dims=dims))

    def transpose(self, x, dim0: int, dim1: int):
        return self._fd._run("ops.transpose", lambda: B.transpose(_tensor(x, "transpose"), dim0, dim1),
                             (x, dim0, dim1))

    def set(self, x):
        return self._fd._run("ops.set", lambda: B.set_(_tensor(x, "set")), (x,))

    def broadcast_in_dim(self, x, output_shape=None, broadcast_dims=None):
        if output_shape is None or broadcast_dims is None:
            raise FusionDefinitionError("broadcast_in_dim needs output_shape= and broadcast_dims=")
        shape = _int_list(output_shape, "broadcast_in_dim", "output_shape")
        dims = _int_list(broadcast_dims, "broadcast_in_dim", "broadcast_dims")
        return self._fd._run(
            "ops.broadcast_in_dim",
            lambda: B.broadcast_in_dim(_tensor(x, "broadcast_in_dim"), shape, dims), (x,),
            dict(output_shape=shape, broadcast_dims=dims))

    def broadcast(self, x, is_broadcast_dim):
        flags = list(is_broadcast_dim)
        return self._fd._run("ops.broadcast", lambda: B.broadcast(_tensor(x, "broadcast"), flags),
                             (x, flags))

    def expand(self, x, shape):
        shape = list(shape)
        return self._fd._run("ops.expand", lambda: B.expand(_tensor(x, "expand"), shape), (x, shape))

    def squeeze(self, x, *args, original_shape=None, dims=None):
        """squeeze(x, dims), squeeze(x, original_shape, dims) or keywords."""
        if len(args) == 2:
            original_shape, dims = args
        elif len(args) == 1:
            dims = args[0]
        if dims is None:
            raise FusionDefinitionError("squeeze needs dims=")
        dims = _int_list(dims, "squeeze", "dims")
        _tensor(x, "squeeze")
        if original_shape is not None:
            _check_original("squeeze", x, _int_list(original_shape, "squeeze", "original_shape"))
        kwargs = dict(dims=dims) if original_shape is None else \
            dict(original_shape=original_shape, dims=dims)
        return self._fd._run("ops.squeeze", lambda: B.squeeze(x, dims), (x,), kwargs)

    def unsqueeze(self, x, dim: int):
        return self._fd._run("ops.unsqueeze", lambda: B.unsqueeze(_tensor(x, "unsqueeze"), dim),
                             (x, dim))

    # --- dtype and creation ----------------------------------------------------------------------
    def cast(self, x, dtype=None):
        if not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"cast needs dtype= (a DataType), got {dtype!r}")
        return self._fd._run("ops.cast", lambda: B.cast(x, dtype), (x,), dict(dtype=dtype))

    def full(self, shape, fill_value, dtype: DataType):
        if not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"full: dtype must be a DataType, got {dtype!r}")
        shape = list(shape)
        return self._fd._run("ops.full", lambda: B.full(shape, fill_value, dtype),
                             (shape, fill_value), dict(dtype=dtype))

    # --- composites ------------------------------------------------------------------------------
    def add_alpha(self, a, b, alpha):
        return self._fd._run("ops.add_alpha",
                             lambda: B.elementwise("add", a, B.elementwise("mul", b, alpha)),
                             (a, b, alpha))

    def sub_alpha(self, a, b, alpha):
        return self._fd._run("ops.sub_alpha",
                             lambda: B.elementwise("sub", a, B.elementwise("mul", b, alpha)),
                             (a, b, alpha))

    # --- reductions ------------------------------------------------------------------------------
    def mean(self, x, axes=None, keepdim: bool = False, dtype=None):
        return self._fd._run("ops.mean", lambda: B.mean(_tensor(x, "mean"), _axes(axes, "mean"),
                                                        keepdim, dtype),
                             (x,), dict(axes=axes, keepdim=keepdim, dtype=dtype))

    def var_mean(self, x, axes=None, correction=1, keepdim: bool = False):
        return self._fd._run(
            "ops.var_mean",
            lambda: B.var_mean(_tensor(x, "var_mean"), _axes(axes, "var_mean"), correction, keepdim),
            (x,), dict(axes=axes, correction=correction, keepdim=keepdim))

    def var(self, x, axes=None, correction=1, keepdim: bool = False):
        return self._fd._run(
            "ops.var",
            lambda: B.var_mean(_tensor(x, "var"), _axes(axes, "var"), correction, keepdim)[0],
            (x,), dict(axes=axes, correction=correction, keepdim=keepdim))


def _axes(axes, op: str):
    if axes is None:
        return None
    if isinstance(axes, int) and not isinstance(axes, bool):
        return [axes]
    return _int_list(axes, op, "axes")


def _make_reduction(name: str):
    def reduce(self, x, axes=None, keepdim: bool = False, dtype=None):
        if isinstance(axes, DataType):  # nvFuser's sum(x, dtype) overload
            axes, dtype = None, axes
        if dtype is not None and not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"{name}: dtype must be a DataType, got {dtype!r}")
        return self._fd._run(f"ops.{name}", lambda: B.reduction(name, _tensor(x, name),
                                                                _axes(axes, name), keepdim, dtype),
                             (x,), dict(axes=axes, keepdim=keepdim, dtype=dtype))
    reduce.__name__ = name
    reduce.__doc__ = f"{name} over `axes` (all axes when None)."
    return reduce


def _make_elementwise(call: str, name: str):
    info = OPS[name]

    def op(self, *operands):
        if len(operands) != info.arity:
            raise FusionDefinitionError(f"{call}: takes {info.arity} operands, got {len(operands)}")
        return self._fd._run(f"ops.{call}", lambda: B.elementwise(name, *operands), operands)
    op.__name__ = call
    op.__doc__ = f"Elementwise `{name}` of the op table ({info.arity} operands)."
    return op


for _name in REDUCTIONS:
    setattr(Ops, _name, _make_reduction(_name))
Ops.amax, Ops.amin = Ops.max, Ops.min
for _name in OPS:
    if _name not in Ops.__dict__:
        setattr(Ops, _name, _make_elementwise(_name, _name))
for _alias, _target in ALIASES.items():
    if _alias not in Ops.__dict__:
        setattr(Ops, _alias, _make_elementwise(_alias, _target))
