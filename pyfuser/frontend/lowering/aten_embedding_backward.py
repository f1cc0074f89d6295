"""Lowering of `aten::embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
scale_grad_by_freq)`: the weight gradient of an embedding lookup, which every training step of a
transformer calls once per embedding table (BERT: word, position and token type).

It lowers to one EmbeddingBackwardOp (ir/exprs.py), of the op class SCATTER: the segmenter gives
it a kernel of its own, planned by the `embedding_backward` scheduler (schedule/
embedding_backward.py): one deterministic kernel, no sort and no atomics
(docs/embedding_backward.md).

A table of at most SMALL_TABLE rows (BERT's token types: 2) lowers instead to one sum over the
tokens of the gradient masked by each row's index, `sum_t where(indices[t] == v, grad[t], 0)`:
an ordinary reduction of [num_weights, tokens, H] that the reduction schedulers split over the
tokens across the whole GPU (deterministic, float32 accumulation for half / bfloat16), reading
the gradient num_weights times. The scatter kernel gives each tile of rows one block that walks
every token in order: on an H200 (indices [8, 512], H 768) 146 µs for a two-row table against
eager's 113 µs. An index outside the table matches no row here (the scatter kernel traps on
it, as the forward lookup of the same indices already has).

Left to eager, with the reason (UnsupportedOpError): `scale_grad_by_freq=True` (each row divided
by its index's count), a `num_weights` or `padding_idx` that is not a constant, a gradient that
is not a floating tensor, indices that are not int64 / int32.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_pointwise import ew
from .registry import SCATTER, lowers

SMALL_TABLE = 4      # rows up to which the table's gradient is a masked sum (module docstring)


@lowers("aten::embedding_dense_backward", op_class=SCATTER, n_args=(5,), const_args=(2, 3, 4))
def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise UnsupportedOpError("embedding_dense_backward with scale_grad_by_freq=True (rows "
                                 "scaled by their index's count) is left to eager")
    if not isinstance(grad, TensorView) or not grad.dtype.is_floating or grad.ndim < 1:
        raise UnsupportedOpError("embedding_dense_backward: the gradient must be a floating tensor")
    if not isinstance(indices, TensorView) or indices.dtype not in (DataType.Int, DataType.Int32):
        raise UnsupportedOpError("embedding_dense_backward: the indices must be an int64 or int32 "
                                 "tensor")
    if not isinstance(num_weights, int) or not isinstance(padding_idx, int):
        raise UnsupportedOpError("embedding_dense_backward: num_weights and padding_idx must be "
                                 "constant ints")
    if 0 < num_weights <= SMALL_TABLE:
        return _small_table(grad, indices, num_weights, padding_idx)
    return B.embedding_backward(grad, indices, num_weights, padding_idx)


def _small_table(grad, indices, num_weights, padding_idx):
    """[num_weights, H]: each row the sum of the gradient rows of its tokens, a reduction over
    the tokens of [num_weights, tokens, H] (the padding row masked out: zero, as eager)."""
    if indices.ndim == 0:
        indices = B.unsqueeze(indices, 0)
    if indices.ndim != grad.ndim - 1:
        raise UnsupportedOpError("embedding_dense_backward: the gradient's rank is not the "
                                 "indices' plus one")
    compute = DataType.Double if grad.dtype is DataType.Double else DataType.Float
    rows = B.iota(num_weights)
    k = indices.ndim
    # axes: [row, *token axes, column]
    hit = ew("eq", B.broadcast(indices, [True] + [False] * k + [True]),
             B.broadcast(rows, [False] + [True] * (k + 1)))
    if 0 <= padding_idx < num_weights:
        # the padding row matches no token (its number is not replaced by a value an index
        # outside the table could hold: eager's CPU op drops a -1)
        keep = ew("ne", rows, padding_idx)
        hit = ew("logical_and", hit, B.broadcast(keep, [False] + [True] * (k + 1)))
    vals = ew("where", hit, B.broadcast(B.cast(grad, compute), [True] + [False] * (k + 1)),
              B.constant(0.0, compute))
    return B.cast(B.reduction("sum", vals, list(range(1, k + 1))), grad.dtype)
