"""Lowerings of the factory ops shaped like a tensor: `zeros_like`, `ones_like`, `full_like`,
`empty_like`, `new_empty`, `new_empty_strided` and the functional `zero` and `fill`
(`fill.Scalar`, `fill.Tensor`), what AOTAutograd writes for `torch.zeros_like(x)`,
`x.new_empty(...)` and `t[..., 0] = 5` (T5's shifted decoder inputs, DeepSeek's multi-head latent attention keys
assembled in a new buffer, gradients of split / slice chains). In a fused region each is a
constant broadcast (FullOp): no allocation, no fill kernel; the tensor they are shaped like is
not read.

Semantics follow eager: the dtype is `dtype` where given, else the tensor's (`full_like` does
not infer it from the fill value, unlike `full`); the value is cast to that dtype as eager's
fill casts it (2.7 into int64 is 2, a nonzero into bool True). `empty_like`, `new_empty` and
`new_empty_strided` have undefined values in eager: pyfuser writes zeros. The layout: the kernel
writes row-major values and the region hands back eager's strides (a `preserve_format` result
of a transposed tensor is copied into its order, fx/region.py), so any memory format is taken;
`new_empty_strided` only with the row-major strides of its sizes (other strides, possibly with
gaps or overlaps, stay eager). `fill.Tensor` takes a 0-dim value tensor (eager raises for
others: left to eager), read once and broadcast.

Op class FACTORY: the torch.compile backend fuses them; the TorchScript fuser does not group
this class.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.tensor import TensorView
from .aten_pointwise import _dtype
from .registry import FACTORY, lowers


def _shape_of(x, what: str) -> list:
    """x's sizes (ints or the fusion's symbolic Int extents; an expanded axis its full size)."""
    if not isinstance(x, TensorView):
        raise UnsupportedOpError(f"{what} of a value that is not a tensor")
    return [d.full_extent for d in x.logical]


def _value(v, what: str):
    """A fill value: a constant number or bool, or a symbolic scalar of the graph."""
    if isinstance(v, Scalar) or isinstance(v, (bool, int, float)):
        return v
    raise UnsupportedOpError(f"{what} of a value that is not a number (left to eager)")


def _filled(x, value, dtype, what: str) -> TensorView:
    dt = _dtype(dtype) if dtype is not None else x.dtype
    return B.full(_shape_of(x, what), value, dt)


@lowers("aten::zeros_like", "aten::empty_like", op_class=FACTORY, n_args=(6,),
        const_args=(1, 2, 3, 4, 5))
def _zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """zeros of x's shape in `dtype` (else x's); empty_like too (its values are undefined)."""
    return _filled(x, 0, dtype, "zeros_like")


@lowers("aten::ones_like", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled(x, 1, dtype, "ones_like")


@lowers("aten::full_like", op_class=FACTORY, n_args=(7,), const_args=(1, 2, 3, 4, 5, 6))
def _full_like(x, value, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return _filled(x, _value(value, "full_like"), dtype, "full_like")


@lowers("aten::new_empty", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _new_empty(self, size, dtype=None, layout=None, device=None, pin_memory=None):
    """`x.new_empty(size)`: zeros (eager's values are undefined) in `dtype`, else x's."""
    return B.full(list(size), 0, _dtype(dtype) if dtype is not None else self.dtype)


@lowers("aten::new_empty_strided", op_class=FACTORY, n_args=(7,), const_args=(1, 2, 3, 4, 5, 6))
def _new_empty_strided(self, size, stride, dtype=None, layout=None, device=None,
                       pin_memory=None):
    """new_empty with the row-major strides of `size` (constant ints): zeros, as new_empty."""
    size, stride = list(size), list(stride)
    if not all(type(v) is int for v in size + stride) or stride != _row_major(size):
        raise UnsupportedOpError("new_empty_strided with strides other than the row-major ones "
                                 "of constant sizes (left to eager)")
    return _new_empty(self, size, dtype)


def _row_major(size: list) -> list:
    out, acc = [], 1
    for n in reversed(size):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


@lowers("aten::zero", op_class=FACTORY, n_args=(1,))
def _zero(x):
    """The functional `zero_`: zeros of x's shape and dtype."""
    return _filled(x, 0, None, "zero")


@lowers("aten::fill", op_class=FACTORY, n_args=(2,))
def _fill(x, value):
    """`fill.Scalar` / `fill.Tensor`: x's shape and dtype, every element `value` (a number, a
    symbolic scalar or a 0-dim tensor, cast to x's dtype)."""
    shape = _shape_of(x, "fill")
    if isinstance(value, TensorView):
        if value.ndim != 0:
            raise UnsupportedOpError("fill with a value tensor of rank > 0 (eager raises)")
        v = B.cast(value, x.dtype)
        return B.expand(B.broadcast(v, [True] * x.ndim), shape) if x.ndim else B.set_(v)
    return B.full(shape, _value(value, "fill"), x.dtype)
