"""The embedding_backward scheduler: aten.embedding_dense_backward as one deterministic kernel.

It takes a Fusion that is one EmbeddingBackwardOp of two fusion inputs (the gradient [*, H] and
the indices, any rank), optionally followed by an epilogue: pointwise ops (elementwise ops and
casts) of its output [num_weights, H], of fusion inputs of that same shape (no broadcast axes)
and of constants, such as a tied embedding's other gradient added to it (BERT's and GPT-2's
word embeddings are also their output projection: `add(mm gradient, embedding gradient)`, a
[num_weights, H] tensor written and read again when it is a kernel of its own). The fusion's one
output is the epilogue's last value (the EmbeddingBackwardOp's output without one). The kernel
(codegen/embedding_backward_lowering.py; docs/embedding_backward.md) gives each block a tile of
`rows` vocabulary rows x a slice of `block * cols` columns, accumulated in shared memory; the
block walks every token in order, `block * unroll` tokens a chunk, compacts the chunk's tokens
whose index falls in its rows (warp ballots, then a prefix over the warps) and adds their
gradient rows in token order; no sort, no atomics, one write of the result (the epilogue
computed at that write from the sum rounded to the gradient's dtype, as eager's separate ops
see it, and the epilogue inputs' elements at the same place).

`plan(fusion, inputs) -> EmbeddingBackwardParams` picks, from the sizes:
- block: 256 threads (128 where H <= 128); cols: the columns a thread owns, ceil(H / block)
  up to 4, so one slice holds H <= 1024 (the gradient's rows are then read once in all);
- rows: what fits the static shared-memory limit (48 KB less the chunk's match lists and
  warp counts), fewer where that leaves under two blocks per SM of the 132 of an H200 (every
  block reads all the indices, so rows are not cut below what fills the machine twice);
- match_unroll: matched rows whose gradient loads are issued together: 4, 8 where a block
  expects 64 matches or more, 32 (and one column a thread) from 256 on (few rows gathering
  many tokens: a token-type table, whose block walks every token's row in one chain of loads);
- index_type from the layout signature (64-bit where a tensor spans 2^31 elements), and
  whether the indices and the gradient are dense row-major (signature facts: else the kernel
  indexes them through their sizes and strides).
These choices tune speed only; the kernel is correct for any of them (size_class puts them in
the kernel signature, so a new size class plans a new kernel). The row count itself is no
part of the kernel: it reads it from the output's size, so a table of a symbolic row count
(index_put's into a graph input) reuses its kernel for a new count of the same
size class. Such a table is refused at run time past MAX_SCATTER_ROWS rows (every block reads
every index: eager's op is then faster), as the lowering refuses a constant one.

Invariant: never imports codegen/; correctness depends only on the layout signature.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import exprs as E
from ..ir.dtypes import DataType
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import layout as L

NAME = "embedding_backward"
SHARED_LIMIT = 48 * 1024       # bytes of static shared memory a block may hold
SMS = 132                      # an H200's SMs: the grid aims at two blocks for each
MAX_COLS = 4                   # columns a thread owns in its slice
UNROLL = 4                     # tokens a thread tests in one chunk
WARP = 32
HEAVY = 256                    # a block's expected matches from which it loads HEAVY_UNROLL
HEAVY_UNROLL = 32              # gradient rows at a time
# the scatter kernel gives each block ~96 rows of a table of narrow rows and has every block
# read every index: index_put's and index_add's tables (whose rows are often of one element)
# are taken up to two waves of such blocks on an H200 (each index read at most 264 times);
# larger ones are eager's (a constant count refused by the lowering, lowering/aten_indexing.py,
# a symbolic one by run_check)
MAX_SCATTER_ROWS = 96 * 264


EPILOGUE_EXPRS = (E.ElementwiseOp, E.CastOp)


def embedding_op(fusion):
    """The fusion's one EmbeddingBackwardOp, None where it has none or several."""
    ops = [e for e in fusion.used_exprs() if isinstance(e, E.EmbeddingBackwardOp)]
    return ops[0] if len(ops) == 1 else None


def epilogue(fusion) -> list:
    """The exprs after the EmbeddingBackwardOp, in program order (module docstring)."""
    e = embedding_op(fusion)
    return [x for x in fusion.used_exprs() if x is not e]


def epilogue_inputs(fusion) -> list:
    """The fusion inputs the epilogue reads, once each, in the order it first reads them."""
    out: list = []
    for x in epilogue(fusion):
        for v in x.inputs:
            if isinstance(v, TensorView) and v in fusion.inputs and all(v is not u for u in out):
                out.append(v)
    return out


def _epilogue_refusal(fusion, e) -> str:
    """Why the exprs besides `e` are no epilogue of it ("" when they are one)."""
    known = {id(e.output)}
    for x in epilogue(fusion):
        if not isinstance(x, EPILOGUE_EXPRS):
            return f"{x.op_name} beside the embedding_backward (only pointwise ops after it)"
        for v in x.inputs:
            if not isinstance(v, TensorView):
                if not v.is_const:
                    return f"the epilogue's scalar {v.name} is not a constant"
            elif id(v) not in known and (v not in fusion.inputs or v.ndim != 2 or
                                         any(d.is_broadcast for d in v.logical)):
                return f"{v.name}: the epilogue reads only [num_weights, H] inputs"
        known.add(id(x.outputs[0]))
    return ""


def can_schedule(fusion) -> tuple[bool, str]:
    e = embedding_op(fusion)
    if e is None:
        return False, "not a single embedding_backward"
    if not all(isinstance(v, TensorView) and v in fusion.inputs for v in e.inputs):
        return False, "the gradient and the indices must be fusion inputs"
    why = _epilogue_refusal(fusion, e)
    if why:
        return False, why
    ep = epilogue(fusion)
    if fusion.outputs != [ep[-1].outputs[0] if ep else e.output]:
        return False, "the weight gradient (or its epilogue's last value) must be the only output"
    if e.inputs[0].dtype not in (DataType.Float, DataType.Half, DataType.BFloat16,
                                 DataType.Double):
        return False, f"gradient dtype {e.inputs[0].dtype.name}"
    return True, ""


def num_weights(fusion, inputs, bindings=None) -> int:
    """The table's row count for these inputs (a constant, or its symbol's bound value)."""
    n = embedding_op(fusion).num_weights
    if isinstance(n, int):
        return n
    return int((bindings or bind(fusion, list(inputs))).value(n))


def run_check(fusion, inputs, bindings) -> tuple[bool, str]:
    grad, ids, _, _ = _tensors(fusion, inputs)
    tokens = ids.numel()
    # a chunk's positions (chunk start + u * block + tid) are 32-bit ints too, and may pass the
    # last token by up to a chunk (256 threads x UNROLL tokens): keep a chunk's margin
    if tokens > 2 ** 31 - 1 - 256 * UNROLL:
        return False, f"{tokens} indices (the kernel counts tokens in 32 bits)"
    rows = num_weights(fusion, inputs, bindings)
    if not isinstance(embedding_op(fusion).num_weights, int):
        if rows > MAX_SCATTER_ROWS:
            return False, (f"a table of {rows} rows (more than {MAX_SCATTER_ROWS}): every "
                           "block of the scatter kernel reads every index")
        if rows == 0 and tokens:      # eager raises for any index; no blocks would check them
            return False, "a table of no rows (eager's error for any index)"
    shape = (rows, int(grad.shape[-1]) if grad.dim() else 1)
    epi = epilogue_inputs(fusion)
    for v, x in zip(fusion.inputs, inputs):
        if any(v is u for u in epi) and tuple(x.shape) != shape:
            return False, f"epilogue input {v.name} of shape {tuple(x.shape)}, not {shape}"
    return True, ""


@dataclass
class EmbeddingBackwardParams:
    block: int                 # threads of a block
    cols: int                  # columns a thread owns: a block's slice is block * cols wide
    rows: int                  # vocabulary rows of a block's tile
    unroll: int                # tokens a thread tests per chunk (a chunk: block * unroll)
    match_unroll: int          # matched rows whose gradient loads are issued together
    acc: DataType              # the accumulator's dtype (Float; Double for double)
    index_type: str
    grad_seg: int              # kernel tensor positions of the gradient and the indices
    ids_seg: int
    ids_dense: bool            # row-major: a token's index is ids[t]
    grad_dense: bool           # row-major: a token's row starts at t * H
    num_weights: int           # the rows planned for (the kernel reads them from the output)
    padding_idx: int
    out_seg: int = 2           # the output's kernel tensor position (after every tensor input)
    epilogue: tuple = ()       # kernel tensor positions of the epilogue's inputs (epilogue_inputs)

    @property
    def warps(self) -> int:
        return self.block // WARP

    def as_dict(self) -> dict:
        d = {"kind": NAME, "block": self.block, "cols": self.cols, "rows": self.rows,
             "unroll": self.unroll, "match_unroll": self.match_unroll,
             "acc": self.acc.name, "index_type": self.index_type,
             "ids_dense": self.ids_dense, "grad_dense": self.grad_dense,
             "padding_idx": self.padding_idx}
        if self.epilogue:             # (without one, the kernel source is the one it was)
            d["epilogue"] = list(self.epilogue)
        return d

    def size_class(self) -> tuple:
        return (self.block, self.cols, self.rows, self.unroll, self.match_unroll)


def _tensors(fusion, inputs):
    """(gradient, indices) among `inputs`, and their kernel tensor positions."""
    e = embedding_op(fusion)
    tvs = [v for v in fusion.inputs if isinstance(v, TensorView)]
    xs = [x for v, x in zip(fusion.inputs, inputs) if isinstance(v, TensorView)]
    g, i = tvs.index(e.inputs[0]), tvs.index(e.inputs[1])
    return xs[g], xs[i], g, i


def list_bytes(block: int, unroll: int) -> int:
    """Shared bytes of a chunk's match lists (row and token, int32 each) and warp counts."""
    return block * unroll * 8 + unroll * (block // WARP) * 4


def _rows(hidden, num_weights, block, cols, acc_bytes) -> int:
    """Rows of a tile: what 48 KB hold, fewer where that leaves under two blocks an SM."""
    slices = max(1, -(-hidden // (block * cols)))
    budget = SHARED_LIMIT - list_bytes(block, UNROLL)
    rows = min(max(1, budget // (block * cols * acc_bytes)), max(1, num_weights))
    fill = 2 * SMS
    if -(-num_weights // rows) * slices < fill:
        rows = max(1, min(rows, num_weights * slices // fill))
    return rows


def choose(hidden: int, tokens: int, num_weights: int, acc_bytes: int) -> tuple:
    """(block, cols, rows, match_unroll) for these sizes (module docstring)."""
    block = 128 if hidden <= 128 else 256
    cols = max(1, min(MAX_COLS, -(-hidden // block)))
    rows = _rows(hidden, num_weights, block, cols, acc_bytes)
    matches = tokens * rows / max(1, num_weights)     # a block's matches, indices uniform
    if matches < 64:
        return block, cols, rows, 4
    if matches < HEAVY:
        return block, cols, rows, 8
    # few rows gathering many tokens (a token-type table): a block's walk through its matches
    # is one chain of loads, HEAVY_UNROLL rows in flight at a time; a thread owns one column so
    # that many rows fit its registers
    return block, 1, _rows(hidden, num_weights, block, 1, acc_bytes), HEAVY_UNROLL


def schedule(fusion, inputs) -> EmbeddingBackwardParams:
    e = embedding_op(fusion)
    grad, ids, g, i = _tensors(fusion, inputs)
    acc = DataType.Double if e.inputs[0].dtype is DataType.Double else DataType.Float
    hidden = int(grad.shape[-1]) if grad.dim() else 1
    n = num_weights(fusion, inputs)
    block, cols, rows, mu = choose(hidden, ids.numel(), n, acc.itemsize)
    out_numel = n * hidden
    index_type = "int64_t" if L.needs_int64(list(inputs), out_numel) else "int"
    tvs = fusion.tensor_inputs()
    epi = tuple(next(k for k, u in enumerate(tvs) if u is v) for v in epilogue_inputs(fusion))
    return EmbeddingBackwardParams(
        block, cols, rows, UNROLL, mu, acc, index_type, g, i,
        L.row_major(tuple(ids.shape), tuple(ids.stride())),
        L.row_major(tuple(grad.shape), tuple(grad.stride())), n, e.padding_idx,
        len(tvs), epi)


def size_class(fusion, inputs) -> tuple:
    return schedule(fusion, inputs).size_class()
