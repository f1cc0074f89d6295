"""Lowerings of the ops that read a tensor at positions another tensor holds: embedding lookups,
index_select and gather.

`aten::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)` (a 2-D weight, an
integer index of any rank: the rows of weight at the indices; the last three arguments change
only the backward, `embedding_dense_backward`, lowered in aten_embedding_backward.py) and `aten::index_select(x,
dim, index)` (an index of rank 0 or 1) lower to an IndexSelectOp, `aten::gather(x, dim, index)`
(an index of x's rank) to a GatherOp, `aten::flip(x, dims)` to an IndexSelectOp per flipped
axis at an iota counting down; a lookup's index may itself be looked up (BERT's token
types: a gather from a buffer at the positions, then the token-type embedding). The pointwise
and reduction schedulers read the input at the index's values in the kernel that consumes it
(schedule/pointwise_graph.py's "ix" keys), so a transformer's token and position embeddings,
the adds after them and the layer norm after those are one kernel, with 16-byte vectors along
the rows. An index outside the gathered axis is an error, as in eager: the kernel checks each
index before its load (a device-side trap on the GPU, an IndexError on the CPU). Only indices
whose rows are read are checked, as in Inductor's kernels: an index whose row no output
element reads (a slice of the lookup drops it, or the table's rows are empty) gives no error
where eager's lookup, which reads every index, raises. A lookup in an axis of size 0 by an
index with elements raises on the host (ir/shapes.py), as eager does for any index there.

`aten::index(x, [i0, ..., ik-1])` (advanced indexing of x's k leading axes by integer tensors,
broadcast together: Swin's relative-position bias table `t[i]`, CLIP's pooling
`h[arange(b), ends]`) is the same lookup: for k = 1, `x[i]` after eager's wrap of negative
indices (`i + n` where `i < 0`, n the first extent, an expanded one's expanded size; what
stays outside [0, n) is the lookup's error); for k > 1, of x viewed with its k leading axes
as one (the view's -1 where they are symbolic) at `sum(wrapped i_j * stride_j)`, or at -1 (the
lookup's error) where any index is outside its own axis: eager raises there, and a flat row of
another axis' overflow would exist. `aten::index_put(x, indices, values, accumulate=True)`
(that indexing's gradient) is `x + embedding_backward(values, flat, rows)` (half / bfloat16
in float32, rounded once, as eager's CUDA kernel; the scatter
kernel, small tables too: it traps on an index outside the table; a table of no rows stays
eager's, which raises for any index; rows of several axes summed as rows of their product)
where the flattened table has a row count of at most MAX_SCATTER_ROWS (a constant one
checked here, a symbolic one, a graph input's, by the scheduler at run time): each row the
sum of the values indexed to it, in a fixed order. `None` entries (an index of a later
axis), boolean masks and `accumulate=False` stay eager. The TorchScript graph fuser groups
only the one-index form (its node check). `aten::index_add(x, 0, index, source)` (alpha 1, x
of any rank and constant sizes whose rows hold at least MIN_INDEX_ADD_WIDTH elements, a
Mixture-of-Experts layer's sum of its experts' outputs at their tokens) is the same sum at the
rows, its index not wrapped (eager raises for a negative one, and so does the kernel).

Anything else (a weight that is not 2-D, an index that is not an integer tensor) raises
UnsupportedOpError: the node stays an eager op, whose own error eager then gives.
"""
from __future__ import annotations

import math

import torch

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from ...schedule import embedding_backward as EB
from ..torchscript.types import TensorType
from . import aten_embedding_backward  # noqa: F401  (the lookup's backward: its table entry)
from .aten_pointwise import ew
from .aten_shape import row_major_position, sizes_of
from .registry import SCATTER, lowers

_INDEX_DTYPES = (DataType.Int, DataType.Int32)
# the rows past which index_put's and index_add's tables stay eager's (the scatter kernel has
# every block read every index; schedule/embedding_backward.py; docs/compile_backend.md)
MAX_SCATTER_ROWS = EB.MAX_SCATTER_ROWS
# index_add's rows narrower than this stay eager's: the scatter kernel gives a block's columns
# to its threads (128 for rows up to 128 elements), so a narrow row leaves most of them idle,
# where eager's index_add adds with atomics (H200, thirty-third session: rows of 1 and 64
# elements 3-7x slower than eager, of 768 1.3-1.9x faster; docs/benchmarks.md)
MIN_INDEX_ADD_WIDTH = 128


def _index(index, what: str) -> TensorView:
    if not isinstance(index, TensorView) or index.dtype not in _INDEX_DTYPES:
        raise UnsupportedOpError(f"{what}: the indices must be an int64 or int32 tensor")
    return index


@lowers("aten::embedding", n_args=(2, 3, 4, 5), const_args=(2, 3, 4))
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """torch.embedding: weight[indices] (the padding row and the gradient flags are the
    backward's business)."""
    if not isinstance(weight, TensorView) or weight.ndim != 2:
        raise UnsupportedOpError("embedding: the weight must be a 2-D tensor")
    return B.embedding(weight, _index(indices, "embedding"))


@lowers("aten::gather", n_args=(3, 4), const_args=(1, 3))
def _gather(x, dim, index, sparse_grad=False):
    """torch.gather: out[..., i, ...] = x[..., index[..., i, ...], ...] along `dim` (the index
    of x's rank; eager checks its sizes against x's, as the execute-time bindings do)."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("gather: the input must be a tensor of rank 1 or more")
    if _index(index, "gather").ndim != x.ndim:
        raise UnsupportedOpError("gather: the index must have the input's rank")
    if not -x.ndim <= dim < x.ndim:
        raise UnsupportedOpError(f"gather: dim {dim} out of range")
    return B.gather(x, index, dim % x.ndim)


@lowers("aten::index_select", n_args=(3,), const_args=(1,))
def _index_select(x, dim, index):
    """An index of rank 0 or 1 along `dim` of an input of rank 1 or more (eager's index_select
    of a 0-dim input has no axis to gather: left to eager)."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("index_select: the input must be a tensor of rank 1 or more")
    if _index(index, "index_select").ndim > 1:
        raise UnsupportedOpError("index_select: the index must have rank 0 or 1")
    if not -x.ndim <= dim < x.ndim:
        raise UnsupportedOpError(f"index_select: dim {dim} out of range")
    return B.index_select(x, index, dim % x.ndim)


@lowers("aten::flip", n_args=(2,), const_args=(1,))
def _flip(x, dims):
    """torch.flip: x's elements in reverse order along each axis of `dims`, as a lookup per
    axis at the positions n - 1 - i (an iota counting down from the axis' last position), read
    in the kernel that consumes it as an index_select's are. Axes of size 1 or expanded (every
    position holds the same values) need no lookup; with none left the result is a copy.
    Repeated or out-of-range dims are left to eager, which raises."""
    if not isinstance(x, TensorView):
        raise UnsupportedOpError("flip: the input must be a tensor")
    if not isinstance(dims, (list, tuple)) or any(type(d) is not int for d in dims):
        raise UnsupportedOpError("flip: dims must be a list of ints")
    n = max(x.ndim, 1)                  # eager wraps dims of a 0-dim tensor as rank 1's
    axes = [d % n for d in dims if -n <= d < n]
    if len(axes) != len(dims) or len(set(axes)) != len(axes):
        raise UnsupportedOpError(f"flip: dims {list(dims)} repeat an axis or are out of range "
                                 f"for rank {x.ndim} (left to eager, which raises)")
    out = x
    for d in sorted(axes) if x.ndim else []:
        ax = x.logical[d]
        if ax.is_broadcast:
            continue
        size = ax.extent
        last = size.value - 1 if size.is_const else B.elementwise("sub", size, 1)
        out = B.index_select(out, B.iota(size, last, -1, DataType.Int), d)
    return B.set_(x) if out is x else out


def _leading_index(x, indices, what: str) -> tuple[TensorView, TensorView]:
    """(table, flat): `x[i0, ..., ik-1]` is `embedding(table, flat)` for k integer index
    tensors of x's first k axes (broadcast together). For k = 1 the table is x and flat is i0
    with negative entries wrapped as eager does (i + n). For k > 1 the first k axes (constant
    extents) are flattened into the table's rows and flat = sum of the wrapped indices times
    their row-major strides, or -1 where any index is outside its own axis (so that the lookup
    raises as eager does, never reading a row another axis' overflow lands on)."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError(f"{what}: the input must be a tensor of rank 1 or more")
    if not isinstance(indices, (list, tuple)) or not 1 <= len(indices) <= x.ndim or \
            any(i is None for i in indices):
        raise UnsupportedOpError(f"{what}: only index tensors of the leading axes (no None "
                                 f"entries) are lowered")
    idx = [_index(i, what) for i in indices]
    if len(idx) == 1:
        n = x.logical[0].full_extent
        return x, ew("where", ew("lt", idx[0], 0), ew("add", idx[0], n), idx[0])
    sizes = sizes_of(x)
    wrapped = []
    for i, n in zip(idx, sizes):
        i = B.cast(i, DataType.Int)
        wrapped.append(ew("where", ew("lt", i, 0), ew("add", i, n), i))
    ok = None
    for w, n in zip(wrapped, sizes):
        inside = ew("logical_and", ew("ge", w, 0), ew("lt", w, n))
        ok = inside if ok is None else ew("logical_and", ok, inside)
    flat, count = row_major_position(wrapped, sizes[:len(idx)])
    rows = count if isinstance(count, int) else -1      # a symbolic count: the view's -1
    return B.reshape(x, [rows] + sizes[len(idx):]), ew("where", ok, flat, -1)


def _one_first_axis_index(node) -> str | None:
    """The graph fuser's check of a TorchScript `aten::index` node: its index list is built
    in the graph from one tensor (not None; an integer one where its dtype is known). Falcon's
    constant lists of three index tensors, `x[:, :, i]` (None entries) and a boolean mask stay
    out of the fusion groups."""
    items = node.inputs[1].node
    if items.kind != "prim::ListConstruct" or len(items.inputs) != 1 or \
            not isinstance(items.inputs[0].type, TensorType):
        return "only one index tensor, of the first axis, is grouped"
    dtype = items.inputs[0].type.dtype
    if dtype is not None and dtype not in (torch.int64, torch.int32):
        return f"the index must be an int64 or int32 tensor, not {dtype}"
    return None


@lowers("aten::index", n_args=(2,), check=_one_first_axis_index)
def _index_tensor(x, indices):
    """x[i0, ..., ik-1] for integer tensors of x's leading axes (module docstring)."""
    return B.embedding(*_leading_index(x, indices, "index"))


@lowers("aten::index_put", op_class=SCATTER, n_args=(4,), const_args=(3,))
def _index_put(x, indices, values, accumulate=False):
    """x with values added at the indexed rows (accumulate=True, module docstring)."""
    if not accumulate:
        raise UnsupportedOpError("index_put without accumulate (a repeated index's last write "
                                 "wins in no fixed order) is left to eager")
    table, flat = _leading_index(x, indices, "index_put")
    return _add_at_rows(x, table, flat, values, "index_put")


@lowers("aten::index_add", op_class=SCATTER, n_args=(4, 5), const_args=(1, 4))
def _index_add(x, dim, index, source, alpha=1):
    """torch.index_add along axis 0: x with source's rows added at the rows `index` names
    (`index_put`'s sum at the rows, module docstring); an index outside x's rows, negative
    ones included (eager wraps none), stops the kernel as eager raises. Other axes, an alpha
    other than 1, a table of symbolic sizes (a graph input's) and rows of fewer than
    MIN_INDEX_ADD_WIDTH elements are left to eager (its atomic adds are faster there)."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("index_add: the input must be a tensor of rank 1 or more")
    if dim % x.ndim != 0 or not -x.ndim <= dim < x.ndim:
        raise UnsupportedOpError("index_add: only axis 0 is lowered")
    if type(alpha) not in (int, float) or alpha != 1:
        raise UnsupportedOpError("index_add: only alpha=1 is lowered")
    if _index(index, "index_add").ndim != 1:
        raise UnsupportedOpError("index_add: the index must be a vector")
    sizes = sizes_of(x)
    if not all(isinstance(n, int) for n in sizes):
        raise UnsupportedOpError("index_add: a table of sizes known only at run time (a graph "
                                 "input's) is left to eager, whose atomic adds beat the scatter "
                                 "kernel on narrow rows")
    width = math.prod(sizes[1:])
    if width < MIN_INDEX_ADD_WIDTH:
        raise UnsupportedOpError(f"index_add: rows of {width} elements (fewer than "
                                 f"{MIN_INDEX_ADD_WIDTH}) are left to eager, whose atomic adds "
                                 "are faster there")
    return _add_at_rows(x, x, B.cast(index, DataType.Int), source, "index_add")


def _add_at_rows(x, table, flat, values, what: str):
    """x + the sum of `values`' rows at the rows of `table` (x, or x viewed with leading axes
    flattened) that `flat` names, by the scatter kernel (index_put's and index_add's); rows of
    several axes are summed as rows of one (the values viewed so), then viewed as x again."""
    # the row count: a constant, or a symbol (a graph input's rows: the scheduler refuses more
    # than MAX_SCATTER_ROWS, or none, at run time)
    sizes = sizes_of(table)
    n = sizes[0]
    if n == 0 and isinstance(n, int):    # eager raises for any index of an empty axis
        raise UnsupportedOpError(f"{what}: a table of no rows is left to eager (its error for "
                                 "any index)")
    if isinstance(n, int) and n > MAX_SCATTER_ROWS:
        raise UnsupportedOpError(f"{what}: a table of {n} rows (more than {MAX_SCATTER_ROWS}) "
                                 f"is left to eager: every block of the scatter kernel reads "
                                 f"every index")
    if not isinstance(values, TensorView) or values.dtype != x.dtype or not x.dtype.is_floating:
        raise UnsupportedOpError(f"{what}: the values must be a floating tensor of the "
                                 "input's dtype")
    want = [a.extent for a in flat.logical] + [a.extent for a in table.logical[1:]]
    if values.ndim != len(want) or not all(_same(a.extent, b)
                                           for a, b in zip(values.logical, want)):
        raise UnsupportedOpError(f"{what}: values broadcast to the indexed rows are left "
                                 "to eager")
    if table.ndim > 2:                   # rows of several axes: of one, their product
        trailing = sizes[1:]
        width = -1 if any(not isinstance(t, int) for t in trailing) else math.prod(trailing)
        if width == 0:
            raise UnsupportedOpError(f"{what}: rows of no elements are left to eager")
        values = B.reshape(values, sizes_of(values)[:flat.ndim] + [width])
    # half / bfloat16: the values summed and added to x in float32, rounded once, as eager's
    # CUDA kernel does (its CPU kernel rounds after each add); a sum rounded to the values'
    # dtype before the add was several ulps off where x and the sum nearly cancel
    acc = x.dtype.compute
    if acc is not x.dtype:
        values = B.cast(values, acc)
    # the scatter kernel, even for small tables: it traps on an index outside the table
    # (embedding's small-table sum would drop it, trusting a forward lookup index_put lacks)
    if table.ndim == 1:                  # a vector: rows of one element
        rows = B.squeeze(B.embedding_backward(B.unsqueeze(values, values.ndim), flat, n), [1])
    else:
        rows = B.embedding_backward(values, flat, n)
    if rows.ndim != x.ndim:
        rows = B.reshape(rows, sizes_of(x))
    out = ew("add", x, rows)
    return B.cast(out, x.dtype) if out.dtype is not x.dtype else out


def _same(a, b) -> bool:
    """A values extent `a` that is the indexed rows' extent `b`, not broadcast to it: equal
    constants, or one of them a symbol (a symbolic size is never 1: Dynamo specializes sizes
    0 and 1, and the graph's own check makes a constant and a symbol agree)."""
    if a.value is not None and b.value is not None:
        return a.value == b.value
    return a.value != 1 and b.value != 1
