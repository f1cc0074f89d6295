"""The op generators of the differential fuzzer (program_fuzz.py): each draws one random op
(pointwise of every arity with tensor, 0-dim tensor and Python-scalar operands, alpha and
rounding modes; casts and comparisons; views, reshapes, permutes, squeezes and expands, sizes
also read at run time; reductions; in-place ops; cats and stacks) over the values of a program
being built (program_fuzz._Builder), runs it eagerly, and appends it when eager accepts it.
`GENERATORS`: (generator, weight) pairs that program_fuzz.generate draws from.
"""
from __future__ import annotations

import math
import random

import torch

from program_fuzz import BINARY, BOOL, DTYPES, INPLACE, UNARY, _CODE, _Builder


def _scalar_for(b: _Builder, t: torch.Tensor):
    r = b.r
    if t.dtype == BOOL and r.random() < 0.5:
        return r.choice([True, False])
    if t.dtype.is_floating_point or r.random() < 0.3:
        return r.choice([0.5, 2.0, -1.5, 3.0])
    return r.choice([1, 2, 3, -2])


def _scalar_operand(b: _Builder, t: torch.Tensor) -> str:
    scalars = [n for n, v in b.values.items() if isinstance(v, (int, float))
               and not isinstance(v, bool) and n.startswith("s")]
    if scalars and b.r.random() < 0.5:
        return b.r.choice(scalars)
    return b.const(_scalar_for(b, t))


def _gen_unary(b):
    x = b.pick()
    op = b.r.choice(UNARY)
    return b.emit(f"aten::{op}", [x])


def _operand(b, x):
    r = b.r
    roll = r.random()
    if roll < 0.55:
        y = b.pick(recent=False)
        return y
    if roll < 0.7:                                  # a 0-dim tensor operand
        t = b.values[x]
        name = b.pick(lambda v: v.dim() == 0)
        return name if name is not None else _scalar_operand(b, t)
    return _scalar_operand(b, b.values[x])


def _gen_binary(b):
    r = b.r
    x = b.pick()
    op = r.choice(BINARY)
    y = _operand(b, x)
    if op in ("add", "sub", "rsub") and r.random() < 0.5:
        return b.emit(f"aten::{op}", [x, y, b.const(r.choice([1, 2, 0.5]))])
    if op == "div" and r.random() < 0.4:
        return b.emit("aten::div", [x, y, b.const(r.choice(["trunc", "floor"]))])
    if op == "pow" and r.random() < 0.5:
        return b.emit("aten::pow", [x, b.const(r.choice([2, 3, -1, 0.5, 2.0]))])
    if op == "rsub" and r.random() < 0.5:
        return b.emit("aten::rsub", [x, y])
    return b.emit(f"aten::{op}", [x, y])


def _gen_special(b):
    r = b.r
    x = b.pick()
    roll = r.randrange(9)
    if roll == 0:
        cond = b.pick(lambda v: v.dtype == BOOL)
        if cond is None:
            return None
        return b.emit("aten::where", [cond, x, _operand(b, x)])
    if roll == 1:
        lo, hi = r.choice([(-1.0, 1.0), (None, 0.5), (0, None), (-2, 2)])
        return b.emit("aten::clamp", [x, b.const(lo), b.const(hi)])
    if roll == 2:
        return b.emit("aten::gelu", [x, b.const(r.choice(["none", "tanh"]))])
    if roll == 3:
        return b.emit("aten::leaky_relu", [x, b.const(r.choice([0.01, 0.2]))])
    if roll == 4:
        return b.emit("aten::hardtanh", [x, b.const(-1.0), b.const(1.0)])
    if roll == 5:
        y = b.pick(recent=False)
        return b.emit("aten::lerp", [x, y, b.const(r.choice([0.25, 0.75]))])
    if roll == 6:
        y, z = b.pick(recent=False), b.pick(recent=False)
        return b.emit("aten::addcmul", [x, y, z, b.const(r.choice([1, 0.5]))])
    if roll == 7:
        mask = b.pick(lambda v: v.dtype == BOOL)
        if mask is None:
            return None
        return b.emit("aten::masked_fill", [x, mask, b.const(_scalar_for(b, b.values[x]))])
    return b.emit("aten::threshold", [x, b.const(0.5), b.const(-1.0)])


def _gen_cast(b):
    r = b.r
    x = b.pick()
    if r.random() < 0.2:
        y = b.pick(recent=False)
        return b.emit("aten::type_as", [x, y])
    dt = r.choice(DTYPES)
    return b.emit("aten::to", [x, b.const(_CODE[dt]), b.const(False), b.const(False),
                               b.const(None)])


def _gen_view(b):
    r = b.r
    x = b.pick()
    t = b.values[x]
    shape = list(t.shape)
    roll = r.randrange(11)
    if roll in (0, 1):
        new = _refactor(r, shape)
        return b.emit(r.choice(["aten::view", "aten::reshape"]), [x, b.const(new)])
    if roll == 2 and t.dim() >= 1:
        dims = list(range(t.dim()))
        r.shuffle(dims)
        return b.emit("aten::permute", [x, b.const(dims)])
    if roll == 3 and t.dim() >= 2:
        d0, d1 = r.sample(range(t.dim()), 2)
        return b.emit("aten::transpose", [x, b.const(d0), b.const(d1)])
    if roll == 4:
        return b.emit("aten::unsqueeze", [x, b.const(r.randint(-t.dim() - 1, t.dim()))])
    if roll == 5 and t.dim() >= 1:
        if r.random() < 0.5:
            return b.emit("aten::squeeze", [x])
        return b.emit("aten::squeeze", [x, b.const(r.randrange(t.dim()))])
    if roll in (6, 7):
        target = [(r.choice([2, 3, 4]) if s == 1 else s) if r.random() < 0.8 else -1
                  for s in shape]
        if r.random() < 0.3:
            target = [r.choice([2, 3])] + target
        return b.emit("aten::expand", [x, b.const(target), b.const(False)])
    if roll == 9 and t.dim() >= 1:
        return _view_from_sizes(b, x)
    if roll == 8 and t.dim() >= 1:
        s = r.randrange(t.dim())
        return b.emit("aten::flatten", [x, b.const(s), b.const(r.randrange(s, t.dim()))])
    if t.dim() <= 2 and r.random() < 0.5:
        return b.emit("aten::t", [x])
    return b.emit("aten::contiguous", [x, b.const(0)])


def _view_from_sizes(b: _Builder, x: str):
    """reshape / expand with sizes read from a tensor at run time (`aten::size`, a traced
    model's way): the group takes them as host ints and is specialised on their values."""
    r, t = b.r, b.values[x]
    src = b.pick(lambda v: v.dim() >= 1, recent=False) or x
    sizes = []
    for d in range(b.values[src].dim()):
        c = b.const(d)
        n = b.fresh("n")
        b.lines.append(f"  %{n} : int = aten::size(%{src}, %{c})\n")
        b.values[n] = b.values[src].shape[d]
        sizes.append(n)
    if r.random() < 0.5:
        sizes.append(b.const(-1))
        r.shuffle(sizes)
    lst = b.fresh("l")
    b.lines.append(f"  %{lst} : int[] = prim::ListConstruct({', '.join('%' + n for n in sizes)})\n")
    b.values[lst] = [b.values[n] for n in sizes]
    if r.random() < 0.5:
        out = b.emit("aten::reshape", [x, lst])
    else:
        out = b.emit("aten::expand", [x, lst, b.const(False)])
    if out is not None:
        b.ops[-1].args.append(src)            # read through aten::size: keep it when shrinking
    return out


def _refactor(r: random.Random, shape: list) -> list:
    n = math.prod(shape)
    if n == 0:
        return [0, -1] if r.random() < 0.5 else list(shape)
    factors, m = [], n
    for p in (2, 3, 5, 7):
        while m % p == 0:
            factors.append(p)
            m //= p
    if m > 1:
        factors.append(m)
    r.shuffle(factors)
    k = r.randint(1, 3)
    out = [1] * k
    for f in factors:
        out[r.randrange(k)] *= f
    if r.random() < 0.3:
        out[r.randrange(k)] = -1
    return out


def _gen_reduction(b):
    r = b.r
    x = b.pick()
    t = b.values[x]
    dims = sorted(r.sample(range(t.dim()), r.randint(1, t.dim()))) if t.dim() else []
    keep = r.random() < 0.5
    kind = r.choice(["sum", "mean", "amax", "amin"])
    if kind in ("sum", "mean"):
        return b.emit(f"aten::{kind}", [x, b.const(dims), b.const(keep), b.const(None)])
    return b.emit(f"aten::{kind}", [x, b.const(dims), b.const(keep)])


def _gen_inplace(b):
    r = b.r
    x = b.pick(recent=r.random() < 0.7)
    op = r.choice(INPLACE)
    if op in ("add_", "sub_", "mul_", "div_"):
        y = _operand(b, x)
        args = [x, y] + ([b.const(1)] if op in ("add_", "sub_") else [])
    elif op == "clamp_":
        args = [x, b.const(-0.5), b.const(0.5)]
    else:
        args = [x]
    before = b.values[x].clone()
    out = b.emit(f"aten::{op}", args)
    if out is None:
        try:
            b.values[x].copy_(before)            # a rejected in-place op may have written
        except RuntimeError:
            pass                                 # an expanded input: nothing was written
    return out


def _gen_cat(b):
    """`aten::cat` or `aten::stack` of 2-3 tensors (a `prim::ListConstruct` of them in the
    graph; the cat along any axis, negative too, of operands equal off that axis)."""
    r = b.r
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.values[x]
    if r.random() < 0.6:
        kind, d = "aten::cat", r.randrange(t.dim())
        fits = lambda u: u.dim() == t.dim() and all(  # noqa: E731
            u.shape[i] == t.shape[i] for i in range(t.dim()) if i != d)
        dim = d - t.dim() if r.random() < 0.3 else d
    else:
        kind, dim = "aten::stack", r.randint(-t.dim() - 1, t.dim())
        fits = lambda u: tuple(u.shape) == tuple(t.shape)  # noqa: E731
    items = [x] + [b.pick(fits, recent=False) or x for _ in range(r.randint(1, 2))]
    name = b.fresh("l")
    b.lines.append(f"  %{name} : Tensor[] = prim::ListConstruct("
                   f"{', '.join('%' + i for i in items)})\n")
    b.values[name] = [b.values[i] for i in items]
    out = b.emit(kind, [name, b.const(dim)])
    if out is not None:                  # the items are what the op reads (pruning keeps them)
        b.ops[-1].args += items
        b.ops[-1].uses = list(items)
    return out


GENERATORS = [(_gen_binary, 30), (_gen_unary, 20), (_gen_special, 10), (_gen_cast, 8),
              (_gen_view, 15), (_gen_reduction, 6), (_gen_inplace, 11), (_gen_cat, 5)]
