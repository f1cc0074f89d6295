"""Lowering of `aten::embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
scale_grad_by_freq)`: the weight gradient of an embedding lookup, which every training step of a
transformer calls once per embedding table (BERT: word, position and token type).

It lowers to one EmbeddingBackwardOp (ir/exprs.py), of the op class SCATTER: the segmenter gives
it a kernel of its own, planned by the `embedding_backward` scheduler (schedule/
embedding_backward.py): one deterministic kernel, no sort and no atomics
(docs/embedding_backward.md).

Left to eager, with the reason (UnsupportedOpError): `scale_grad_by_freq=True` (each row divided
by its index's count), a `num_weights` or `padding_idx` that is not a constant, a gradient that
is not a floating tensor, indices that are not int64 / int32.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .registry import SCATTER, lowers


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
    return B.embedding_backward(grad, indices, num_weights, padding_idx)
