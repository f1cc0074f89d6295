"""Reading the example values FX graphs carry (FakeTensors, SymInts) without adding guards.

Under dynamic shapes a FakeTensor's sizes and strides are SymInts; comparing them would add
guards to the shape environment. The backend only needs layout facts (which axes are size 1,
the stride order, contiguity), which do not depend on the size values Dynamo keeps symbolic
(it specialises sizes 0 and 1), so they are read from the SymInts' hints: the values of the
example the graph was traced with.
"""
from __future__ import annotations

import torch


def meta(node):
    """The example value FX recorded for a node (a FakeTensor, a SymInt, a tuple...)."""
    m = getattr(node, "meta", None) or {}
    return m.get("val", m.get("example_value"))


def hint(x) -> int:
    """A size, stride or SymInt as a plain int (its example value)."""
    if isinstance(x, int):
        return int(x)
    node = getattr(x, "node", None)
    h = getattr(node, "hint", None)
    if h is not None:
        return int(h)
    return int(x)                       # last resort (may add a guard)


def same_shape(a, b) -> bool:
    """Shapes `a` and `b` are equal, decided without a guard: a size Dynamo keeps symbolic
    equals only what the shape environment proves it equal to. Comparing the tuples would
    evaluate `s1 == s0` (a tuple compares its elements before its length) and install a guard
    `s1 != s0`, so the graph recompiled at a call with equal sizes (fx fuzz seed 916279); an
    unproven pair counts as different, which keeps a rewrite that needs them equal off."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def is_symbolic(x) -> bool:
    return isinstance(x, torch.SymInt) and not isinstance(getattr(x.node, "maybe_as_int", lambda: None)(), int)


def shape_hints(t: torch.Tensor) -> list[int]:
    return [hint(s) for s in t.shape]


def stride_hints(t: torch.Tensor) -> list[int]:
    return [hint(s) for s in t.stride()]


def dense_strides(sizes, order) -> list[int]:
    """Strides of a dense tensor of `sizes` whose axes are laid out outermost-first as `order`."""
    strides, acc = [0] * len(sizes), 1
    for a in reversed(order):
        strides[a] = acc
        acc *= max(int(sizes[a]), 1)
    return strides


def outer_first(sizes, strides) -> list[int]:
    """Axes outermost first by stride (ties: the later axis is inner, as row-major)."""
    return sorted(range(len(sizes)), key=lambda i: (-strides[i], i))


def layout(t: torch.Tensor):
    """(axes outermost first, dense?) of a tensor's example value."""
    sizes, strides = shape_hints(t), stride_hints(t)
    order = outer_first(sizes, strides)
    dense = all(strides[a] == s for a, s in zip(range(len(sizes)), dense_strides(sizes, order))
                if sizes[a] != 1)
    return order, dense


def has_format(t: torch.Tensor, fmt) -> bool:
    """Whether the example value is dense in memory format `fmt` (hints, no guards)."""
    sizes, strides = shape_hints(t), stride_hints(t)
    n = len(sizes)
    if fmt is torch.channels_last and n == 4:
        order = [0, 2, 3, 1]
    elif fmt is torch.channels_last_3d and n == 5:
        order = [0, 2, 3, 4, 1]
    elif fmt is torch.contiguous_format:
        order = list(range(n))
    else:
        return False
    want = dense_strides(sizes, order)
    return all(strides[a] == want[a] for a in range(n) if sizes[a] != 1)
