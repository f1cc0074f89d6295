"""Building Fusion IR: the checked constructors every frontend calls.

Each function here validates its arguments (raising FusionDefinitionError that names the op and
the problem), applies PyTorch's type promotion (dtypes.result_type with the op table's kind),
inserts explicit CastOps to the computation dtype and BroadcastOps to align ranks (right-aligned,
as PyTorch broadcasts), creates the output TensorView and records the Expr in the current Fusion.

Invariants:
- Nothing here rewrites arithmetic: one call makes one compute Expr (plus casts/broadcasts).
- Two iteration axes meeting in an op must have equal extents at run time; the output takes the
  first operand's extent. A broadcast axis meeting an iteration axis takes the iteration extent.
"""
from __future__ import annotations

import math
from typing import Sequence, Union

from ..errors import FusionDefinitionError
from . import exprs as E
from .base import Scalar, Val
from .dtypes import DataType, Operand, Promotion, result_type
from .fusion import Fusion
from .iterdomain import IterDomain, IterType
from .ops import OPS, REDUCTIONS, category
from .shapes import resolve_view_shape
from .tensor import TensorView

Number = Union[bool, int, float, complex]
Operandish = Union[TensorView, Scalar, Number]


# ---- leaves -----------------------------------------------------------------------------------
def constant(value: Number, dtype: DataType | None = None) -> Scalar:
    dtype = dtype or DataType.from_python(value)
    return Scalar(dtype, value, Fusion.current())


def symbolic_scalar(dtype: DataType) -> Scalar:
    return Scalar(dtype, None, Fusion.current())


def define_tensor(sizes: Sequence[int], dtype: DataType, contiguity=None, stride_order=None,
                  is_input: bool = True) -> TensorView:
    """A new tensor; size 1 gives a broadcast axis, anything else a symbolic extent.

    `sizes` entries: -1 (unknown), 1 (broadcast) or a known size (kept symbolic so a kernel can
    be reused for other sizes of the same rank and layout; known sizes are checked at execute).
    """
    fusion = Fusion.current()
    if not isinstance(dtype, DataType):
        raise FusionDefinitionError(f"define_tensor: dtype must be a DataType, got {dtype!r}")
    root = []
    for i, s in enumerate(sizes):
        if not isinstance(s, int) or isinstance(s, bool) or s < -1:
            raise FusionDefinitionError(f"define_tensor: size {i} is {s!r}; expected -1, 1 or a size")
        if s == 1:
            root.append(IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast))
        else:
            root.append(IterDomain(Scalar(DataType.Int, None, fusion), IterType.Iteration))
    tv = TensorView(root, dtype, fusion)
    tv.sizes_hint = [int(s) for s in sizes]
    n = len(root)
    if contiguity is not None:
        if len(contiguity) != n:
            raise FusionDefinitionError(
                f"define_tensor: contiguity has {len(contiguity)} entries for a rank-{n} tensor")
    tv.contiguity = list(contiguity) if contiguity is not None else [True] * n
    if stride_order is not None:
        if sorted(stride_order) != list(range(n)):
            raise FusionDefinitionError(
                f"define_tensor: stride_order {list(stride_order)} is not a permutation of 0..{n - 1}")
        tv.stride_order = list(stride_order)
    if is_input:
        fusion.add_input(tv)
    return tv


def _as_val(x: Operandish, opname: str) -> Val:
    if isinstance(x, (TensorView, Scalar)):
        if x.fusion is not Fusion.current():
            raise FusionDefinitionError(f"{opname}: operand {x} belongs to another fusion")
        return x
    if isinstance(x, (bool, int, float, complex)):
        return constant(x)
    raise FusionDefinitionError(f"{opname}: operand of type {type(x).__name__} is not a tensor or scalar")


def _operand(v: Val) -> Operand:
    if isinstance(v, TensorView):
        return Operand(v.dtype, Operand.TENSOR if v.ndim else Operand.ZERO_DIM)
    return Operand(v.dtype, Operand.SCALAR)


# ---- broadcasting -----------------------------------------------------------------------------
def _new_tv(root_like: list[IterDomain], dtype: DataType) -> TensorView:
    root = [IterDomain(d.extent, d.iter_type, expanded_extent=d.expanded_extent) for d in root_like]
    return TensorView(root, dtype, Fusion.current())


def broadcast(x: TensorView, flags: Sequence[bool]) -> TensorView:
    """Insert broadcast axes where flags is True; len(flags) = x.ndim + number of Trues."""
    flags = [bool(f) for f in flags]
    if len(flags) - sum(flags) != x.ndim:
        raise FusionDefinitionError(
            f"broadcast: {len(flags) - sum(flags)} kept axes in flags {flags} but input has rank {x.ndim}")
    if not any(flags):
        return x
    fusion = Fusion.current()
    src = iter(x.logical)
    root = [IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast) if f else
            _copy_id(next(src)) for f in flags]
    out = TensorView(root, x.dtype, fusion)
    E.BroadcastOp(out, x, flags)
    return out


def _copy_id(d: IterDomain) -> IterDomain:
    itype = IterType.Iteration if d.is_reduction else d.iter_type
    return IterDomain(d.extent, itype, expanded_extent=d.expanded_extent)


def _align_ranks(vals: list[Val], opname: str) -> list[Val]:
    tensors = [v for v in vals if isinstance(v, TensorView)]
    rank = max((t.ndim for t in tensors), default=0)
    out = []
    for v in vals:
        if isinstance(v, TensorView) and v.ndim < rank:
            v = broadcast(v, [True] * (rank - v.ndim) + [False] * v.ndim)
        out.append(v)
    return out


def _output_axes(tensors: list[TensorView], opname: str) -> list[IterDomain]:
    """Per axis, the IterDomain the output follows: the first iteration axis, else the first
    expanded broadcast, else the first (a broadcast)."""
    rank = tensors[0].ndim
    axes = []
    for i in range(rank):
        ids = [t.logical[i] for t in tensors]
        real = [d for d in ids if not d.is_broadcast] + \
            [d for d in ids if d.is_broadcast and d.expanded_extent is not None]
        for d in real[1:]:
            a, b = real[0].known_size(), d.known_size()
            if a is not None and b is not None and a != b:
                raise FusionDefinitionError(
                    f"{opname}: axis {i} has extent {a} in one operand and {b} in another")
        axes.append(real[0] if real else ids[0])
    return axes


# ---- elementwise ------------------------------------------------------------------------------
def cast(x: Operandish, dtype: DataType) -> Val:
    x = _as_val(x, "cast")
    if not isinstance(dtype, DataType):
        raise FusionDefinitionError(f"cast: dtype must be a DataType, got {dtype!r}")
    if x.dtype is dtype:
        return x
    if isinstance(x, Scalar):
        if x.is_const:
            return constant(_convert_python(x.value, dtype), dtype)
        out = Scalar(dtype, None, Fusion.current())
        E.ScalarCast(out, x)
        return out
    out = _new_tv(x.logical, dtype)
    E.CastOp(out, x, dtype)
    return out


def _convert_python(value, dtype: DataType):
    if dtype.is_bool:
        return bool(value)
    if dtype.is_floating:
        return float(value.real if isinstance(value, complex) else value)
    if dtype.is_complex:
        return complex(value)
    return int(value.real if isinstance(value, complex) else value)


def elementwise(name: str, *operands: Operandish) -> Val:
    """Apply op-table op `name`; promotes, casts and broadcasts as eager PyTorch would."""
    if name not in OPS:
        raise FusionDefinitionError(f"unknown op {name!r}")
    info = OPS[name]
    if len(operands) != info.arity:
        raise FusionDefinitionError(f"{name}: takes {info.arity} operands, got {len(operands)}")
    vals = [_as_val(x, name) for x in operands]
    for i in sorted(info.scalar_args):
        if not isinstance(vals[i], Scalar):
            raise FusionDefinitionError(f"{name}: operand {i} must be a scalar, got tensor {vals[i].name}")
    for i, v in enumerate(vals):
        if not info.accepts_operand(v.dtype):
            raise FusionDefinitionError(f"{name}: does not take {v.dtype.name} operands "
                                        f"(operand {i}: {v})")
    skip = set(info.scalar_args) | ({0} if name == "where" else set())
    promoted = [v for i, v in enumerate(vals) if i not in skip]
    if name == "where":
        if vals[0].dtype is not DataType.Bool:
            raise FusionDefinitionError(f"where: condition must be Bool, got {vals[0].dtype.name}")
    kind = Promotion.DEFAULT if info.promotion in (Promotion.ALWAYS_BOOL, Promotion.NONE,
                                                   Promotion.COMPLEX_TO_FLOAT) else info.promotion
    compute = result_type(*(_operand(v) for v in promoted), promotion=kind,
                          scalars=Fusion.current().scalar_typing)
    if not info.accepts_dtype(compute):
        raise FusionDefinitionError(
            f"{name}: does not take {compute.name} operands (accepts {sorted(info.accepts)})")
    out_dtype = DataType.Bool if info.promotion is Promotion.ALWAYS_BOOL else (
        real_dtype(compute) if info.promotion is Promotion.COMPLEX_TO_FLOAT else compute)
    vals = [cast(v, compute) if isinstance(v, TensorView) and i not in skip else v
            for i, v in enumerate(vals)]
    vals = _align_ranks(vals, name)
    tensors = [v for v in vals if isinstance(v, TensorView)]
    if not tensors:
        out = Scalar(out_dtype, None, Fusion.current())
    else:
        out = _new_tv(_output_axes(tensors, name), out_dtype)
    cls = {1: E.UnaryOp, 2: E.BinaryOp}.get(info.arity, E.TernaryOp)
    cls(info, out, vals)
    return out


def real_dtype(dtype: DataType) -> DataType:
    """The real dtype of a complex dtype (ComplexFloat -> Float); others unchanged."""
    return {DataType.ComplexFloat: DataType.Float, DataType.ComplexDouble: DataType.Double}.get(
        dtype, dtype)


def set_(x: TensorView, contiguous: bool = False, may_alias: bool = False) -> TensorView:
    """A copy of x (nvFuser's `set`); `contiguous`: laid out row-major, as `x.contiguous()`;
    `may_alias`: x itself where it already is (eager's `x.contiguous()`; see SetOp)."""
    x = _check_tv(x, "set")
    out = _new_tv(x.logical, x.dtype)
    E.SetOp(out, x, contiguous, may_alias)
    return out


def _check_tv(x, opname: str) -> TensorView:
    if not isinstance(x, TensorView):
        raise FusionDefinitionError(f"{opname}: expects a tensor, got {x!r}")
    if x.fusion is not Fusion.current():
        raise FusionDefinitionError(f"{opname}: tensor {x.name} belongs to another fusion")
    return x


# ---- metadata ops -----------------------------------------------------------------------------
def _norm_dim(d: int, rank: int, opname: str) -> int:
    if not isinstance(d, int) or not -max(rank, 1) <= d < max(rank, 1):
        raise FusionDefinitionError(f"{opname}: dim {d!r} out of range for rank {rank}")
    return d % max(rank, 1)


def permute(x: TensorView, dims: Sequence[int]) -> TensorView:
    x = _check_tv(x, "permute")
    dims = [_norm_dim(d, x.ndim, "permute") for d in dims]
    if sorted(dims) != list(range(x.ndim)):
        raise FusionDefinitionError(f"permute: dims {list(dims)} are not a permutation of rank {x.ndim}")
    if dims == list(range(x.ndim)):
        return x
    out = _new_tv([x.logical[d] for d in dims], x.dtype)
    E.PermuteOp(out, x, dims)
    return out


def transpose(x: TensorView, d0: int, d1: int) -> TensorView:
    x = _check_tv(x, "transpose")
    dims = list(range(x.ndim))
    a, b = _norm_dim(d0, x.ndim, "transpose"), _norm_dim(d1, x.ndim, "transpose")
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


def squeeze(x: TensorView, dims: Sequence[int]) -> TensorView:
    x = _check_tv(x, "squeeze")
    dims = sorted({_norm_dim(d, x.ndim, "squeeze") for d in dims})
    for d in dims:
        ax = x.logical[d]
        if ax.known_size() != 1 and not ax.is_size_one_broadcast:
            raise FusionDefinitionError(f"squeeze: axis {d} of {x.name} is not of size 1")
    if not dims:
        return x
    out = _new_tv([a for i, a in enumerate(x.logical) if i not in dims], x.dtype)
    E.SqueezeOp(out, x, dims)
    return out


def unsqueeze(x: TensorView, dim: int) -> TensorView:
    x = _check_tv(x, "unsqueeze")
    d = _norm_dim(dim, x.ndim + 1, "unsqueeze")
    return broadcast(x, [i == d for i in range(x.ndim + 1)])


def expand(x: TensorView, sizes: Sequence) -> TensorView:
    """Broadcast axes take the given sizes (-1 keeps an axis as it is)."""
    x = _check_tv(x, "expand")
    if len(sizes) != x.ndim:
        raise FusionDefinitionError(f"expand: {len(sizes)} sizes for a rank-{x.ndim} tensor")
    fusion, root, changed = Fusion.current(), [], False
    for i, (ax, s) in enumerate(zip(x.logical, sizes)):
        s_val = s.value if isinstance(s, Scalar) and s.is_const else s
        if s_val == -1 or (not ax.is_broadcast and isinstance(s_val, int) and
                           (not ax.extent.is_const or ax.extent.value == s_val)):
            root.append(_copy_id(ax))
            # a symbolic full axis "expanded" to a size: kept as the op, whose binding checks
            # the axis has that size (at size 1 eager would broadcast it; ir/shapes.py)
            changed |= s_val != -1 and not ax.extent.is_const
            continue
        if not ax.is_broadcast:
            raise FusionDefinitionError(
                f"expand: axis {i} has extent {ax.extent} and is not a broadcast; cannot expand to {s}")
        ext = s if isinstance(s, Scalar) else Scalar(DataType.Int, int(s_val), fusion)
        if ext.is_const and ext.value == 1:
            root.append(_copy_id(ax))
            continue
        root.append(IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast,
                               expanded_extent=ext))
        changed = True
    if not changed:
        return x
    out = TensorView(root, x.dtype, fusion)
    E.ExpandOp(out, x, list(sizes))
    return out


def broadcast_in_dim(x: TensorView, output_shape: Sequence[int], broadcast_dims: Sequence[int]):
    """nvFuser's broadcast_in_dim: input axis i becomes output axis broadcast_dims[i]."""
    x = _check_tv(x, "broadcast_in_dim")
    n = len(output_shape)
    if len(broadcast_dims) != x.ndim or sorted(set(broadcast_dims)) != list(broadcast_dims) \
            or any(not 0 <= d < n for d in broadcast_dims):
        raise FusionDefinitionError(
            f"broadcast_in_dim: broadcast_dims {list(broadcast_dims)} must be {x.ndim} increasing "
            f"axes of the rank-{n} output")
    y = broadcast(x, [i not in broadcast_dims for i in range(n)])
    return expand(y, [s if not (i in broadcast_dims and not x.logical[list(broadcast_dims).index(i)]
                                .is_broadcast) else -1 for i, s in enumerate(output_shape)])


def reshape(x: TensorView, new_shape: Sequence) -> TensorView:
    """Row-major reshape. Known input extents are checked now; symbolic ones at execute. An
    entry may be a symbolic Scalar: an extent of this fusion (a flatten keeps the symbolic
    axes outside its range); the output axis then has that extent."""
    x = _check_tv(x, "reshape")
    shape = [s if isinstance(s, Scalar) and not s.is_const else
             int(s.value if isinstance(s, Scalar) else s) for s in new_shape]
    ints = [s for s in shape if isinstance(s, int)]
    if ints.count(-1) > 1 or any(s < -1 for s in ints):
        raise FusionDefinitionError(f"view: invalid new shape {shape}")
    known = [d.known_size() for d in x.logical]
    if len(ints) < len(shape):
        if len(shape) == x.ndim and all(
                s is d.extent if isinstance(s, Scalar) else s == k
                for s, d, k in zip(shape, x.logical, known)):
            return x
        fusion = Fusion.current()
        root = [IterDomain(s) if isinstance(s, Scalar) else
                IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast) if s == 1 else
                IterDomain(Scalar(DataType.Int, None if s == -1 else s, fusion)) for s in shape]
        out = TensorView(root, x.dtype, fusion)
        E.ViewOp(out, x, shape)
        return out
    if None not in known:
        resolved = resolve_view_shape(known, shape)
        if resolved is None:
            raise FusionDefinitionError(
                f"view: shape {known} ({math.prod(known)} elements) cannot be viewed as {shape}")
        shape = resolved
    if known == shape:
        return x
    fusion = Fusion.current()
    root = [IterDomain(Scalar(DataType.Int, 1, fusion), IterType.Broadcast) if s == 1 else
            IterDomain(Scalar(DataType.Int, None if s == -1 else s, fusion)) for s in shape]
    out = TensorView(root, x.dtype, fusion)
    E.ViewOp(out, x, shape)
    return out


view = reshape


# ---- reductions -------------------------------------------------------------------------------
def reduction(name: str, x: TensorView, axes: Sequence[int] | None, keepdim: bool = False,
              dtype: DataType | None = None) -> TensorView:
    x = _check_tv(x, name)
    info = REDUCTIONS[name]
    axes = list(range(x.ndim)) if axes is None or len(axes) == 0 else \
        sorted({_norm_dim(a, x.ndim, name) for a in axes})
    if dtype is not None:
        x = cast(x, dtype)
    elif name in ("sum", "prod") and category(x.dtype) in ("bool", "int"):
        x = cast(x, DataType.Int)
    if x.ndim == 0:
        # a rank-0 tensor's dim 0 (or -1) is its one element, as eager reads it: no axis to
        # reduce (a ReductionOp over a missing axis broke the reduction analysis)
        return set_(x)
    fusion = Fusion.current()
    root = [IterDomain(a.extent, IterType.Reduction) if i in axes else _copy_id(a)
            for i, a in enumerate(x.logical)]
    out = TensorView(root, x.dtype, fusion)
    E.ReductionOp(info, out, x, axes)
    if keepdim:
        out = broadcast(out, [i in axes for i in range(x.ndim)])
    return out


def full(shape: Sequence, fill: Operandish, dtype: DataType) -> TensorView:
    fusion = Fusion.current()
    exts = [s if isinstance(s, Scalar) else Scalar(DataType.Int, int(s), fusion) for s in shape]
    root = [IterDomain(e, IterType.Broadcast) if e.is_const and e.value == 1 else IterDomain(e)
            for e in exts]
    out = TensorView(root, dtype, fusion)
    E.FullOp(out, cast(_as_val(fill, "full"), dtype), exts)
    return out


def iota(length: Operandish, start: Operandish = 0, step: Operandish = 1,
         dtype: DataType = DataType.Int) -> TensorView:
    """A 1-D tensor [start, start + step, ...] of `length` elements."""
    fusion = Fusion.current()
    length = _as_val(length, "iota")
    if length.dtype is not DataType.Int:
        raise FusionDefinitionError(f"iota: length must be an Int scalar, got {length.dtype.name}")
    # one element: a broadcast axis, as full's and a slice's (an [N, n] operand broadcasts it)
    one = length.is_const and length.value == 1
    out = TensorView([IterDomain(length, IterType.Broadcast) if one else IterDomain(length)],
                     dtype, fusion)
    E.IotaOp(out, length, cast(_as_val(start, "iota"), dtype), cast(_as_val(step, "iota"), dtype))
    return out


# the indexing, slice / pad / cat and random-number constructors live in builder_indexing.py, the
# statistics (mean, var_mean, welford, num_elements) in builder_stats.py; both import the helpers
# above and are reached through this module lazily (no import cycle)
_INDEXING = frozenset(("cat", "embedding", "embedding_backward", "gather", "index_select", "pad", "rand", "random",
                       "slice_", "slice_axis"))
_STATS = frozenset(("mean", "num_elements", "var_mean", "welford"))


def __getattr__(name):
    if name in _INDEXING:
        from . import builder_indexing
        return getattr(builder_indexing, name)
    if name in _STATS:
        from . import builder_stats
        return getattr(builder_stats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
