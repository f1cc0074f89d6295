"""The forms of `fd.define_tensor` and `fd.from_pytorch`, reduced to one canonical call.

nvFuser's frontend grew several ways of declaring a tensor input; all of them are accepted:
    define_tensor(ndims[, dtype])                         rank only (layout unknown)
    define_tensor(symbolic_sizes[, contiguous][, dtype])  -1: any size, 1: broadcast, n > 1: n
    define_tensor(sizes, strides[, dtype])                a tensor's sizes and strides (positional
    define_tensor(sizes=, strides=, dtype=, static_sizes=)  or keywords)
    define_tensor(shape=, contiguity=, dtype=, is_cpu=, stride_order=)
    from_pytorch(tensor)                                  sizes, strides and dtype of a tensor
`canonical_tensor(args, kwargs)` returns the keyword arguments of the one form they all record as,
`define_tensor(symbolic_sizes=, contiguous=, dtype=[, is_cpu=True][, stride_order=])`, so two
definitions that declare the same input print the same and hit the same FusionCache entry.

From sizes and strides: a size-1 axis is a broadcast axis, a stride-0 axis of size > 1 (an
expanded tensor) an iteration axis of unknown contiguity (None); other sizes become -1 (symbolic,
so the fusion serves every size) unless static_sizes=True. Contiguity follows nvFuser's rule
(`compute_contiguity`); a tensor whose strides are not in row-major order also records its
`stride_order` (pyfuser's: stride_order[i] is the rank of axis i's stride, largest = outermost)
with its contiguity taken in that order, so schedulers see the permutation.
"""
from __future__ import annotations

from ..errors import FusionDefinitionError
from ..ir.dtypes import DataType

TENSOR_KEYWORDS = ("symbolic_sizes", "contiguous", "contiguity", "shape", "sizes", "strides",
                   "dtype", "is_cpu", "static_sizes", "stride_order")


def _fail(message: str):
    raise FusionDefinitionError(f"define_tensor: {message}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(v, what: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(i) for i in v):
        _fail(f"{what} must be a list of ints, got {v!r}")
    return [int(i) for i in v]


def compute_contiguity(sizes, strides) -> list:
    """nvFuser's contiguity of a tensor, per axis: None for a broadcast axis (size 1) or an
    expanded one (stride 0); else whether its stride is the next non-broadcast axis's stride times
    that axis's size (1 for the innermost one)."""
    sizes, strides = list(sizes), list(strides)
    if len(sizes) != len(strides):
        raise FusionDefinitionError(
            f"compute_contiguity: {len(sizes)} sizes but {len(strides)} strides")
    result: list = [None] * len(sizes)
    expected = 1
    for i in reversed(range(len(sizes))):
        if sizes[i] == 1 or strides[i] == 0:
            continue
        result[i] = strides[i] == expected
        expected = strides[i] * sizes[i]
    return result


def layout_from_strides(sizes, strides, static_sizes: bool = False) -> dict:
    """{symbolic_sizes, contiguous[, stride_order]} of a tensor with these sizes and strides."""
    sizes = _int_list(sizes, "sizes")
    strides = _int_list(strides, "strides")
    if len(sizes) != len(strides):
        _fail(f"{len(sizes)} sizes but {len(strides)} strides")
    if any(s < 0 for s in sizes) or any(s < 0 for s in strides):
        _fail(f"sizes {sizes} and strides {strides} must not be negative")
    symbolic = [1 if s == 1 else (s if static_sizes else -1) for s in sizes]
    real = [i for i, (n, st) in enumerate(zip(sizes, strides)) if n != 1 and st != 0]
    if sorted(real, key=lambda i: -strides[i]) == real and \
            len({strides[i] for i in real}) == len(real):
        return {"symbolic_sizes": symbolic, "contiguous": compute_contiguity(sizes, strides)}
    inner_first = sorted(range(len(sizes)), key=lambda i: (strides[i], -i))
    stride_order = [0] * len(sizes)
    contiguity: list = [None] * len(sizes)
    expected = 1
    for rank, axis in enumerate(inner_first):
        stride_order[axis] = rank
        if sizes[axis] == 1 or strides[axis] == 0:
            continue
        contiguity[axis] = strides[axis] == expected
        expected = strides[axis] * sizes[axis]
    return {"symbolic_sizes": symbolic, "contiguous": contiguity, "stride_order": stride_order}


def _bool_list(v) -> bool:
    return isinstance(v, (list, tuple)) and all(x is None or isinstance(x, bool) for x in v)


def canonical_tensor(args: tuple, kwargs: dict) -> dict:
    """The canonical keyword arguments of a define_tensor call (see the module docstring)."""
    unknown = sorted(set(kwargs) - set(TENSOR_KEYWORDS))
    if unknown:
        _fail(f"unknown argument {unknown[0]!r} (accepted: {', '.join(TENSOR_KEYWORDS)})")
    kw = dict(kwargs)
    args = list(args)
    if args and isinstance(args[-1], bool) and "is_cpu" not in kw and len(args) > 1:
        kw["is_cpu"] = args.pop()
    if args and isinstance(args[-1], DataType):
        if "dtype" in kw:
            _fail("dtype given twice")
        kw["dtype"] = args.pop()
    if len(args) > 2:
        _fail(f"takes at most 2 positional arguments besides dtype, got {len(args)}")
    if args:
        first = args[0]
        if _is_int(first) and len(args) == 1:
            if first < 0:
                _fail(f"ndims must not be negative, got {first}")
            kw.setdefault("symbolic_sizes", [-1] * first)
            kw.setdefault("contiguous", [False] * first)
        elif len(args) == 2 and _bool_list(args[1]) and not all(_is_int(x) for x in args[1]):
            kw["symbolic_sizes"], kw["contiguous"] = first, args[1]
        elif len(args) == 2:
            kw["sizes"], kw["strides"] = first, args[1]
        else:
            kw["symbolic_sizes"] = first
    if "contiguity" in kw:
        if "contiguous" in kw:
            _fail("give contiguous= or contiguity=, not both")
        kw["contiguous"] = kw.pop("contiguity")
    dtype = kw.get("dtype", DataType.Float)
    if not isinstance(dtype, DataType):
        _fail(f"dtype must be a DataType, got {dtype!r}")
    given = [k for k in ("symbolic_sizes", "shape", "sizes") if k in kw]
    if len(given) != 1:
        _fail("give exactly one of symbolic_sizes=, shape= or sizes= (with strides=), or the rank")
    if "sizes" in kw:
        if "strides" not in kw:
            _fail("sizes= needs strides=")
        if "contiguous" in kw:
            _fail("sizes= and strides= define the contiguity; do not give contiguous= too")
        out = layout_from_strides(kw["sizes"], kw["strides"], bool(kw.get("static_sizes", False)))
        if "stride_order" in kw:
            _fail("sizes= and strides= define the stride order; do not give stride_order= too")
    else:
        if "strides" in kw:
            _fail("strides= goes with sizes=")
        sizes = _int_list(kw.get("symbolic_sizes", kw.get("shape")), "sizes")
        for i, s in enumerate(sizes):
            if s < -1:
                _fail(f"size {i} is {s}; expected -1 (any size), 1 (broadcast) or a size")
        out = {"symbolic_sizes": sizes}
        contiguous = kw.get("contiguous")
        if contiguous is not None:
            if not _bool_list(contiguous):
                _fail(f"contiguous must be a list of True/False/None, got {contiguous!r}")
            if len(contiguous) != len(sizes):
                _fail(f"contiguity has {len(contiguous)} entries for a rank-{len(sizes)} tensor")
            out["contiguous"] = list(contiguous)
        else:
            out["contiguous"] = [None if s == 1 else True for s in sizes]
        if kw.get("stride_order") is not None:
            order = _int_list(kw["stride_order"], "stride_order")
            if sorted(order) != list(range(len(sizes))):
                _fail(f"stride_order {order} is not a permutation of 0..{len(sizes) - 1}")
            out["stride_order"] = order
    is_cpu = kw.get("is_cpu", False)
    if not isinstance(is_cpu, bool):
        _fail(f"is_cpu must be True or False, got {is_cpu!r}")
    if is_cpu and len(out["symbolic_sizes"]) != 0:
        _fail("is_cpu=True is for 0-dim (scalar) tensors only")
    return _in_order(out, dtype, is_cpu)


def _in_order(layout: dict, dtype: DataType, is_cpu: bool) -> dict:
    """The canonical keyword order: symbolic_sizes, contiguous, dtype, is_cpu, stride_order."""
    out = {"symbolic_sizes": layout["symbolic_sizes"], "contiguous": layout["contiguous"],
           "dtype": dtype}
    if is_cpu:
        out["is_cpu"] = True
    if layout.get("stride_order") is not None:
        out["stride_order"] = layout["stride_order"]
    return out


def from_pytorch_kwargs(tensor, static_sizes: bool = False) -> dict:
    """The canonical define_tensor arguments of a torch.Tensor (any device pyfuser runs on)."""
    import torch
    if not isinstance(tensor, torch.Tensor):
        raise FusionDefinitionError(
            f"from_pytorch: expects a torch.Tensor, got {type(tensor).__name__}")
    try:
        dtype = DataType.from_torch(tensor.dtype)
    except ValueError as e:
        raise FusionDefinitionError(f"from_pytorch: {e}") from None
    out = layout_from_strides(list(tensor.shape), list(tensor.stride()), static_sizes)
    return _in_order(out, dtype, tensor.dim() == 0 and tensor.device.type == "cpu")
