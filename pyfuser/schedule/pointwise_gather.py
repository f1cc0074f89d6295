"""The pointwise scheduler's checks for lookups (index_select, embedding, gather: an "ix" key
entry, pointwise_graph.py): which ones a kernel can read, and where their vectors may go.

- `gather_unsupported(e)`: why a lookup cannot be read in a kernel ("" when it can), for the
  pointwise and the reduction graphs alike;
- `gather_ok(a, inner_k)`: whether a gathered access keeps one index along the innermost axis
  (then it moves vectors like an affine access; else one element a step).

Invariants: pure functions of the Fusion and the scheduler's graph; nothing here imports from
codegen/.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.tensor import TensorView
from .pointwise_graph import GATHER_EXPRS, METADATA_EXPRS, index_axes_of

# what an index may be computed through inside a kernel (pointwise_graph.index_leaves)
_CHAIN_EXPRS = METADATA_EXPRS + (E.ElementwiseOp, E.CastOp, E.SetOp, E.FullOp)


def gather_unsupported(e) -> str:
    """Why an index_select / embedding / gather cannot be read in this kernel ("" when it
    can): its input is loaded from memory (a fusion input), its index is computed from
    inputs, iotas (positions computed from the element's index) and such lookups (read before
    the ops run) through metadata, elementwise ops, casts and fills (`index_computable`:
    GPT-2's positions `arange(seq) + past`, a pooling window's flat position), and the
    gathered axis is not a broadcast (the index must be checked against its size)."""
    x, index = e.inputs[0], e.inputs[1]
    if x.ndim == 0:
        return f"{e.op_name}: the input {x.name} has no axis to gather"
    if x.definition is not None or not index_computable(index):
        return (f"{e.op_name}: its input must be a fusion input and its index computed from "
                f"inputs, iotas or lookups of those (read before the ops run)")
    if x.logical[e.dim].is_broadcast:
        return f"{e.op_name}: the gathered axis {e.dim} of {x.name} is a size-1 broadcast axis"
    return ""


def index_computable(index) -> bool:
    """Whether index tensor `index` is a fusion input, an iota, a lookup the kernel can read,
    or computed from those through metadata, elementwise ops, casts and fills (the Fusion-level
    form of pointwise_graph.index_leaves; the chain is a DAG, each tensor looked at once)."""
    seen, stack = set(), [index]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        d = t.definition
        if d is None or isinstance(d, E.IotaOp):
            continue
        if isinstance(d, GATHER_EXPRS):
            if gather_unsupported(d):
                return False
            continue
        if not isinstance(d, _CHAIN_EXPRS):
            return False
        stack.extend(v for v in d.inputs if isinstance(v, TensorView))
    return True


def gather_ok(a, inner_k) -> bool:
    """A gathered access reads whole vectors (or one broadcast element) along the innermost
    axis when its index is the same for every element of a vector: no entry of the index's key
    (its load's or its iota's) reads that axis. (The index's own access then does not move
    along it either, so _collapse kept the axes it moves along out of the innermost group.)"""
    return inner_k not in index_axes_of(a.gather[1])
