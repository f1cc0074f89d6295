"""Lowerings of the ops that move elements to other indices: slice, cat, constant pads.

`aten::slice` and `aten::select` (views: metadata class, so a slice of a region's input stays a
free eager view at the region's edge and a slice between compute ops is an index shift in the
kernel), `aten::cat`
(and `aten::stack`, a cat of unsqueezed views; `aten::roll`, a cat of two slices per dim),
`aten::constant_pad_nd`, `aten::slice_backward` (a slice's gradient: zeros around the slice,
a pad) and `aten::select_backward` (a select's gradient: the same pad of the unsqueezed
gradient, one element wide: ViT's class-token gradient). In the Fusion they are SliceOp / CatOp
/ PadOp, which the pointwise scheduler indexes (schedule/pointwise_graph.py); this is what fuses
a rotary embedding (`cat(-x2, x1)` of two halves of the head, and its backward's
`slice_backward`s) into the kernel around it.

A slice's start and end follow eager (negative bounds from the end, clamped into the axis; an
open end, or eager's INT64_MAX, runs to the axis' end whatever its size at run time); on an
axis of symbolic size, or given as SymInts (dynamic shapes: GPT-2's and Llama's packed-sequence
mask slices a `cat` to the sequence length), the clamped bounds are scalar expressions of the
Fusion computed when the sizes are bound (slice_bounds.py). The pads of `constant_pad_nd` and
a select's index are constants known when the graph is compiled; a negative pad (a crop) is a
slice first, on an axis of symbolic size n one from -lo to the scalar n + hi, checked when the
sizes are bound. `slice_backward` and
`select_backward` with constant input sizes and bounds give a pad of constant sizes (their
gradient's sizes may be symbolic: `_fits`); with SymInt input sizes or bounds (dynamic shapes:
BERT's pooler, `hidden_states[:, 0]`, in a training step) the pad's sides are scalar expressions
(the clamped start, the size less the clamped end; a negative select index counts from the
symbolic end) and its output's extents are the input sizes, so binding the sizes checks every
pad >= 0 and the gradient's sizes against them: a call that does not fit (an index past the
axis, a constant end past it) runs eagerly, which raises or clamps as eager does. Sizes may be
symbolic (dynamic shapes, regions shared across sizes): a cat's boundaries and a pad's extents
are read from the sizes at run time; a forward select's negative index on such an axis starts
its one-wide slice at size + index (checked >= 0 when the sizes are bound). A slice's constant
step > 1 (`x[..., ::2]`: an interleaved rotary's pairs) is the SliceOp's step, and the
gradient's (`slice_backward` with that step) a pad spreading the gradient step apart (PadOp's
step; its high side the size less the start less slice_bounds.stepped_span). Anything else (a
SymInt step, a SymInt select index) raises UnsupportedOpError: the node stays an eager op.
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .registry import METADATA, lowers
from .slice_bounds import clamped, constant_length, stepped_span


def _const_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UnsupportedOpError(f"{what} must be a constant int, got {v!r}")
    return int(v)


def _dim(dim, rank: int, what: str) -> int:
    dim = _const_int(dim, f"{what} dim")
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise UnsupportedOpError(f"{what}: dim {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


def _bounds(n: int, start, end) -> tuple[int, int]:
    """Eager's clamping of slice bounds on an axis of size n (None: open)."""
    s = 0 if start is None else _const_int(start, "slice start")
    e = n if end is None else _const_int(end, "slice end")
    s = s + n if s < 0 else s
    e = e + n if e < 0 else e
    s = min(max(s, 0), n)
    e = min(max(e, s), n)
    return s, e


@lowers("aten::slice", op_class=METADATA, n_args=(5,), const_args=(1, 2, 3, 4))
def _slice(x, dim=0, start=None, end=None, step=1):
    """x[start:end:step] along `dim` with eager's bounds (negative ones from the end, clamped
    into the axis). Constant bounds on an axis of constant size are resolved now; a SymInt bound
    or a symbolic size gives the clamped bounds as scalar expressions (slice_bounds.py),
    computed when the sizes are bound: a symbolic start is a shift the kernel reads as a
    parameter. A constant step > 1 takes every step-th element from the start (the extent
    ceil((end - start) / step)); the kernel reads the input at start + step * index."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("aten::slice of a 0-dim or non-tensor value")
    step = _step(step, "aten::slice")
    d = _dim(dim, x.ndim, "aten::slice")
    start, end = _bound(start, "start"), _bound(end, "end")
    n = x.logical[d].known_size()
    if n is not None and not isinstance(start, Scalar) and not isinstance(end, Scalar):
        s, e = _bounds(n, start, end)
        return x if (s, e, step) == (0, n, 1) else B.slice_axis(x, d, s, e, step=step)
    s, e = clamped(x.logical[d].full_extent if n is None else n, start, end)
    if isinstance(s, int) and s == 0 and e is None and step == 1:
        return x
    length = constant_length(start, end) if n is None else None
    return B.slice_axis(x, d, s, e, step=step,
                        length=None if length is None else -(-length // step))


def _step(step, what: str) -> int:
    """A slice's step: a constant int >= 1 (eager refuses the others; a SymInt step is not
    fused)."""
    if isinstance(step, Scalar) and step.is_const and step.dtype is DataType.Int:
        step = int(step.value)
    if isinstance(step, Scalar):
        raise UnsupportedOpError(f"{what} with a symbolic step {step}")
    step = _const_int(step, f"{what} step")
    if step < 1:
        raise UnsupportedOpError(f"{what} with step {step} (eager takes steps >= 1)")
    return step


def _bound(v, what: str, op: str = "aten::slice", open_ok: bool = True):
    """A slice bound: None (where `open_ok`), a constant int or a symbolic Int (a SymInt of the
    graph)."""
    if isinstance(v, Scalar):
        if v.dtype is not DataType.Int:
            raise UnsupportedOpError(f"{op} {what} of dtype {v.dtype.name}")
        return int(v.value) if v.is_const else v
    return None if v is None and open_ok else _const_int(v, f"{op} {what}")


@lowers("aten::select", op_class=METADATA, n_args=(3,), const_args=(1, 2))
def _select(x, dim, index):
    """x[..., index, ...] along `dim`: a one-wide slice, squeezed (a view like slice: free at a
    region's edge, an index shift between compute ops). On an axis of symbolic size the index
    is checked when the sizes are bound (the slice past the axis: the region runs eagerly,
    which raises as eager does); a negative index there starts the slice at size + index, a
    scalar the host computes (a shift the kernel reads as a parameter), its extent 1."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("aten::select of a 0-dim or non-tensor value")
    d = _dim(dim, x.ndim, "aten::select")
    n = x.logical[d].known_size()
    if n is not None:
        i = _index(index, n, "aten::select")
    else:
        i = _const_int(index, "aten::select index")
        if i < 0:
            start = _sub(x.logical[d].full_extent, -i)     # < 0 when bound: eager's IndexError
            end = None if i == -1 else B.elementwise("add", start, 1)
            return B.squeeze(B.slice_axis(x, d, start, end, length=1), [d])
    return B.squeeze(B.slice_axis(x, d, i, i + 1), [d])


def _index(index, n: int, what: str) -> int:
    """A constant index into an axis of `n` elements, negative ones counted from the end;
    out of range is refused (eager raises)."""
    i = _const_int(index, f"{what} index")
    if not -n <= i < n:
        raise UnsupportedOpError(f"{what}: index {index} is out of range for size {n}")
    return i % n


@lowers("aten::cat", n_args=(2,), const_args=(1,))
def _cat(tensors, dim=0):
    _tensor_list(tensors, "aten::cat")
    # eager skips 1-D empty operands of any rank (legacy); the Fusion needs one rank
    rank = max(t.ndim for t in tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and rank != 1 and _is_empty(t))]
    if not kept or any(t.ndim != rank for t in kept) or rank == 0:
        raise UnsupportedOpError("aten::cat of tensors of different ranks")
    return B.cat(kept, _dim(dim, rank, "aten::cat"))


@lowers("aten::roll", n_args=(2, 3), const_args=(1, 2))
def _roll(x, shifts, dims=()):
    """torch.roll along given dims (Swin's shifted windows and their gradient): per dim, the
    last shift % n elements then the first ones, a cat of two slices (the kernel indexes both).
    Constant shifts; on an axis of symbolic size n the cut n - shift % max(n, 1) is a scalar
    the host computes when the sizes are bound. A roll of the flattened tensor (no dims) is
    left to eager."""
    if not isinstance(x, TensorView) or x.ndim == 0:
        raise UnsupportedOpError("aten::roll of a 0-dim or non-tensor value")
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if not dims:
        raise UnsupportedOpError("aten::roll of the flattened tensor (no dims)")
    if len(shifts) != len(dims):
        raise UnsupportedOpError("aten::roll: shifts and dims of different lengths (eager raises)")
    out = x
    for shift, dim in zip(shifts, dims):
        d = _dim(dim, x.ndim, "aten::roll")
        shift = _const_int(shift, "aten::roll shift")
        n = x.logical[d].known_size()
        if n is None:
            size = x.logical[d].full_extent
            cut = B.elementwise("sub", size, B.elementwise(
                "remainder", shift, B.elementwise("maximum", size, 1)))
            out = B.cat([B.slice_axis(out, d, cut, None), B.slice_axis(out, d, 0, cut)], d)
        elif n and shift % n:
            k = shift % n
            out = B.cat([B.slice_axis(out, d, n - k, n), B.slice_axis(out, d, 0, n - k)], d)
    return B.set_(out) if out is x else out


@lowers("aten::stack", n_args=(2,), const_args=(1,))
def _stack(tensors, dim=0):
    """torch.stack: each tensor with a new axis of size 1 at `dim`, joined along it (a cat of
    unsqueezed views: one kernel writes the stacked tensor)."""
    _tensor_list(tensors, "aten::stack")
    rank = tensors[0].ndim
    if any(t.ndim != rank for t in tensors):
        raise UnsupportedOpError("aten::stack of tensors of different ranks (eager raises)")
    d = _dim(dim, rank + 1, "aten::stack")
    return B.cat([B.unsqueeze(t, d) for t in tensors], d)


def _tensor_list(tensors, what: str) -> None:
    if not isinstance(tensors, (list, tuple)) or not tensors or \
            not all(isinstance(t, TensorView) for t in tensors):
        raise UnsupportedOpError(f"{what} takes a list of tensors")


def _is_empty(t: TensorView) -> bool:
    return t.logical[0].known_size() == 0


def _pad(x: TensorView, pairs: list, value, what: str):
    """x with pairs[j] = (lo, hi) elements of `value` around axis j; negative entries slice.
    On an axis of symbolic size n a negative high side ends the slice at the scalar n + hi
    (computed on the host); binding the sizes checks start <= end (a call where the axis is too
    short runs eagerly, which raises as eager does)."""
    grow = []
    for j, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:                     # a negative pad cuts: a slice first
            n = x.logical[j].known_size()
            s = max(-lo, 0)
            if n is None:      # the end a scalar of the size, checked >= s when it is bound
                e = None if hi >= 0 else _sub(x.logical[j].full_extent, -hi)
                x = B.slice_axis(x, j, s, e) if s or e is not None else x
            else:
                e = n - max(-hi, 0)
                if e < s:
                    raise UnsupportedOpError(f"{what}: axis {j} would get a negative size")
                x = B.slice_axis(x, j, s, e)
        grow.append((max(lo, 0), max(hi, 0)))
    if not any(lo or hi for lo, hi in grow):
        return x
    if isinstance(value, Scalar) and not value.is_const:
        raise UnsupportedOpError(f"{what}: the pad value must be a constant")
    return B.pad(x, grow, value)


@lowers("aten::constant_pad_nd", n_args=(2, 3), const_args=(1, 2))
def _constant_pad_nd(x, pad, value=0):
    if not isinstance(x, TensorView):
        raise UnsupportedOpError("aten::constant_pad_nd of a non-tensor value")
    pad = [_const_int(p, "aten::constant_pad_nd pad") for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise UnsupportedOpError(f"aten::constant_pad_nd: {len(pad)} pads for rank {x.ndim}")
    pairs = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):                 # the last axis first
        pairs[x.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return _pad(x, pairs, 0 if value is None else value, "aten::constant_pad_nd")


@lowers("aten::slice_backward", n_args=(6,), const_args=(1, 2, 3, 4, 5))
def _slice_backward(grad, input_sizes, dim, start, end, step):
    """zeros(input_sizes) with grad at [start:end] along `dim` (eager's slice bounds): a pad of
    grad. With constant sizes and bounds the pads are constants; with a SymInt size or bound
    they are eager's clamped bounds as scalar expressions (slice_bounds.py): lo the start, hi
    the size less the end, and the output's extents are input_sizes, so binding the sizes
    checks that the gradient fits (a call it does not, or whose constant end is past the
    size, runs eagerly)."""
    what = "aten::slice_backward"
    if not isinstance(grad, TensorView):
        raise UnsupportedOpError(f"{what} of a non-tensor value")
    step = _step(step, what)
    sizes = _sizes(input_sizes, what)
    if len(sizes) != grad.ndim:
        raise UnsupportedOpError(f"{what}: sizes and gradient ranks differ")
    d = _dim(dim, grad.ndim, what)
    start, end = _bound(start, "start", what), _bound(end, "end", what)
    if not any(isinstance(v, Scalar) for v in sizes + [start, end]):
        s, e = _bounds(sizes[d], start, end)
        _fits(grad, {d: -(-(e - s) // step)}, what)
        pairs = [(0, 0)] * grad.ndim
        if step == 1:
            pairs[d] = (s, sizes[d] - e)
            return _pad(grad, pairs, 0, what)
        pairs[d] = (s, sizes[d] - s - stepped_span(e - s, step))
        return _symbolic_pad(grad, d, s, pairs[d][1], sizes, step)
    n = sizes[d]
    s, e = clamped(n, start, end)
    _fits(grad, {k: m for k, m in enumerate(sizes) if k != d and isinstance(m, int)}, what)
    if step == 1:
        hi = 0 if e is None or e is n else _sub(n, e)
    else:
        hi = _sub(_sub(n, s), stepped_span(_sub(n if e is None else e, s), step))
    return _symbolic_pad(grad, d, s, hi, sizes, step)


@lowers("aten::select_backward", n_args=(4,), const_args=(1, 2, 3))
def _select_backward(grad, input_sizes, dim, index):
    """zeros(input_sizes) with grad at `index` along `dim`: a pad of the unsqueezed gradient,
    one element wide. On an axis of symbolic size the index (a constant) is checked when the
    sizes are bound (a negative one counts from the end): a call it does not fit runs eagerly,
    which raises as eager does."""
    what = "aten::select_backward"
    if not isinstance(grad, TensorView):
        raise UnsupportedOpError(f"{what} of a non-tensor value")
    sizes = _sizes(input_sizes, what)
    if len(sizes) != grad.ndim + 1:
        raise UnsupportedOpError(f"{what}: the sizes are not one axis more than the gradient's")
    d = _dim(dim, len(sizes), what)
    rest = {k if k < d else k - 1: n for k, n in enumerate(sizes) if k != d}
    n = sizes[d]
    if not any(isinstance(v, Scalar) for v in sizes):
        i = _index(index, n, what)
        _fits(grad, rest, what)
        pairs = [(0, 0)] * len(sizes)
        pairs[d] = (i, n - i - 1)
        return _pad(B.unsqueeze(grad, d), pairs, 0, what)
    _fits(grad, {k: m for k, m in rest.items() if isinstance(m, int)}, what)
    if isinstance(n, int):
        i = _index(index, n, what)
        lo, hi = i, n - i - 1
    else:
        i = _const_int(index, f"{what} index")
        lo, hi = (i, _sub(n, i + 1)) if i >= 0 else (_sub(n, -i), -i - 1)
    return _symbolic_pad(B.unsqueeze(grad, d), d, lo, hi, sizes)


def _sizes(input_sizes, what: str) -> list:
    """A backward op's input sizes: constant ints, or symbolic Int Scalars (SymInts)."""
    if not isinstance(input_sizes, (list, tuple)):
        raise UnsupportedOpError(f"{what}: the input sizes are not a list")
    return [_bound(v, "input size", what, open_ok=False) for v in input_sizes]


def _sub(a, b):
    """a - b of ints or Int Scalars (a scalar expression the host computes when either is)."""
    if not isinstance(a, Scalar) and not isinstance(b, Scalar):
        return a - b
    return B.elementwise("sub", a, b)


def _symbolic_pad(grad: TensorView, d: int, lo, hi, sizes: list, step: int = 1) -> TensorView:
    """grad with lo / hi zeros around axis d (ints or Int Scalars, checked >= 0 when the sizes
    are bound) and, for a step > 1, step - 1 zeros between its elements there, whose output
    extents are `sizes` (checked against grad's sizes then)."""
    pairs = [(0, 0)] * grad.ndim
    pairs[d] = (lo, hi)
    steps = [1] * grad.ndim
    steps[d] = step
    return B.pad(grad, pairs, 0, extents=sizes, steps=steps)


def _fits(grad: TensorView, want: dict, what: str) -> None:
    """The gradient's axes {axis: size} as the op's constant sizes say. An axis of symbolic size
    is taken to fit: these ops come from traced backward graphs (AOTAutograd, TorchScript's
    autodiff), which pass them the gradient of the forward's own view, whose sizes the trace
    checked; a constant that does not fit is refused (eager raises). With SymInt sizes the pad's
    output extents are the sizes, checked against the gradient's when the sizes are bound."""
    for k, n in want.items():
        have = grad.logical[k].known_size()
        if have is not None and have != n:
            raise UnsupportedOpError(f"{what}: the gradient's axis {k} has {have} elements, the "
                                     f"sizes say {n}")
