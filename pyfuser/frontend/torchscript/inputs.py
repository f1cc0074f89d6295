"""Seeded random inputs for a graph, made from the declared input types.

Rules (the same seed always gives the same values):
  * float/complex tensors: standard normal; integer tensors: 1..9 (division works); bool:
    random with the first element True; nothing is all zeros;
  * a float tensor used (directly or through a fusion subgraph) as a schema argument whose
    name contains "var" (`running_var` of batch/instance norm) gets rand()+0.5 instead;
  * sizes from the type, unknown sizes (or unknown rank: 1-D) default to 4; with
    `size_override=n` every size is capped at n (a test-only way to shrink huge graphs);
  * declared strides are honoured via `torch.empty_strided` (the whole storage is filled,
    so overlapping / expanded strides work); under size_override the stride *order* is kept;
  * scalars: int 1..9, float in [0.5, 2), bool random, Scalar like float; Device -> `device`;
    None/Optional[None] -> None; lists/tuples of those; a class type (`%self`) cannot be made
    and raises RunnerError (pass the module object yourself).
"""
from __future__ import annotations

from typing import Optional

import torch

from pyfuser.errors import RunnerError

from .ops import arg_names
from .types import (BoolType, ComplexType, DeviceType, DictType, FloatType, IntType, ListType,
                    NoneType, NumberType, OptionalType, StringType, TensorType, TupleType)

DEFAULT_SIZE = 4


def _feeds_var(value, depth: int = 0) -> bool:
    """True if `value` is passed as a parameter named like `*var*` of some op."""
    if depth > 8:
        return False
    for use in value.uses:
        user = use.user
        sub = user.attributes.get("Subgraph")
        if sub and sub[0] == "g" and sub[1] is not None and use.offset < len(sub[1].inputs):
            if _feeds_var(sub[1].inputs[use.offset], depth + 1):
                return True
        elif "::" in user.kind and not user.kind.startswith("prim::"):
            if any("var" in name for name in arg_names(user.kind, use.offset)):
                return True
    return False


def _shape(t: TensorType, cap: Optional[int]) -> list:
    sizes = list(t.sizes) if t.sizes is not None else [None]
    out = [DEFAULT_SIZE if s is None else s for s in sizes]
    return [min(s, cap) for s in out] if cap is not None else out


def _strides(t: TensorType, shape: list, cap: Optional[int]) -> Optional[list]:
    st = t.strides
    if st is None or len(st) != len(shape) or None in st:
        return None
    if cap is None:
        return list(st)
    order = sorted(range(len(shape)), key=lambda i: (st[i], -i))   # innermost first
    out, acc = [0] * len(shape), 1
    for i in order:
        out[i] = acc
        acc *= max(shape[i], 1)
    return out


def _fill(shape, dtype, gen, positive: bool) -> torch.Tensor:
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=gen).bool()
        if t.numel():
            t.view(-1)[0] = True
        return t
    if dtype.is_floating_point:
        if positive:
            return (torch.rand(shape, generator=gen) + 0.5).to(dtype)
        t = torch.randn(shape, generator=gen)
        if t.numel() and not t.any():
            t += 1
        return t.to(dtype)
    return torch.randint(1, 10, shape, generator=gen).to(dtype)


def _tensor(t: TensorType, device, gen, cap, positive: bool) -> torch.Tensor:
    dtype = t.dtype or torch.float32
    shape = _shape(t, cap)
    strides = _strides(t, shape, cap)
    if strides is None:
        return _fill(shape, dtype, gen, positive).to(device)
    storage = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 0
    base = _fill([storage], dtype, gen, positive).to(device)
    return base.as_strided(shape, strides)


def _make(t, device, gen, cap, positive=False):
    def rint(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=gen))

    if isinstance(t, TensorType):
        return _tensor(t, device, gen, cap, positive)
    if isinstance(t, BoolType):
        return bool(rint(0, 2))
    if isinstance(t, IntType):
        return rint(1, 10)
    if isinstance(t, (FloatType, NumberType)):
        return 0.5 + float(torch.rand(1, generator=gen)) * 1.5
    if isinstance(t, ComplexType):
        return complex(rint(1, 10), rint(1, 10))
    if isinstance(t, StringType):
        return "a"
    if isinstance(t, DeviceType):
        return torch.device(device)
    if isinstance(t, NoneType):
        return None
    if isinstance(t, OptionalType):
        return _make(t.elem, device, gen, cap, positive)
    if isinstance(t, ListType):
        return [_make(t.elem, device, gen, cap, positive) for _ in range(2)]
    if isinstance(t, TupleType):
        return tuple(_make(e, device, gen, cap, positive) for e in t.elems)
    if isinstance(t, DictType):
        return {}
    raise RunnerError(f"cannot make a random input of type {t}")


def make_inputs(graph, device="cpu", seed: int = 0, size_override: Optional[int] = None) -> list:
    """Random inputs for `graph` on `device` (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for v in graph.inputs:
        try:
            out.append(_make(v.type, device, gen, size_override, positive=_feeds_var(v)))
        except RunnerError as e:
            raise RunnerError(f"input %{v.debug_name}: {e}") from None
    return out
