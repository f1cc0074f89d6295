"""Lowerings of aten's factory ops that make a tensor of one value: `scalar_tensor` and `full`
(what an FX graph writes for `torch.where(mask, x, float("-inf"))`, an attention mask's fill or
a `torch.full` in a model). In a fused region the value becomes a constant broadcast in the
kernel: no allocation, no fill kernel.

Op class FACTORY: the torch.compile backend fuses them (its partitioner keeps a region only
where it also reads a tensor on the device its values live on); the TorchScript fuser does not.
A dtype argument left out is refused where eager infers it from the fill (full), so the result
dtype is always the one eager gives.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from .aten_pointwise import _dtype
from .registry import FACTORY, lowers


def _number(v, what: str):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UnsupportedOpError(f"{what} of a value that is not a constant number (left to eager)")
    return v


@lowers("aten::scalar_tensor", op_class=FACTORY, n_args=(5,), const_args=(0, 1, 2, 3, 4))
def _scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    """A 0-dim tensor of `value`, in `dtype` (eager's default dtype when it is left out)."""
    import torch
    dt = _dtype(dtype) if dtype is not None else DataType.from_torch(torch.get_default_dtype())
    return B.full([], _number(value, "scalar_tensor"), dt)


@lowers("aten::full", op_class=FACTORY, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _full(size, value, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        raise UnsupportedOpError("full without a dtype (eager infers it from the value; left to eager)")
    return B.full(list(size), _number(value, "full"), _dtype(dtype))
