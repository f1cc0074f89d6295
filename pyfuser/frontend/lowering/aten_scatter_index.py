"""Lowerings of the scatters at an index tensor: `aten::scatter_add(x, dim, index, src)` (a
gather's gradient: a Mixture-of-Experts router's top-k weights) and `aten::scatter.value(x,
dim, index, value)` (a router's mask of chosen experts).

Both go through the scatter kernel (schedule/embedding_backward.py), x seen as a table of
numel(x) rows of one element: each element of the index names the row-major position of x it
writes, its own position with `index[p]` along `dim` (`flat`), and the kernel sums the values
at each position in a fixed order (the index's row-major order), deterministic where eager's
CUDA kernel adds with atomics:
- scatter_add: x + those sums, through index_put's `add_at_rows` (aten_indexing.py: half /
  bfloat16 summed in float32 and rounded once, a floating x only);
- scatter.value: where(count > 0, value, x), the count the sum of ones at each position: a
  position written several times gets the one value, so no write order matters.
An index outside [0, x.size(dim)) makes its flat position -1, which stops the kernel (a trap
on the GPU, an IndexError on the CPU) where eager raises. Eager's shape rules: index has x's
rank and src's; index's extents are at most x's off `dim` (only index's extent is read of
src). Here src must have index's extents exactly, and x at most MAX_SCATTER_ROWS elements
(the lowering's check, or the scheduler's at run time for symbolic sizes); `scatter.src`
(which element of several written to one position wins is eager's order, not a sum),
`scatter.reduce` and `scatter_reduce` stay eager's, as does anything else refused here
(UnsupportedOpError, with the reason).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_indexing import MAX_SCATTER_ROWS, add_at_rows, same_extent
from .aten_pointwise import ew
from .aten_shape import row_major_position, sizes_of
from .registry import SCATTER, lowers


def _checked(x, dim, index, what: str) -> int:
    """dim in [0, rank), after eager's rank rules (UnsupportedOpError for what is refused)."""
    if not isinstance(x, TensorView) or not isinstance(index, TensorView) or x.ndim == 0:
        raise UnsupportedOpError(f"{what}: only tensors of rank 1 or more are lowered")
    if index.dtype is not DataType.Int:
        raise UnsupportedOpError(f"{what}: the index must be an int64 tensor")
    if index.ndim != x.ndim:
        raise UnsupportedOpError(f"{what}: the index must have the input's rank")
    if not isinstance(dim, int) or isinstance(dim, bool) or not -x.ndim <= dim < x.ndim:
        raise UnsupportedOpError(f"{what}: dim {dim!r} is not a constant axis of the input")
    return dim % x.ndim


def _segmented(x, d, index) -> bool:
    """Whether each row of the index along `d` writes only its own row of x (a segment of the
    scatter), the rows counted with `d` moved last: where the index has x's extents on every
    other axis but the outermost (equal constants, or the same symbol), on which it may have
    fewer (its rows are then x's first ones): always for a matrix."""
    others = [a for a in range(x.ndim) if a != d]
    for a in others[1:]:
        k, m = index.logical[a].full_extent, x.logical[a].full_extent
        if k is not m and not (k.is_const and m.is_const and k.value == m.value):
            return False
    return True


def _last(t, d):
    """t with axis d moved last (a permute; t itself when it is last already)."""
    n = t.ndim
    return t if d == n - 1 else B.permute(t, [a for a in range(n) if a != d] + [d])


def _back(t, d):
    """The inverse of _last."""
    n = t.ndim
    if d == n - 1:
        return t
    order = [a for a in range(n) if a != d] + [d]
    return B.permute(t, [order.index(a) for a in range(n)])


def _flat(x, d, index, what: str):
    """(flat, numel(x)): the row-major position in x each index element writes, -1 where the
    index is outside x's axis `d` or the element's own coordinate outside x's other axes
    (module docstring); numel an int, or a symbolic Int Scalar."""
    sizes = sizes_of(x)
    coords = []
    inside = ew("logical_and", ew("ge", index, 0), ew("lt", index, sizes[d]))
    for a, (axis, n) in enumerate(zip(index.logical, sizes)):
        if a == d:
            coords.append(index)
            continue
        # the index element's own coordinate along axis a (an iota broadcast to its rank)
        coord = B.broadcast(B.iota(axis.full_extent), [b != a for b in range(index.ndim)])
        coords.append(coord)
        k = axis.full_extent
        if k.is_const and isinstance(n, int):
            if k.value > n:
                raise UnsupportedOpError(f"{what}: the index has {k.value} elements along axis "
                                         f"{a}, more than the input's {n} (eager raises)")
        elif k is not n:           # sizes known only at run time: no position past the axis
            inside = ew("logical_and", inside, ew("lt", coord, n))
    pos, count = row_major_position(coords, sizes)
    return ew("where", inside, pos, -1), count


def _layout(x, dim, index, src, what: str):
    """(x, index, src, d, segment, back): the operands as the scatter kernel takes them: with
    the scattered axis moved last (permutes) where each row of the index writes one segment
    of x's rows (_segmented), `segment` then x's extent along d (the segment's rows), else
    the operands as given and segment None; `back(t)` undoes the move."""
    d = _checked(x, dim, index, what)
    if not _segmented(x, d, index):
        return x, index, src, d, None, (lambda t: t)
    x, index = _last(x, d), _last(index, d)
    src = _last(src, d) if isinstance(src, TensorView) and src.ndim == x.ndim else src
    segment = sizes_of(x)[-1]
    return x, index, src, x.ndim - 1, segment, (lambda t: _back(t, d))


@lowers("aten::scatter_add", op_class=SCATTER, n_args=(4,), const_args=(1,))
def _scatter_add(x, dim, index, src):
    """x with src's elements added at the positions the index names along `dim`."""
    if not isinstance(src, TensorView) or not isinstance(index, TensorView) or \
            src.ndim != index.ndim or \
            not all(same_extent(a.extent, b.extent) for a, b in zip(src.logical, index.logical)):
        raise UnsupportedOpError("scatter_add: src of other extents than the index's is left "
                                 "to eager")
    xl, il, sl, d, segment, back = _layout(x, dim, index, src, "scatter_add")
    flat, _ = _flat(xl, d, il, "scatter_add")
    table = xl if xl.ndim == 1 else B.reshape(xl, [-1])
    return back(add_at_rows(xl, table, flat, sl, "scatter_add", segment))


@lowers("aten::scatter", op_class=SCATTER, n_args=(4,), const_args=(1,))
def _scatter(x, dim, index, value):
    """scatter.value: x with `value` (a number) at the positions the index names."""
    if isinstance(value, TensorView):
        raise UnsupportedOpError("scatter.src (which of several elements written to one "
                                 "position wins is eager's order) is left to eager")
    if type(value) not in (int, float, bool):
        raise UnsupportedOpError(f"scatter: the value must be a constant number, got {value!r}")
    if isinstance(x, TensorView) and not x.dtype.is_floating and isinstance(value, float):
        raise UnsupportedOpError("scatter: a float value into an integer tensor is left to eager")
    xl, il, _, d, segment, back = _layout(x, dim, index, None, "scatter")
    flat, n = _flat(xl, d, il, "scatter")
    if isinstance(n, int) and not 0 < n <= (MAX_SCATTER_ROWS if segment is None else n):
        raise UnsupportedOpError(f"scatter: an input of {n} elements is left to eager (none: "
                                 f"its error for any index; more than {MAX_SCATTER_ROWS}: "
                                 "every block of the scatter kernel reads every index)")
    ones = B.full([a.full_extent for a in il.logical] + [1], 1.0, DataType.Float)
    counts = B.embedding_backward(ones, flat, n, segment=segment)   # [numel(x), 1] counts
    hit = ew("gt", B.reshape(counts, sizes_of(xl)), 0.0)
    out = ew("where", hit, value, xl)
    return back(B.cast(out, x.dtype) if out.dtype is not x.dtype else out)
