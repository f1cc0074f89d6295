"""Building Fusion IR, continued: indexing (gather, index_select, embedding), slices, pads,
concatenation and random numbers — the checked constructors of builder.py's module docstring,
with the same invariants. Reached through `builder` too (its module `__getattr__` hands out the
public names here), so frontends call `B.cat(...)` as before.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import FusionDefinitionError
from . import exprs as E
from .base import Scalar
from .builder import (Operandish, _as_val, _check_tv, _copy_id, _new_tv, _norm_dim, _operand,
                      cast, squeeze)
from .dtypes import DataType, result_type
from .fusion import Fusion
from .iterdomain import IterDomain, IterType
from .tensor import TensorView


# ---- indexing, concatenation, random numbers --------------------------------------------------
def _index_tensor(index, opname: str) -> TensorView:
    index = _check_tv(index, opname)
    if index.dtype not in (DataType.Int, DataType.Int32):
        raise FusionDefinitionError(
            f"{opname}: the index tensor {index.name} must be Int or Int32, got {index.dtype.name}")
    return index


def gather(x: TensorView, index: TensorView, dim: int) -> TensorView:
    """torch.gather(x, dim, index): index has x's rank; the output has index's shape."""
    x, index = _check_tv(x, "gather"), _index_tensor(index, "gather")
    if index.ndim != x.ndim:
        raise FusionDefinitionError(
            f"gather: the index {index.name} has rank {index.ndim}, the input {x.name} rank {x.ndim}")
    d = _norm_dim(dim, x.ndim, "gather")
    out = _new_tv(index.logical, x.dtype)
    E.GatherOp(out, x, index, d)
    return out


def index_select(x: TensorView, index: TensorView, dim: int) -> TensorView:
    """torch.index_select(x, dim, index): a 1-D (or 0-dim) index picks slices along `dim`."""
    x, index = _check_tv(x, "index_select"), _index_tensor(index, "index_select")
    if index.ndim > 1:
        raise FusionDefinitionError(
            f"index_select: the index {index.name} must have rank 0 or 1, got {index.ndim}")
    d = _norm_dim(dim, x.ndim, "index_select")
    fusion = Fusion.current()
    picked = _copy_id(index.logical[0]) if index.ndim else \
        IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast)
    root = [picked if i == d else _copy_id(a) for i, a in enumerate(x.logical)]
    out = TensorView(root, x.dtype, fusion)
    E.IndexSelectOp(out, x, index, d)
    return out


def embedding(weight: TensorView, index: TensorView) -> TensorView:
    """torch.embedding(weight, index) (`weight[index]`): the rows of `weight` (rank >= 1) at the
    positions in `index` (any rank); the output has index's axes, then weight's others."""
    weight, index = _check_tv(weight, "embedding"), _index_tensor(index, "embedding")
    if weight.ndim < 1:
        raise FusionDefinitionError(f"embedding: the weight {weight.name} must have rank >= 1")
    if index.ndim == 0:                      # one row, without the index's axis
        return squeeze(index_select(weight, index, 0), [0])
    root = [_copy_id(a) for a in index.logical] + [_copy_id(a) for a in weight.logical[1:]]
    out = TensorView(root, weight.dtype, Fusion.current())
    E.IndexSelectOp(out, weight, index, 0)
    return out


def embedding_backward(grad: TensorView, index: TensorView, num_weights,
                       padding_idx: int = -1) -> TensorView:
    """aten.embedding_dense_backward(grad, index, num_weights, padding_idx, False): the weight
    gradient [num_weights, grad's last extent] (exprs.EmbeddingBackwardOp); grad has rank >= 1
    and numel(index) rows of its last extent (checked at execute). num_weights: an int, or a
    symbolic Int Scalar (a table's row count known at run time), the output's first extent."""
    grad = _check_tv(grad, "embedding_backward")
    index = _index_tensor(index, "embedding_backward")
    if grad.ndim < 1 or not grad.dtype.is_floating:
        raise FusionDefinitionError(
            f"embedding_backward: the gradient {grad.name} must be a floating tensor of rank >= 1")
    if isinstance(num_weights, Scalar) and num_weights.is_const:
        num_weights = num_weights.value
    symbolic = isinstance(num_weights, Scalar) and num_weights.dtype is DataType.Int
    checked = [("padding_idx", padding_idx)] + ([] if symbolic else [("num_weights", num_weights)])
    for name, v in checked:
        if not isinstance(v, int) or isinstance(v, bool):
            raise FusionDefinitionError(f"embedding_backward: {name} must be an int, got {v!r}")
    if not symbolic and num_weights < 0:
        raise FusionDefinitionError(f"embedding_backward: num_weights {num_weights} is negative")
    fusion = Fusion.current()
    rows = IterDomain(num_weights if symbolic else Scalar(DataType.Int, num_weights, fusion))
    out = TensorView([rows, _copy_id(grad.logical[-1])], grad.dtype, fusion)
    E.EmbeddingBackwardOp(out, grad, index, num_weights, padding_idx)
    return out


def _int_list(v, opname: str, what: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or \
            any(not isinstance(i, int) or isinstance(i, bool) for i in v):
        raise FusionDefinitionError(f"{opname}: {what} must be a list of ints, got {v!r}")
    return list(v)


def slice_(x: TensorView, starts: Sequence[int], ends: Sequence[int],
           steps: Sequence[int] | None = None) -> TensorView:
    """x[starts[0]:ends[0]:steps[0], ...] (steps: ints >= 1, 1 where not given); constant bounds,
    checked against known sizes now and against run-time sizes at execute."""
    x = _check_tv(x, "slice")
    starts = _int_list(starts, "slice", "start_indices")
    ends = _int_list(ends, "slice", "end_indices")
    steps = [1] * len(starts) if steps is None else _int_list(steps, "slice", "strides")
    if not len(starts) == len(ends) == len(steps):
        raise FusionDefinitionError(
            f"slice: start_indices, end_indices and strides have {len(starts)}, {len(ends)} and "
            f"{len(steps)} entries; they must have one per axis")
    if len(starts) != x.ndim:
        raise FusionDefinitionError(
            f"slice: {len(starts)} start/end indices for the rank-{x.ndim} tensor {x.name}")
    fusion, root = Fusion.current(), []
    hints = getattr(x, "sizes_hint", None) or [-1] * x.ndim
    for i, (a, b, st, ax, hint) in enumerate(zip(starts, ends, steps, x.logical, hints)):
        if a < 0:
            raise FusionDefinitionError(f"slice: start index {a} of axis {i} is negative")
        if b < a:
            raise FusionDefinitionError(
                f"slice: end index {b} of axis {i} is smaller than its start index {a}")
        if st < 1:
            raise FusionDefinitionError(f"slice: stride {st} of axis {i} must be at least 1")
        known = ax.known_size()
        if known is None and hint > 1:
            known = hint
        if known is not None and b > known:
            raise FusionDefinitionError(f"slice: end index {b} of axis {i} is past its size {known}")
        n = -(-(b - a) // st)
        root.append(IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast) if n == 1 else
                    IterDomain(Scalar(DataType.Int, n, fusion)))
    out = TensorView(root, x.dtype, fusion)
    E.SliceOp(out, x, starts, ends, steps)
    return out


def slice_axis(x: TensorView, dim: int, start, end, length: int | None = None,
               step: int = 1) -> TensorView:
    """x sliced on axis `dim` from `start` to `end` (None: to the end, however long the axis is at
    run time) taking every `step`-th element (a constant int >= 1); the frontends' form of
    slice, whose sizes may be symbolic. A constant end past a symbolic size is checked at run
    time. A bound may be a symbolic Int Scalar (computed on the host, clamped into [0, size]
    with start <= end, or checked to be so when the sizes are bound): the axis' extent is then
    a symbol the run time binds to ceil((end - start) / step), or the constant `length` where
    the frontend knows it (`x[:, -1:]`, a select's one-wide slice: 1, a broadcast axis),
    checked against that at run time."""
    x = _check_tv(x, "slice")
    start, end = (b.value if isinstance(b, Scalar) and b.is_const else b for b in (start, end))
    sym = [b for b in (start, end) if isinstance(b, Scalar)]
    if any(b.dtype is not DataType.Int for b in sym) or not 0 <= dim < x.ndim or \
            (start is not None and not sym and start < 0) or \
            (not sym and end is not None and end < start) or \
            type(step) is not int or step < 1:
        raise FusionDefinitionError(
            f"slice: bad bounds {start}:{end}:{step} on axis {dim} of {x.name}")
    fusion, root = Fusion.current(), []
    for j, d in enumerate(x.logical):
        if j != dim or (start == 0 and end is None and not sym and step == 1):
            root.append(_copy_id(d))
            continue
        size = d.known_size()
        if sym:
            n = length if length is not None and length >= 1 else None
        elif size is not None:
            stop = size if end is None else end
            if stop > size:
                raise FusionDefinitionError(
                    f"slice: end {end} of axis {dim} is past its size {size}")
            n = -(-(stop - start) // step)
        else:
            n = None if end is None else -(-(end - start) // step)
        root.append(IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast) if n == 1
                    else IterDomain(Scalar(DataType.Int, n, fusion)))
    out = TensorView(root, x.dtype, fusion)
    starts = [start if j == dim else 0 for j in range(x.ndim)]
    ends = [end if j == dim else None for j in range(x.ndim)]
    E.SliceOp(out, x, starts, ends, [step if j == dim else 1 for j in range(x.ndim)])
    return out


def pad(x: TensorView, pads: Sequence, value: Operandish = 0, extents=None,
        steps: Sequence[int] | None = None) -> TensorView:
    """A constant pad: `pads[j] = (lo, hi)` elements of `value` before and after axis j (one
    pair per axis, each a non-negative int or a symbolic Int Scalar the host computes, checked
    to be >= 0 when the sizes are bound); a padded axis of symbolic size gets a symbolic size.
    `extents` (optional, one per axis: None, an int or an Int Scalar) names the output's extent
    where the caller knows it (a slice's gradient: the sliced tensor's sizes): the output axis
    takes it, and binding the sizes checks that the input's size plus the pads equals it.
    `steps` (optional, one int >= 1 per axis) spreads x's elements `step` apart along an axis
    (a stepped slice's gradient; E.PadOp): its size counts as E.span(size, step) there."""
    x = _check_tv(x, "pad")
    if not isinstance(pads, (list, tuple)) or len(pads) != x.ndim:
        raise FusionDefinitionError(f"pad: expects one (lo, hi) pair per axis of the rank-{x.ndim} "
                                    f"tensor {x.name}, got {pads!r}")
    if extents is not None and (not isinstance(extents, (list, tuple)) or len(extents) != x.ndim):
        raise FusionDefinitionError(f"pad: expects one extent per axis of {x.name}, "
                                    f"got {extents!r}")
    pairs = [_pad_pair(j, p) for j, p in enumerate(pads)]
    steps = [1] * x.ndim if steps is None else list(steps)
    if len(steps) != x.ndim or any(type(s) is not int or s < 1 for s in steps):
        raise FusionDefinitionError(f"pad: expects one int step >= 1 per axis of {x.name}, "
                                    f"got {steps!r}")
    v = _as_val(value, "pad")
    if not isinstance(v, Scalar):
        raise FusionDefinitionError(f"pad: the value must be a scalar, got {v}")
    v = cast(v, x.dtype)
    fusion, root = Fusion.current(), []
    for j, ((lo, hi), d, st) in enumerate(zip(pairs, x.logical, steps)):
        want = None if extents is None else _pad_extent(j, extents[j])
        size = d.known_size()
        const = isinstance(lo, int) and isinstance(hi, int)
        grown = E.span(size, st) + lo + hi if size is not None and const else None
        if const and lo == 0 and hi == 0 and st == 1 and \
                (want is None or want is d.extent or want == size):
            root.append(_copy_id(d))
            continue
        if isinstance(want, int) and grown is not None and want != grown:
            raise FusionDefinitionError(f"pad: axis {j} of {x.name} padded to {grown} elements, "
                                        f"not the {want} asked for")
        if want is None or isinstance(want, int):
            want = Scalar(DataType.Int, grown if want is None else want, fusion)
        root.append(_resized_axis(want))
    out = TensorView(root, x.dtype, fusion)
    E.PadOp(out, x, pairs, v, steps)
    return out


def _resized_axis(extent: Scalar) -> IterDomain:
    """A pad's or cat's output axis: a broadcast axis where its extent is the constant 1 (as a
    one-wide slice's, a `full`'s or an iota's), which later ops broadcast as eager does (`pad(x[:,
    :0], [0, 1]) + x`), a full axis of size 1 could not."""
    if extent.is_const and extent.value == 1:
        return IterDomain(extent, IterType.Broadcast)
    return IterDomain(extent)


def _pad_pair(j: int, p) -> tuple:
    ok = isinstance(p, (list, tuple)) and len(p) == 2
    out = []
    for v in p if ok else ():
        if isinstance(v, Scalar) and v.is_const and v.dtype is DataType.Int:
            v = int(v.value)
        if isinstance(v, Scalar):
            ok = ok and v.dtype is DataType.Int
        else:
            ok = ok and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        out.append(v)
    if not ok:
        raise FusionDefinitionError(
            f"pad: axis {j}: expects a pair of non-negative ints or Int scalars, got {p!r}")
    return tuple(out)


def _pad_extent(j: int, n):
    if n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        return n
    if isinstance(n, Scalar) and n.dtype is DataType.Int:
        return int(n.value) if n.is_const else n
    raise FusionDefinitionError(f"pad: the extent of axis {j} must be an int or an Int scalar, "
                                f"got {n!r}")


def cat(tensors: Sequence[TensorView], dim: int) -> TensorView:
    """torch.cat: tensors of one rank joined along `dim` (dtypes promoted as eager does)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise FusionDefinitionError(f"cat: expects a non-empty list of tensors, got {tensors!r}")
    xs = [_check_tv(t, "cat") for t in tensors]
    rank = xs[0].ndim
    for t in xs[1:]:
        if t.ndim != rank:
            raise FusionDefinitionError(
                f"cat: {xs[0].name} has rank {rank} but {t.name} has rank {t.ndim}")
    if rank == 0:
        raise FusionDefinitionError("cat: 0-dim tensors cannot be concatenated")
    d = _norm_dim(dim, rank, "cat")
    dtype = result_type(*(_operand(t) for t in xs))
    xs = [cast(t, dtype) for t in xs]
    fusion = Fusion.current()
    exts = [t.logical[d].extent if t.logical[d].expanded_extent is None else
            t.logical[d].expanded_extent for t in xs]
    total = Scalar(DataType.Int, sum(e.value for e in exts) if all(e.is_const for e in exts)
                   else None, fusion)
    root = []
    for i in range(rank):
        if i == d:
            root.append(_resized_axis(total))
            continue
        axes = [t.logical[i] for t in xs]
        real = [a for a in axes if not a.is_size_one_broadcast]
        root.append(_copy_id(real[0] if real else axes[0]))
    out = TensorView(root, dtype, fusion)
    E.CatOp(out, xs, d)
    return out


RANDOM_KINDS = ("uniform", "normal")


def random(kind: str, a: Operandish, b: Operandish, shape: Sequence,
           dtype: DataType = DataType.Float) -> TensorView:
    """A tensor of `shape` drawn from U[a, b) ("uniform") or N(a, b^2) ("normal")."""
    if kind not in RANDOM_KINDS:
        raise FusionDefinitionError(f"unknown random distribution {kind!r}")
    if not isinstance(dtype, DataType) or not dtype.is_floating:
        raise FusionDefinitionError(f"{kind}: dtype must be a floating DataType, got {dtype!r}")
    params = []
    for what, p in (("first", a), ("second", b)):
        v = _as_val(p, kind)
        if not isinstance(v, Scalar) or v.dtype.is_complex:
            raise FusionDefinitionError(f"{kind}: the {what} parameter must be a real scalar, got {v}")
        params.append(v)
    fusion = Fusion.current()
    if not isinstance(shape, (list, tuple)):
        raise FusionDefinitionError(f"{kind}: shape must be a list of sizes, got {shape!r}")
    out, exts = _drawn_tensor(kind, shape, dtype, fusion)
    E.RandomOp(kind, out, params, exts)
    return out


def _drawn_tensor(kind: str, shape: Sequence, dtype: DataType, fusion):
    """(the output TensorView, its extents) of a tensor drawn in the kernel: sizes as ints or
    Int scalars, size-1 axes broadcast."""
    exts = []
    for i, s in enumerate(shape):
        if isinstance(s, Scalar) and s.dtype.is_integral:
            exts.append(s)
        elif isinstance(s, int) and not isinstance(s, bool) and s >= 0:
            exts.append(Scalar(DataType.Int, s, fusion))
        else:
            raise FusionDefinitionError(f"{kind}: size {i} is {s!r}, not a size or an Int scalar")
    root = [IterDomain(e, IterType.Broadcast) if e.is_const and e.value == 1 else IterDomain(e)
            for e in exts]
    return TensorView(root, dtype, fusion), exts


def rand(shape: Sequence, dtype: DataType = DataType.Float) -> TensorView:
    """A tensor of `shape` of uniform numbers in [0, 1) drawn in the kernel (Philox4x32-10 from
    the launch's seed and offset: exprs.PhiloxUniformOp); float32, half or bfloat16."""
    from .philox import DIGITS
    if not isinstance(dtype, DataType) or dtype.torch not in DIGITS:
        raise FusionDefinitionError(f"rand: dtype must be Float, Half or BFloat16, got {dtype!r}")
    out, exts = _drawn_tensor("rand", shape, dtype, Fusion.current())
    E.PhiloxUniformOp(out, exts)
    return out
