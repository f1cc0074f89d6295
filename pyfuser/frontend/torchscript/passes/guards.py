"""Run-time guards of a fusion group: what its specialisation relies on, checked per call.

A group is lowered (`lower_graph(subgraph, example_inputs)`) on its first call's inputs. The
Fusion then assumes, per tensor input: dtype, rank, device, which axes have size 1 (they are
broadcast axes), and the stride order and contiguity of the others; per scalar input: its
Python type (the stride order with size-1 axes where row-major puts them: their strides are
arbitrary). `signature(inputs)` is exactly that (sizes other than 1 are left out, so a new
shape of the same rank and layout reuses the compiled group). `mismatch(expected, actual)`
names the first difference, for the log line and the `fallback` dump.
"""
from __future__ import annotations

import torch

from ...lowering.lower import axis_order


def _layout(t: torch.Tensor) -> tuple:
    sizes, strides = list(t.shape), list(t.stride())
    order = axis_order(sizes, strides)              # size-1 axes: row-major, as lowered
    contiguity, expected = [], 1
    rank = [0] * len(sizes)
    for r, axis in enumerate(order):
        rank[axis] = r
    per_axis = [None] * len(sizes)
    for axis in order:
        if sizes[axis] == 1:
            continue
        per_axis[axis] = strides[axis] == expected
        expected = strides[axis] * sizes[axis]
    contiguity = tuple(per_axis)
    return tuple(rank), contiguity


def tensor_signature(t: torch.Tensor) -> tuple:
    order, contiguity = _layout(t)
    size_one = tuple(s == 1 for s in t.shape)
    return ("tensor", t.dtype, t.dim(), str(t.device), size_one, order, contiguity)


def signature(inputs) -> tuple:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(tensor_signature(x))
        else:
            out.append(("scalar", type(x).__name__))
    return tuple(out)


_FIELDS = ("kind", "dtype", "rank", "device", "size-1 axes", "stride order", "contiguity")


def mismatch(expected: tuple, actual: tuple) -> str:
    """A short description of the first difference between two signatures."""
    if len(expected) != len(actual):
        return f"{len(actual)} inputs instead of {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e == a:
            continue
        if e[0] != a[0] or e[0] == "scalar":
            return f"input {i}: {a[0]} {a[1:]} instead of {e[0]} {e[1:]}"
        for name, ev, av in zip(_FIELDS[1:], e[1:], a[1:]):
            if ev != av:
                return f"input {i}: {name} {av} instead of {ev}"
    return "same signature"
