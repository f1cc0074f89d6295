"""The Expr kinds of the Fusion IR.

Elementwise exprs (UnaryOp, BinaryOp, TernaryOp) name an OpInfo of the op table; all their tensor
operands and their output have the same rank (the builder inserts BroadcastOps first). Data
movement and metadata exprs (broadcast, expand, squeeze, view, permute, set, cast) carry the
attributes the evaluator and the codegen need. Reductions name a ReductionInfo.

Indexing and data-dependent exprs (gather, index_select, slice, cat) and random number exprs
drawn from torch's generator (RandomOp) are taken by no kernel scheduler yet: the segmenter runs
them on the reference evaluator (an "eager" segment). PhiloxUniformOp draws in the kernel
itself (the pointwise scheduler takes it), from the launch's seed and offset (ir/philox.py).

Invariant: the constructors only record; the builder (builder.py) checks arguments and creates
output TensorViews, so every Expr in a Fusion is well-formed.
"""
from __future__ import annotations

from .base import Expr, Val
from .dtypes import DataType
from .ops import OpInfo, ReductionInfo


class ElementwiseOp(Expr):
    """An op of the op table applied elementwise; `operands` may mix TensorViews and Scalars."""

    def __init__(self, info: OpInfo, out, operands: list):
        self.info = info
        super().__init__(operands, [out])

    @property
    def op_name(self) -> str:
        return self.info.name


class UnaryOp(ElementwiseOp):
    pass


class BinaryOp(ElementwiseOp):
    pass


class TernaryOp(ElementwiseOp):
    pass


class CastOp(Expr):
    """out = (dtype) in, with PyTorch's conversion semantics (float->int truncates toward zero)."""
    op_name = "cast"

    def __init__(self, out, inp, dtype: DataType):
        self.dtype = dtype
        super().__init__([inp], [out])


class SetOp(Expr):
    """out = in: a copy (nvFuser's `set`); also what the copy forms of alias ops lower to.
    `contiguous`: the copy is laid out row-major whatever its input's layout (a clone into
    torch.contiguous_format, `x.contiguous()`); otherwise as its input (preserve_format).
    `may_alias`: eager returns the input itself when it already has that layout (`x.contiguous()`,
    not a clone): the segmenter may then run it on the host as the input (segment/host.py)."""
    op_name = "set"

    def __init__(self, out, inp, contiguous: bool = False, may_alias: bool = False):
        self.contiguous = bool(contiguous)
        self.may_alias = bool(may_alias)
        super().__init__([inp], [out])


class BroadcastOp(Expr):
    """Inserts new broadcast axes: `flags[i]` is True where output axis i is new."""
    op_name = "broadcast"

    def __init__(self, out, inp, flags: list[bool]):
        self.flags = list(flags)
        super().__init__([inp], [out])


class ExpandOp(Expr):
    """Gives broadcast axes a real extent without copying (`sizes[i]` is -1 to keep axis i)."""
    op_name = "expand"

    def __init__(self, out, inp, sizes: list):
        self.sizes = list(sizes)
        super().__init__([inp], [out])


class SqueezeOp(Expr):
    """Removes the axes in `dims` (each broadcast, i.e. of extent 1)."""
    op_name = "squeeze"

    def __init__(self, out, inp, dims: list[int]):
        self.dims = sorted(dims)
        super().__init__([inp], [out])


class ViewOp(Expr):
    """Reshape a tensor to `new_shape` (row-major element order, as torch.reshape)."""
    op_name = "view"

    def __init__(self, out, inp, new_shape: list[int]):
        self.new_shape = list(new_shape)
        super().__init__([inp], [out])


class PermuteOp(Expr):
    """out axis i is input axis dims[i]."""
    op_name = "permute"

    def __init__(self, out, inp, dims: list[int]):
        self.dims = list(dims)
        super().__init__([inp], [out])


class ReductionOp(Expr):
    """Reduces `axes` of the input; the output keeps them as reduction (rS) root axes."""

    def __init__(self, info: ReductionInfo, out, inp, axes: list[int]):
        self.info = info
        self.axes = sorted(axes)
        super().__init__([inp], [out])

    @property
    def op_name(self) -> str:
        return self.info.name


class WelfordOp(Expr):
    """One pass mean and sum of squared deviations over `axes`: outputs (avg, m2, n)."""
    op_name = "welford"

    def __init__(self, avg, m2, n, inp, axes: list[int]):
        self.axes = sorted(axes)
        super().__init__([inp], [avg, m2, n])


class FullOp(Expr):
    """A tensor of `shape` (Scalars) filled with `fill` (a Scalar)."""
    op_name = "full"

    def __init__(self, out, fill, shape: list):
        self.shape = list(shape)
        super().__init__([fill], [out])


class IotaOp(Expr):
    """out[i] = start + i * step, for i in range(length)."""
    op_name = "iota"

    def __init__(self, out, length, start, step):
        super().__init__([length, start, step], [out])


class ScalarCast(Expr):
    """A scalar conversion, printed `d116 = (double)(i17);`."""
    op_name = "scalar_cast"

    def __init__(self, out, inp):
        super().__init__([inp], [out])


class GatherOp(Expr):
    """torch.gather: out[i][j] = inp[index[i][j]][j] for dim 0 (same rank; out has index's shape)."""
    op_name = "gather"

    def __init__(self, out, inp, index, dim: int):
        self.dim = dim
        super().__init__([inp, index], [out])


class IndexSelectOp(Expr):
    """The slices of `inp` along `dim` at the positions in an index tensor: out's axes are inp's
    with axis `dim` replaced by the index's axes (a 0-dim index: one size-1 axis).
    torch.index_select (an index of rank 0 or 1) and torch.embedding / `weight[ids]` (dim 0, an
    index of any rank). An index outside [0, size of axis dim) is an error, as in eager."""
    op_name = "index_select"

    def __init__(self, out, inp, index, dim: int):
        self.dim = dim
        super().__init__([inp, index], [out])


class EmbeddingBackwardOp(Expr):
    """aten.embedding_dense_backward without scale_grad_by_freq: out [num_weights, H] of grad's
    dtype, out[v, h] = the sum, in token order, of grad's rows t (grad viewed [numel(index),
    H]) whose index[t] == v, accumulated in float32 (float64 for double); rows whose index is
    `padding_idx` are left out (padding_idx -1: none). `padding_idx` is a constant int;
    `num_weights` a constant int or the symbolic Int Scalar that is out's first extent (a table
    of rows known at run time: index_put's into a graph input). An index
    outside [0, num_weights) is an error, as in eager."""
    op_name = "embedding_backward"

    def __init__(self, out, grad, index, num_weights, padding_idx: int):
        self.num_weights = num_weights if isinstance(num_weights, Val) else int(num_weights)
        self.padding_idx = int(padding_idx)
        super().__init__([grad, index], [out])


class SliceOp(Expr):
    """out = inp[start[0]:end[0]:step[0], ...], 0 <= start <= end <= size (an empty slice,
    start == end, may lie past the end); out's extent along an axis is ceil((end - start) /
    step). A bound is a constant or a symbolic Int Scalar (a SymInt's bound under dynamic
    shapes, clamped by the frontend as Python does), which is then also an input of the expr
    after `inp`; an end None runs to the axis' end (its size known at run time). A step is a
    constant int >= 1 (1 where not given): out's element i is inp's element start + i * step."""
    op_name = "slice"

    def __init__(self, out, inp, starts: list, ends: list, steps: list | None = None):
        self.starts, self.ends = list(starts), list(ends)
        self.steps = [1] * len(self.starts) if steps is None else [int(s) for s in steps]
        scalars = []
        for b in self.starts + self.ends:
            if isinstance(b, Val) and all(b is not s for s in scalars):
                scalars.append(b)
        super().__init__([inp] + scalars, [out])


class PadOp(Expr):
    """torch.nn.functional.pad with a constant: out has `pads[j] = (lo, hi)` more elements before
    and after inp's axis j (the axis' size may be symbolic), filled with the scalar operand. A
    pad is a non-negative constant or a symbolic Int Scalar (a slice's gradient under dynamic
    shapes: the size less the slice's end, computed on the host and checked to be >= 0 when the
    sizes are bound), which is then also an input of the expr after `value`.

    A step s > 1 on axis j (a stepped slice's gradient: `steps`, a constant int >= 1, 1 where
    not given) spreads inp's elements apart too: inp's element i is out's element lo + i * s,
    the s - 1 elements between two of them are the scalar, and out's extent is lo + span + hi
    with span = (n - 1) * s + 1 for n > 0 elements of inp (0 for n = 0)."""
    op_name = "pad"

    def __init__(self, out, inp, pads: list, value, steps: list | None = None):
        self.pads = [tuple(p if isinstance(p, Val) else int(p) for p in pair) for pair in pads]
        self.steps = [1] * len(self.pads) if steps is None else [int(s) for s in steps]
        scalars = []
        for p in (p for pair in self.pads for p in pair):
            if isinstance(p, Val) and all(p is not s for s in scalars):
                scalars.append(p)
        super().__init__([inp, value] + scalars, [out])


def span(n: int, step: int) -> int:
    """The extent n elements take spread `step` apart (PadOp): (n - 1) * step + 1, 0 for n = 0."""
    return (n - 1) * step + 1 if n > 0 else 0


class CatOp(Expr):
    """torch.cat of the inputs along `dim`; out's axis `dim` has the summed extent."""
    op_name = "cat"

    def __init__(self, out, inputs: list, dim: int):
        self.dim = dim
        super().__init__(list(inputs), [out])


class RandomOp(Expr):
    """A tensor of `shape` (Scalars) drawn from a distribution: `kind` "uniform" (operands low,
    high: U[low, high)) or "normal" (operands mean, std). Values come from torch's default
    generator of the device the fusion runs on (so torch.manual_seed makes them reproducible)."""

    def __init__(self, kind: str, out, params: list, shape: list):
        self.kind = kind
        self.shape = list(shape)
        super().__init__(list(params), [out])

    @property
    def op_name(self) -> str:
        return self.kind


class PhiloxUniformOp(Expr):
    """A tensor of `shape` (Scalars) of numbers in [0, 1) from Philox4x32-10: element i (its
    row-major linear index) of the k-th such op of a launch is ir/philox.py's
    uniform(seed, offset, k, i, digits), the launch's seed and offset drawn from the generator
    of the device it runs on (runtime/rng.py), `digits` the output dtype's (24 float32, 11 half,
    8 bfloat16: exact in it, never rounded up to 1). A pure function of the element's index, so
    a kernel may compute it at any index, any number of times."""
    op_name = "rand"

    def __init__(self, out, shape: list):
        self.shape = list(shape)
        super().__init__([], [out])

    @property
    def digits(self) -> int:
        from .philox import DIGITS
        return DIGITS[self.output.dtype.torch]
