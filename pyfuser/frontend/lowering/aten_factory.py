"""Lowerings of aten's factory ops: `scalar_tensor`, `full`, `ones` and `zeros` (what an FX
graph writes for `torch.where(mask, x, float("-inf"))`, an attention mask's fill or a
`torch.full` / `torch.ones` in a model; `scalar_tensor` also of a symbolic size, AOTAutograd's
form of `x / math.sqrt(x.shape[-1])` under dynamic shapes),
`arange` of integers (a class index compared with a target, positions; its bounds may be
symbolic, SymInts under dynamic shapes), and `new_ones` /
`new_zeros` / `new_full` (a mask's `True` made beside a tensor). In a fused region
the value becomes a constant broadcast, or an iota, in the kernel: no allocation, no fill
kernel.

Op class FACTORY: the torch.compile backend fuses them (its partitioner keeps a region only
where it also reads a tensor on the device its values live on); the TorchScript fuser does not.
A dtype argument left out is refused where eager infers it from the fill (full), so the result
dtype is always the one eager gives.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.dtypes import DataType
from .aten_pointwise import _dtype
from .registry import FACTORY, lowers


def _number(v, what: str):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UnsupportedOpError(f"{what} of a value that is not a constant number (left to eager)")
    return v


@lowers("aten::scalar_tensor", op_class=FACTORY, n_args=(5,), const_args=(0, 1, 2, 3, 4))
def _scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    """A 0-dim tensor of `value`, in `dtype` (eager's default dtype when it is left out). The
    value may be a symbolic Int or Double scalar of the graph (a SymInt under dynamic shapes:
    AOTAutograd writes `x / math.sqrt(x.shape[-1])` as scalar_tensor(s1), converted to float64,
    sqrt, converted to x's dtype, div): a 0-dim tensor of that scalar, which the kernel reads
    as a parameter bound with the sizes (the 0-dim chain after it is computed once per thread,
    outside the lanes loop)."""
    if isinstance(value, Scalar) and not value.is_const and \
            value.dtype in (DataType.Int, DataType.Double):
        return B.full([], value, _default_dtype(dtype))
    return B.full([], _number(value, "scalar_tensor"), _default_dtype(dtype))


@lowers("aten::full", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _full(size, value, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        raise UnsupportedOpError("full without a dtype (eager infers it from the value; left to eager)")
    return B.full(list(size), _number(value, "full"), _dtype(dtype))


@lowers("aten::arange", op_class=FACTORY, n_args=(5, 6, 7), const_args=(0, 1, 2, 3, 4, 5, 6))
def _arange(*args):
    """arange(end), arange(start, end), arange(start, end, step) (each then dtype, layout,
    device, pin_memory) of integers, as an iota: eager's int64 when dtype is left out; floating
    bounds or a floating dtype are left to eager (the length and values follow eager's rounding
    rules there). A bound may be a symbolic Int (a SymInt of the graph under dynamic shapes:
    `torch.arange(seq_len)`), the step a constant: the iota's extent is then the symbolic `end`
    itself where start is 0 and step 1 (the extent of the input whose size it is), else the
    scalar expression of eager's length, computed when the sizes are bound."""
    n = len(args) - 4
    bounds, dtype = list(args[:n]), args[n]
    start, end, step = ([0] + bounds + [1])[:3] if n == 1 else (bounds + [1])[:3]
    if not all(type(v) is int or _symbolic_int(v) for v in (start, end, step)) or step == 0:
        raise UnsupportedOpError("arange of other than integer bounds and a nonzero step "
                                 "(left to eager)")
    if type(step) is not int:
        raise UnsupportedOpError("arange of a symbolic step (left to eager)")
    dt = _dtype(dtype) if dtype is not None else DataType.Int
    if not dt.is_integral:
        raise UnsupportedOpError("arange of a floating dtype (left to eager)")
    return B.iota(_arange_length(start, end, step), start, step, dt)


def _symbolic_int(v) -> bool:
    return isinstance(v, Scalar) and not v.is_const and v.dtype is DataType.Int


def _arange_length(start, end, step: int):
    """eager's ceil((end - start) / step), at least 0: a number for constant bounds, else an Int
    scalar of the fusion (`end` itself for arange(end))."""
    if type(start) is int and type(end) is int:
        return max(0, -((start - end) // step))
    if type(start) is int and start == 0 and step == 1:
        return end
    ew = B.elementwise                      # ceil(a / b) == -floor(-a / b), on Int scalars
    return ew("maximum", ew("neg", ew("div_floor", ew("sub", start, end), step)), 0)


def _default_dtype(dtype) -> DataType:
    import torch
    return _dtype(dtype) if dtype is not None else DataType.from_torch(torch.get_default_dtype())


@lowers("aten::ones", op_class=FACTORY, n_args=(5,), const_args=(0, 1, 2, 3, 4))
def _ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    """`torch.ones(size)`: in `dtype`, else eager's default dtype."""
    return B.full(list(size), 1, _default_dtype(dtype))


@lowers("aten::zeros", op_class=FACTORY, n_args=(5,), const_args=(0, 1, 2, 3, 4))
def _zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    """`torch.zeros(size)`: in `dtype`, else eager's default dtype."""
    return B.full(list(size), 0, _default_dtype(dtype))


def _new_filled(self, size, value, dtype, what: str):
    dt = _dtype(dtype) if dtype is not None else self.dtype
    return B.full(list(size), _number(value, what), dt)


@lowers("aten::new_ones", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _new_ones(self, size, dtype=None, layout=None, device=None, pin_memory=None):
    """`x.new_ones(size)`: ones in `dtype`, else x's dtype (x's values are not read)."""
    return _new_filled(self, size, 1, dtype, "new_ones")


@lowers("aten::new_zeros", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _new_zeros(self, size, dtype=None, layout=None, device=None, pin_memory=None):
    """`x.new_zeros(size)`: zeros in `dtype`, else x's dtype (x's values are not read)."""
    return _new_filled(self, size, 0, dtype, "new_zeros")


@lowers("aten::new_full", op_class=FACTORY, n_args=(7,), const_args=(1, 2, 3, 4, 5, 6))
def _new_full(self, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    """`x.new_full(size, value)`: `value` in `dtype`, else x's dtype (eager does not infer the
    dtype from the value here, unlike `full`)."""
    return _new_filled(self, size, value, dtype, "new_full")
