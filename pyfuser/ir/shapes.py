"""Run-time binding of a Fusion's symbolic scalars (extents and scalar inputs) to numbers.

`bind(fusion, inputs)` checks each input against its definition (tensor vs scalar, rank, dtype,
sizes that are known, broadcast axes of size 1) and returns a `Bindings` mapping every Scalar the
fusion uses to a Python number: input extents come from the input sizes, derived extents (view
outputs, split/merge results) and scalar expressions are computed. Two iteration axes that meet in
an elementwise op must agree; a mismatch is an ExecuteError naming the op and the axis.

Invariant: everything a kernel launch or an output allocation needs is in the Bindings; no
scheduler or runtime re-derives sizes on its own.
"""
from __future__ import annotations

import math

import torch

from ..errors import ExecuteError
from . import exprs as E
from .base import Scalar
from .dtypes import DataType
from .tensor import TensorView


class Bindings(dict):
    """Scalar -> value. `extent(id)` and `shape(tv)` read tensors' sizes."""

    def value(self, s: Scalar):
        return s.value if s.is_const else self[s]

    def extent(self, d) -> int:
        return int(self.value(d.full_extent))

    def shape(self, tv: TensorView) -> list[int]:
        return [self.extent(d) for d in tv.logical]


def describe_input(i: int, v) -> str:
    return f"input {i} ({v.name})"


def bind(fusion, inputs) -> Bindings:
    if len(inputs) != len(fusion.inputs):
        raise ExecuteError(f"execute: the fusion takes {len(fusion.inputs)} inputs, got {len(inputs)}")
    b = Bindings()
    for i, (v, x) in enumerate(zip(fusion.inputs, inputs)):
        if isinstance(v, TensorView):
            _bind_tensor(b, i, v, x)
        else:
            _bind_scalar(b, i, v, x)
    for e in fusion.exprs:
        _propagate(b, e)
    return b


def _bind_tensor(b: Bindings, i: int, v: TensorView, x) -> None:
    where = describe_input(i, v)
    if not isinstance(x, torch.Tensor):
        raise ExecuteError(f"execute: {where} must be a tensor, got {type(x).__name__}")
    if x.dim() != v.ndim:
        raise ExecuteError(f"execute: {where} must have rank {v.ndim}, got shape {tuple(x.shape)}")
    if x.dtype != v.dtype.torch:
        raise ExecuteError(f"execute: {where} must be {v.dtype.torch}, got {x.dtype}")
    hints = getattr(v, "sizes_hint", None)
    for axis, (d, n) in enumerate(zip(v.logical, x.shape)):
        if d.is_broadcast and n != 1:
            raise ExecuteError(f"execute: {where} axis {axis} was defined as broadcast (size 1), got size {n}")
        if hints and hints[axis] > 1 and hints[axis] != n:
            raise ExecuteError(f"execute: {where} axis {axis} must have size {hints[axis]}, got {n}")
        _set(b, d.extent, int(n), f"{where} axis {axis}")


def _bind_scalar(b: Bindings, i: int, v: Scalar, x) -> None:
    if isinstance(x, torch.Tensor):
        if x.dim() != 0:
            raise ExecuteError(f"execute: input {i} ({v.name}) is a scalar; got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if not isinstance(x, (bool, int, float, complex)):
        raise ExecuteError(f"execute: input {i} ({v.name}) must be a number, got {type(x).__name__}")
    b[v] = x


def _set(b: Bindings, s: Scalar, n: int, what: str) -> None:
    if s.is_const:
        if s.value != n:
            raise ExecuteError(f"execute: {what} must have size {s.value}, got {n}")
        return
    old = b.get(s)
    if old is not None and old != n:
        raise ExecuteError(f"execute: {what} has size {n}, but the same axis has size {old} elsewhere")
    b[s] = n


def _propagate(b: Bindings, e) -> None:
    if isinstance(e, E.ElementwiseOp):
        _check_elementwise(b, e)
        out = e.output
        if isinstance(out, Scalar):
            from .ops import OPS  # scalar arithmetic on the host, with PyTorch's semantics
            args = [torch.tensor(b.value(x), dtype=x.dtype.torch) if isinstance(x, Scalar) else x
                    for x in e.inputs]
            b[out] = _py(OPS[e.op_name].ref(*args).to(out.dtype.torch).item(), out.dtype)
            return
    if isinstance(e, E.ScalarCast):
        b[e.output] = _py(b.value(e.inputs[0]), e.output.dtype)
        return
    if isinstance(e, E.ViewOp):
        _bind_view(b, e)
        return
    check = _CHECKS.get(type(e))
    if check is not None:
        check(b, e)
    for out in e.outputs:
        if isinstance(out, TensorView):
            for d in out.root:
                if not d.extent.is_const and d.extent not in b:
                    raise AssertionError(f"extent {d.extent} of {out.name} was never bound")


def _check_slice(b: Bindings, e) -> None:
    """A slice's bounds (constants, or Scalars the host computed) inside its input's axis (an
    empty slice anywhere), and its output's extents, ceil((end - start) / step)."""
    shape = b.shape(e.inputs[0])
    for axis, (n, start, end, step) in enumerate(zip(shape, e.starts, e.ends, e.steps)):
        start = int(b.value(start)) if isinstance(start, Scalar) else start
        end = int(b.value(end)) if isinstance(end, Scalar) else end
        stop = n if end is None else end
        if (stop > n and stop != start) or not 0 <= start <= stop:
            raise ExecuteError(f"execute: slice {start}:{'' if end is None else end} of "
                               f"{e.inputs[0].name} on axis {axis} does not fit its size {n}")
        _set(b, e.output.logical[axis].full_extent, -(-(stop - start) // step),
             f"slice output {e.output.name} axis {axis}")


def _bind_pad(b: Bindings, e) -> None:
    """A pad's output extents, the input's size (its span, E.span, for a step > 1) plus the pads;
    a symbolic pad (a Scalar the host computed) must not be negative, and an output extent the
    pad was given (its Scalar already bound, or a constant) must equal that sum."""
    shape = b.shape(e.inputs[0])
    for axis, (n, pair, step) in enumerate(zip(shape, e.pads, e.steps)):
        lo, hi = (int(b.value(p)) if isinstance(p, Scalar) else p for p in pair)
        if lo < 0 or hi < 0:
            raise ExecuteError(f"execute: pad {lo}:{hi} of {e.inputs[0].name} on axis {axis} "
                               f"(size {n}) is negative")
        _set(b, e.output.logical[axis].full_extent, E.span(n, step) + lo + hi,
             f"pad output {e.output.name} axis {axis}")


def _bind_cat(b: Bindings, e) -> None:
    shapes = [b.shape(t) for t in e.inputs]
    for axis in range(len(shapes[0])):
        if axis != e.dim and len({s[axis] for s in shapes}) > 1:
            raise ExecuteError(f"execute: cat along axis {e.dim} of tensors with sizes "
                               f"{[s[axis] for s in shapes]} on axis {axis}; they must be equal")
    _set(b, e.output.logical[e.dim].extent, sum(s[e.dim] for s in shapes),
         f"cat output {e.output.name} axis {e.dim}")


def _check_gather(b: Bindings, e) -> None:
    shape, index = b.shape(e.inputs[0]), b.shape(e.inputs[1])
    for axis, (n, k) in enumerate(zip(shape, index)):
        if axis != e.dim and k > n:
            raise ExecuteError(f"execute: gather index {e.inputs[1].name} has size {k} on axis "
                               f"{axis}, more than the input's {n}")


def _check_embedding_backward(b: Bindings, e) -> None:
    grad, index = b.shape(e.inputs[0]), b.shape(e.inputs[1])
    rows = 1
    for n in index:
        rows *= n
    total = 1
    for n in grad:
        total *= n
    if rows * grad[-1] != total:
        raise ExecuteError(f"execute: embedding_backward of a gradient {e.inputs[0].name} of "
                           f"shape {grad} with {rows} indices ({e.inputs[1].name})")


def _check_index_select(b: Bindings, e) -> None:
    """A lookup in an axis of size 0 by an index that has elements raises, as eager's index,
    index_select and embedding do, even where no output element reads a row (its other axes
    empty): the kernels check the indices of the elements they write, and there are none."""
    axes = e.inputs[0].logical                # (none: index_select of a 0-dim input)
    if e.dim < len(axes) and b.extent(axes[e.dim]) == 0 and math.prod(b.shape(e.inputs[1])):
        raise IndexError(f"index is out of bounds for dimension with size 0 (axis {e.dim} of "
                         f"{e.inputs[0].name})")


_CHECKS = {E.SliceOp: _check_slice, E.IndexSelectOp: _check_index_select, E.EmbeddingBackwardOp: _check_embedding_backward, E.PadOp: _bind_pad, E.CatOp: _bind_cat,
           E.GatherOp: _check_gather,
           E.ExpandOp: lambda b, e: _check_expand(b, e)}


def _check_elementwise(b: Bindings, e) -> None:
    axes = [t.logical for t in e.inputs if isinstance(t, TensorView)]   # each tensor's, once
    if len(axes) < 2:
        return
    for axis in range(len(axes[0])):
        sizes = {b.extent(t[axis]) for t in axes if not t[axis].is_size_one_broadcast}
        if len(sizes) > 1:
            raise ExecuteError(f"execute: operands of {e.op_name} have sizes {sorted(sizes)} on axis "
                               f"{axis}; they must be equal or 1")


def resolve_view_shape(in_shape: list[int], new_shape: list[int]) -> list[int] | None:
    """`new_shape` with its -1 filled in for a tensor of `in_shape`; None if it cannot hold the
    same number of elements. Shared by definition-time (builder) and run-time checks."""
    total = math.prod(in_shape)
    shape = list(new_shape)
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or total % rest:
            return None
        shape[shape.index(-1)] = total // rest
    return shape if math.prod(shape) == total else None


def _bind_view(b: Bindings, e) -> None:
    inp, out = e.inputs[0], e.output
    in_shape = b.shape(inp)
    shape = resolve_view_shape(in_shape, [int(b.value(s)) if isinstance(s, Scalar) else s
                                          for s in e.new_shape])
    if shape is None:
        raise ExecuteError(f"execute: view of a tensor of shape {in_shape} ({math.prod(in_shape)} "
                           f"elements) as {e.new_shape} is invalid")
    for axis, (d, n) in enumerate(zip(out.logical, shape)):
        _set(b, d.extent, n, f"view output {out.name} axis {axis}")


def _check_expand(b: Bindings, e) -> None:
    """An axis the fusion holds as a full (iteration) axis is only expanded to its own size: at
    run time it may have size 1 where eager would broadcast it, which the fusion cannot do."""
    inp = e.inputs[0]
    for axis, (d, size) in enumerate(zip(inp.logical, e.sizes)):
        if d.is_broadcast:
            continue
        want = b.value(size) if isinstance(size, Scalar) else size
        if want == -1:
            continue
        have = b.extent(d)
        if have != want:
            raise ExecuteError(
                f"execute: expand of {inp.name} axis {axis} to size {want}: the axis has size "
                f"{have} at run time and the fusion holds it as a full axis (it was not known to "
                f"be 1 when the fusion was defined), so it cannot broadcast it")


def _py(value, dtype: DataType):
    if dtype.is_bool:
        return bool(value)
    if dtype.is_floating:
        return float(value)
    if dtype.is_complex:
        return complex(value)
    return int(value)
