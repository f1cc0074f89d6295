"""The `fd.ops` namespace of FusionDefinition.

Every elementwise op of the op table (pyfuser.ir.ops.OPS) becomes a method `fd.ops.<name>(*operands)`
generated from the table, plus nvFuser's aliases (ALIASES). Ops with their own signatures (views,
reductions, casts, `full`, `iota`, indexing, random numbers...) are written out below, with
nvFuser's signatures (positional or keyword). Each method builds IR through the checked builder
via `fd._run`, which also records the call for `repr(fd)`.

Every public method is wrapped by `api_call`: handles (definition_values.py) in, IR values to the
method, handles out; a FusionDefinitionError raised inside gets the definition, statement and
call named in front of its message.

Invariant: no method branches on an op name; an op added to the table appears here by itself.
"""
from __future__ import annotations

import functools
import math

from ..errors import FusionDefinitionError
from ..ir import builder as B
from ..ir.base import Scalar
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


def api_call(fn):
    """A public definition call: handles in and out, errors named by definition and statement."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        is_op = isinstance(self, Ops)
        fd = self._fd if is_op else self
        try:
            result = fn(self, *fd._unwrap(args), **{k: fd._unwrap(v) for k, v in kwargs.items()})
        except FusionDefinitionError as e:
            if getattr(e, "pyfuser_named", False):
                raise
            err = type(e)(f"{fd._where(('ops.' if is_op else '') + fn.__name__)}: {e}")
            err.pyfuser_named = True
            raise err from None
        return fd._wrap(result)
    call.pyfuser_api = True
    return call


def _size_list(v, op: str, what: str) -> list:
    """A list of sizes: ints or Int scalars (tensor_sizes / t.shape entries)."""
    if not isinstance(v, (list, tuple)) or any(
            not (isinstance(i, int) and not isinstance(i, bool)) and
            not (isinstance(i, Scalar) and i.dtype.is_integral) for i in v):
        raise FusionDefinitionError(f"{op}: {what} must be a list of sizes (ints or Int scalars), "
                                    f"got {v!r}")
    return list(v)


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
        size = d.known_size()
        if size is not None and size != n and n != -1:
            raise FusionDefinitionError(
                f"{op}: original_shape {original} says axis {i} of {x.name} has size {n}, "
                f"but it has size {size}")


class Ops:
    def __init__(self, fd):
        self._fd = fd

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        raise UnknownNameError(f"{self._fd._title()}: fd.ops has no op named {name!r}")

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

    def broadcast_in_dim(self, x, output_shape=None, broadcast_dims=None, shape=None):
        """Input axis i becomes output axis broadcast_dims[i]; the others are new broadcast axes
        of the sizes in output_shape (also `shape=`; ints or Int scalars such as tensor_sizes)."""
        if shape is not None:
            if output_shape is not None:
                raise FusionDefinitionError("broadcast_in_dim: give output_shape= or shape=, not both")
            output_shape = shape
        if output_shape is None or broadcast_dims is None:
            raise FusionDefinitionError("broadcast_in_dim needs output_shape= and broadcast_dims=")
        shape = _size_list(output_shape, "broadcast_in_dim", "output_shape")
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
        shape = _size_list(shape, "expand", "shape")
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

    def full(self, shape=None, fill_value=None, dtype: DataType = None, size=None, arg=None):
        """A tensor of `shape` (also `size=`) filled with `fill_value` (also `arg=`)."""
        shape = _either("full", "shape", shape, "size", size)
        fill_value = _either("full", "fill_value", fill_value, "arg", arg)
        if not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"full: dtype must be a DataType, got {dtype!r}")
        shape = _size_list(shape, "full", "shape")
        return self._fd._run("ops.full", lambda: B.full(shape, fill_value, dtype),
                             (), dict(shape=shape, fill_value=fill_value, dtype=dtype))

    def iota(self, length, start=None, step=None, dtype: DataType = DataType.Int):
        """[start, start + step, ...] (`length` elements; start 0 and step 1 when None)."""
        if not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"iota: dtype must be a DataType, got {dtype!r}")
        return self._fd._run(
            "ops.iota", lambda: B.iota(length, 0 if start is None else start,
                                       1 if step is None else step, dtype),
            (length, start, step, dtype))

    def tensor_sizes(self, x):
        """The sizes of x as Int scalars (bound when the fusion runs)."""
        _tensor(x, "tensor_sizes")
        return self._fd._run(
            "ops.tensor_sizes",
            lambda: [d.full_extent
                     for d in x.logical], (x,))

    def normal(self, mean, std, size=None, dtype: DataType = DataType.Float, shape=None):
        """Values from N(mean, std^2) (torch's generator of the fusion's device)."""
        return self._random("normal", mean, std, _either("normal", "size", size, "shape", shape),
                            dtype)

    def uniform(self, low, high, size=None, dtype: DataType = DataType.Float, shape=None):
        """Values from U[low, high) (torch's generator of the fusion's device)."""
        return self._random("uniform", low, high,
                            _either("uniform", "size", size, "shape", shape), dtype)

    def _random(self, kind, a, b, shape, dtype):
        shape = _size_list(shape, kind, "size")
        return self._fd._run(f"ops.{kind}", lambda: B.random(kind, a, b, shape, dtype),
                             (a, b), dict(shape=shape, dtype=dtype))

    # --- indexing ---------------------------------------------------------------------------------
    def gather(self, x, index, dim: int):
        """torch.gather(x, dim, index)."""
        return self._fd._run("ops.gather", lambda: B.gather(_tensor(x, "gather"),
                                                            _tensor(index, "gather"), dim),
                             (x, index, dim))

    def index_select(self, x, index, dim: int):
        """torch.index_select(x, dim, index) (index of rank 1 or 0)."""
        return self._fd._run(
            "ops.index_select", lambda: B.index_select(_tensor(x, "index_select"),
                                                       _tensor(index, "index_select"), dim),
            (x, index, dim))

    def embedding_fwd(self, input, weight, padding_idx=None, max_norm=None, norm_type=None,
                      scale_grad_by_freq=False, sparse=False):
        """torch.nn.functional.embedding(input, weight): weight's rows at the indices in
        `input` (any rank). padding_idx, scale_grad_by_freq and sparse change only the
        backward; max_norm (which renormalizes weight's rows in place) is not supported."""
        if max_norm is not None:
            raise FusionDefinitionError("embedding_fwd: max_norm is not supported (it writes "
                                        "the weight's rows in place)")
        return self._fd._run(
            "ops.embedding_fwd", lambda: B.embedding(_tensor(weight, "embedding_fwd"),
                                                     _tensor(input, "embedding_fwd")),
            (input, weight), dict(padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq,
                                  sparse=sparse))

    def slice(self, x, start_indices=None, end_indices=None, strides=None):
        """x[start_indices[0]:end_indices[0]:strides[0], ...] (strides >= 1, default 1)."""
        if start_indices is None or end_indices is None:
            raise FusionDefinitionError("slice needs start_indices= and end_indices=")
        kwargs = dict(start_indices=start_indices, end_indices=end_indices)
        if strides is not None:
            kwargs["strides"] = strides
        return self._fd._run(
            "ops.slice", lambda: B.slice_(_tensor(x, "slice"), start_indices, end_indices, strides),
            (x,), kwargs)

    def cat(self, tensors, dim: int = 0):
        """torch.cat(tensors, dim)."""
        if not isinstance(tensors, (list, tuple)):
            raise FusionDefinitionError(f"cat: expects a list of tensors, got {tensors!r}")
        tensors = list(tensors)
        return self._fd._run("ops.cat", lambda: B.cat(tensors, dim), (tensors, dim))

    def pad(self, x, pad_widths, value=None):
        """torch.nn.functional.pad(x, pad_widths, value=value): pairs (before, after) from the
        last axis backwards, non-negative; value None pads with 0."""
        t = _tensor(x, "pad")
        widths = list(pad_widths) if isinstance(pad_widths, (list, tuple)) else pad_widths
        if not isinstance(widths, list) or len(widths) % 2 or len(widths) // 2 > t.ndim:
            raise FusionDefinitionError(
                f"pad: pad_widths must be an even-length list of at most 2 x rank ({t.ndim}) "
                f"ints, got {pad_widths!r}")
        pairs = [(0, 0)] * t.ndim
        for k in range(len(widths) // 2):
            pairs[t.ndim - 1 - k] = (widths[2 * k], widths[2 * k + 1])
        args = (x, widths) if value is None else (x, widths, value)
        return self._fd._run("ops.pad", lambda: B.pad(t, pairs, 0 if value is None else value),
                             args)

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


def _either(op: str, name: str, value, other_name: str, other):
    """nvFuser spelled some arguments two ways over time (size=/shape=, arg=/fill_value=)."""
    if value is not None and other is not None:
        raise FusionDefinitionError(f"{op}: give {name}= or {other_name}=, not both")
    if value is None and other is None:
        raise FusionDefinitionError(f"{op} needs {name}=")
    return value if value is not None else other


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
for _name, _fn in list(Ops.__dict__.items()):
    if not _name.startswith("_") and callable(_fn) and not getattr(_fn, "pyfuser_api", False):
        setattr(Ops, _name, api_call(_fn))
