"""Lowerings of the functional writes into a view: `aten::slice_scatter(self, src, dim, start,
end, step)` and `aten::select_scatter(self, src, dim, index)`, what AOTAutograd writes for
`t[:, 1:] = u` and `t[..., 0] = v` (T5's shifted decoder inputs, DeepSeek's keys assembled in
a new buffer, Falcon's multi-query key gradient).

Each is `where(mask, placed, self)`: `placed` is src where the slice (the select) is, as its
gradient `slice_backward` (`select_backward`) places it (aten_resize.py: a pad, stepped for a
step > 1), and `mask` the same pad of a `full(True)` of src's shape: one pointwise pass reading
self everywhere and src inside the slice, in the kernel of the ops around it. Eager's rules:
src is cast to self's dtype (a `copy_`), the result has self's shape (the region hands back
its layout), and src's sizes must be the slice's (checked by the traced graph, and by the pad
when the sizes are bound). What the gradients' lowerings refuse (a SymInt step or index) stays
an eager call with their reason.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_resize import _select_backward, _slice_backward
from .aten_shape import sizes_of
from .registry import lowers


def _scatter(self_, src, place, what: str) -> TensorView:
    """where(place(True), place(src cast to self's dtype), self)."""
    if not isinstance(self_, TensorView) or not isinstance(src, TensorView):
        raise UnsupportedOpError(f"{what} of other than two tensors")
    sizes = sizes_of(self_)
    placed = place(B.cast(src, self_.dtype) if src.dtype != self_.dtype else src, sizes)
    inside = place(B.full([d.full_extent for d in src.logical], True, DataType.Bool), sizes)
    return B.elementwise("where", inside, placed, self_)


@lowers("aten::slice_scatter", n_args=(6,), const_args=(2, 3, 4, 5))
def _slice_scatter(self_, src, dim=0, start=None, end=None, step=1):
    """self with src written into self[start:end:step] along `dim` (eager's bounds)."""
    return _scatter(self_, src, lambda t, sizes: _slice_backward(t, sizes, dim, start, end, step),
                    "aten::slice_scatter")


@lowers("aten::select_scatter", n_args=(4,), const_args=(2, 3))
def _select_scatter(self_, src, dim, index):
    """self with src written into self[..., index, ...] along `dim`."""
    return _scatter(self_, src, lambda t, sizes: _select_backward(t, sizes, dim, index),
                    "aten::select_scatter")
