"""Lowerings of the ops that read a tensor at positions another tensor holds: embedding lookups,
index_select and gather.

`aten::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)` (a 2-D weight, an
integer index of any rank: the rows of weight at the indices; the last three arguments change
only the backward, `embedding_dense_backward`, lowered in aten_embedding_backward.py) and `aten::index_select(x,
dim, index)` (an index of rank 0 or 1) lower to an IndexSelectOp, `aten::gather(x, dim, index)`
(an index of x's rank) to a GatherOp; a lookup's index may itself be looked up (BERT's token
types: a gather from a buffer at the positions, then the token-type embedding). The pointwise
and reduction schedulers read the input at the index's values in the kernel that consumes it
(schedule/pointwise_graph.py's "ix" keys), so a transformer's token and position embeddings,
the adds after them and the layer norm after those are one kernel, with 16-byte vectors along
the rows. An index outside the gathered axis is an error, as in eager: the kernel checks each
index before its load (a device-side trap on the GPU, an IndexError on the CPU). Only indices
whose rows are read are checked, as in Inductor's kernels: an index whose row no output
element reads (a slice of the lookup drops it, or the table's rows are empty) gives no error
where eager's lookup, which reads every index, raises.

`aten::index(x, [i])` (advanced indexing of the first axis by one integer tensor: Swin's
relative-position bias table) is the same lookup, `x[i]` with i's axes then x's others, after
eager's wrap of negative indices (`i + n` where `i < 0`, n the first extent; what stays outside
[0, n) is the lookup's error); `aten::index_put(x, [i], values, accumulate=True)` (that
indexing's gradient) is `x + embedding_backward(values, i, n)` (the scatter kernel, for every
table size: it traps on an index outside the table) for a 1-D or 2-D x of a constant first
extent: each row the sum of the values indexed to it, in a fixed order. Indices of
several axes, `None` entries, boolean masks and `accumulate=False` stay eager.

Anything else (a weight that is not 2-D, an index that is not an integer tensor) raises
UnsupportedOpError: the node stays an eager op, whose own error eager then gives.
"""
from __future__ import annotations

import torch

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from . import aten_embedding_backward  # noqa: F401  (the lookup's backward: its table entry)
from .aten_pointwise import ew
from .registry import SCATTER, lowers

_INDEX_DTYPES = (DataType.Int, DataType.Int32)


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


def _first_axis_index(x, indices, what: str) -> TensorView:
    """The one integer index of x's first axis in `indices`, negative entries wrapped as eager
    does (i + n)."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError(f"{what}: the input must be a tensor of rank 1 or more")
    if not isinstance(indices, (list, tuple)) or len(indices) != 1 or indices[0] is None:
        raise UnsupportedOpError(f"{what}: only one index tensor, of the first axis, is lowered")
    i = _index(indices[0], what)
    n = x.logical[0].extent
    return ew("where", ew("lt", i, 0), ew("add", i, n), i)


def _one_first_axis_index(node) -> str | None:
    """The graph fuser's check of a TorchScript `aten::index` node: its index list is built
    in the graph from one tensor (not None; an integer one where its dtype is known). Falcon's
    `x[:, :, i]` (None, None, i) and a boolean mask stay out of the fusion groups."""
    lst = node.inputs[1]
    if lst.node.kind != "prim::ListConstruct" or len(lst.node.inputs) != 1:
        return "only one index tensor, of the first axis, is lowered"
    t = lst.node.inputs[0].type
    dtype = getattr(t, "dtype", False)
    if dtype is False:
        return "only one index tensor, of the first axis, is lowered"
    if dtype is not None and dtype not in (torch.int64, torch.int32):
        return f"the index must be an int64 or int32 tensor, not {dtype}"
    return None


@lowers("aten::index", n_args=(2,), check=_one_first_axis_index)
def _index_tensor(x, indices):
    """x[i] for one integer tensor i of x's first axis (module docstring)."""
    return B.embedding(x, _first_axis_index(x, indices, "index"))


@lowers("aten::index_put", op_class=SCATTER, n_args=(4,), const_args=(3,))
def _index_put(x, indices, values, accumulate=False):
    """x with values added at rows i (accumulate=True, module docstring)."""
    if not accumulate:
        raise UnsupportedOpError("index_put without accumulate (a repeated index's last write "
                                 "wins in no fixed order) is left to eager")
    i = _first_axis_index(x, indices, "index_put")
    n = x.logical[0].extent.value if x.ndim <= 2 else None
    if not isinstance(n, int) or isinstance(n, bool):
        raise UnsupportedOpError("index_put: only a 1-D or 2-D input of a constant first extent "
                                 "is lowered")
    if not isinstance(values, TensorView) or values.dtype != x.dtype or not x.dtype.is_floating:
        raise UnsupportedOpError("index_put: the values must be a floating tensor of the input's dtype")
    want = [a.extent for a in i.logical] + [a.extent for a in x.logical[1:]]
    if values.ndim != len(want) or not all(_same(a.extent, b)
                                           for a, b in zip(values.logical, want)):
        raise UnsupportedOpError("index_put: values broadcast to the indexed rows are left to eager")
    # the scatter kernel, whatever the table's size: it traps on an index outside the table
    # (embedding's small-table sum would drop it, trusting a forward lookup index_put lacks)
    if x.ndim == 1:                  # a vector: rows of one element
        rows = B.embedding_backward(B.unsqueeze(values, values.ndim), i, n)
        return ew("add", x, B.squeeze(rows, [1]))
    return ew("add", x, B.embedding_backward(values, i, n))


def _same(a, b) -> bool:
    """A values extent `a` that is the indexed rows' extent `b`, not broadcast to it: equal
    constants, or one of them a symbol (a symbolic size is never 1: Dynamo specializes sizes
    0 and 1, and the graph's own check makes a constant and a symbol agree)."""
    if a.value is not None and b.value is not None:
        return a.value == b.value
    return a.value != 1 and b.value != 1
