"""Lowerings of aten's random ops as random numbers drawn inside the kernel (builder.rand:
Philox4x32-10 from the launch's seed and offset, ir/philox.py): native_dropout, rand_like, rand,
bernoulli (a probability or a tensor of them) and uniform.

They are op class RANDOM: the torch.compile backend fuses them; the TorchScript fuser leaves
them to eager's generator. Values are not eager's (another generator), their distribution is:
dropout keeps an element when its uniform number is below 1 - p and scales kept elements by
1 / (1 - p) (0 when p is 1), as eager computes `x * mask * scale`; the mask is returned (bool),
so a backward graph reuses the forward's mask (AOTAutograd saves it).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_pointwise import _dtype
from .registry import RANDOM, lowers

ew = B.elementwise


def _shape(x: TensorView) -> list:
    return [d.full_extent for d in x.logical]


def _uniform_like(x: TensorView, dtype=None):
    dt = x.dtype if dtype is None else _dtype(dtype)
    if dt not in (DataType.Float, DataType.Half, DataType.BFloat16):
        raise UnsupportedOpError(f"random numbers of dtype {dt.name} in a kernel (left to eager)")
    return B.rand(_shape(x), dt)


def _no_generator(generator):
    if generator is not None:
        raise UnsupportedOpError("a random op with its own generator (left to eager)")


@lowers("aten::native_dropout", op_class=RANDOM, n_args=(3,), const_args=(1, 2))
def _native_dropout(x, p, train):
    """(x * mask * scale, mask); in eval mode (train False) a copy of x and an all-true mask."""
    if not isinstance(x, TensorView) or not x.dtype.is_floating:
        raise UnsupportedOpError("dropout of a non-floating tensor (left to eager)")
    if train is False:
        return B.set_(x), B.full(_shape(x), True, DataType.Bool)
    keep = 1.0 - float(p)
    u = B.rand(_shape(x), DataType.Float)
    mask = ew("lt", u, keep)
    scale = 0.0 if keep == 0.0 else 1.0 / keep
    return ew("mul", ew("mul", x, mask), scale), mask


@lowers("aten::rand_like", op_class=RANDOM, n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _rand_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform_like(x, dtype)


@lowers("aten::rand", op_class=RANDOM, n_args=(5, 6), const_args=(0, 1, 2, 3, 4, 5))
def _rand(size, *args):
    """rand(size, dtype, layout, device, pin_memory) and the overload with a generator."""
    if len(args) == 5:
        _no_generator(args[0])
        args = args[1:]
    dtype = args[0]
    import torch
    dt = _dtype(dtype) if dtype is not None else DataType.from_torch(torch.get_default_dtype())
    if dt not in (DataType.Float, DataType.Half, DataType.BFloat16):
        raise UnsupportedOpError(f"random numbers of dtype {dt.name} in a kernel (left to eager)")
    return B.rand(list(size), dt)


@lowers("aten::bernoulli", op_class=RANDOM, n_args=(2, 3))
def _bernoulli(x, *args):
    """bernoulli(x) (x the probabilities), bernoulli.p(x, p), bernoulli.Tensor(x, p): 1 where
    a uniform number is below the probability, in x's dtype."""
    _no_generator(args[-1])
    p = args[0] if len(args) == 2 else x
    u = _uniform_like(x, DataType.Float)
    return B.cast(ew("lt", u, p), x.dtype)


@lowers("aten::uniform", op_class=RANDOM, n_args=(4,))
def _uniform(x, low, high, generator=None):
    """from + (to - from) * u, in x's dtype."""
    _no_generator(generator)
    u = _uniform_like(x)
    return ew("add", ew("mul", u, float(high) - float(low)), float(low))
