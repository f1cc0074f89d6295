"""Lowering of `aten::repeat(x, repeats)`: x tiled `repeats[i]` times along each axis (leading
axes added where repeats is longer than x's rank), a fresh row-major tensor, as eager's. DeBERTa-v2
tiles its relative-position keys and queries over the batch this way.

It is the expand of x with a broadcast axis of size repeats[i] put before each tiled axis i,
viewed as the merged [repeats[i] * size_i, ...] and copied row-major: the kernel reads x at
`index % size_i` along each tiled axis (the view's div / mod between the expand and the copy),
so the tiles are never in memory but in the output. Repeats must be constant ints (a tiled
axis of symbolic size gets the size the host computes, repeats times the extent); a SymInt
repeat and eager's errors (fewer repeats than axes, a negative one) stay the aten call.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.tensor import TensorView
from .registry import lowers


@lowers("aten::repeat", n_args=(2,), const_args=(1,))
def _repeat(x, repeats):
    if not isinstance(x, TensorView):
        raise UnsupportedOpError("aten::repeat of a value that is not a tensor")
    if not isinstance(repeats, (list, tuple)) or \
            not all(type(r) is int and r >= 0 for r in repeats) or len(repeats) < x.ndim:
        raise UnsupportedOpError("aten::repeat: repeats must be constant ints >= 0, at least "
                                 "one per axis (left to eager)")
    if len(repeats) > x.ndim:
        x = B.broadcast(x, [True] * (len(repeats) - x.ndim) + [False] * x.ndim)
    tiled = [i for i, r in enumerate(repeats) if r != 1]
    if not tiled:
        return B.set_(x, contiguous=True)
    flags, sizes = [], []
    for i, d in enumerate(x.logical):
        if i in tiled:
            flags.append(True)
            sizes.append(repeats[i])
        flags.append(False)
        sizes.append(-1)
    y = B.expand(B.broadcast(x, flags), sizes)
    shape = [_times(d, repeats[i]) if i in tiled else d.full_extent
             for i, d in enumerate(x.logical)]
    return B.set_(B.reshape(y, shape), contiguous=True)


def _times(d, r: int):
    """r times axis d's size: an int, or a scalar the host computes for a symbolic size."""
    n = d.known_size()
    return r * n if n is not None else B.elementwise("mul", d.full_extent, r)
