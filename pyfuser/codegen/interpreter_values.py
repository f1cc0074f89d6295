"""Lane values of the CPU interpreter (interpreter.py): what a kernel-IR `Convert` and `Op`
compute on every lane at once, and what an uninitialised local array holds.

Op values come from the op table's PyTorch reference in the op's register type (half / bfloat16
compute in float32 and are rounded where the kernel rounds); a value the same in every thread is
a Python scalar. Lanes no thread owns are evaluated too (the interpreter masks at stores), so an
op whose reference raises on some operand (an integer division by zero) is evaluated so that
such lanes do not stop the kernel.
"""
from __future__ import annotations

import torch

from ..ir.ops import kernel_op
from . import kernel_ir as K

SCALAR_ARG_OPS = {"leaky_relu": (1,), "softplus": (1, 2), "hardtanh": (1, 2), "threshold": (1, 2),
                  "addcmul": (3,)}


def convert_value(x: K.Convert, v):
    scalar = not isinstance(v, torch.Tensor)
    if scalar and x.kind in ("cast", "store"):   # a value the same in every thread
        v = torch.tensor(v, dtype=x.src.compute.torch)
    if x.kind == "load":
        out = v.float() if x.src.is_reduced_float else v
    elif x.kind == "store":
        out = v.to(x.dst.torch)
    elif x.kind == "round":
        out = (torch.tensor(v, dtype=torch.float32) if scalar else v).to(x.dst.torch).float()
    else:
        out = v.to(x.dst.torch)
        if x.dst.is_reduced_float:
            out = out.float()
    if scalar and isinstance(out, torch.Tensor):
        return out.item()
    return out


def apply_op(x: K.Op, args):
    info = kernel_op(x.name)
    reg = x.compute.compute.torch
    if not any(isinstance(a, torch.Tensor) for a in args):
        targs = [torch.tensor(a, dtype=torch.bool if i == 0 and x.name == "where" else reg)
                 for i, a in enumerate(args)]
        return info.ref(*targs).item()
    keep_scalar = SCALAR_ARG_OPS.get(x.name, ())
    targs = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) or i in keep_scalar:
            targs.append(a)
        else:
            dt = torch.bool if (x.name == "where" and i == 0) else reg
            targs.append(torch.tensor(a, dtype=dt))
    if x.name in INTEGER_DIVISIONS and not reg.is_floating_point and reg != torch.bool:
        return _integer_division(info, targs)
    return info.ref(*targs)


# Integer divisions whose torch reference raises on a zero divisor (a GPU's integer division
# does not trap).
INTEGER_DIVISIONS = frozenset(("div_trunc", "div_floor", "remainder", "fmod"))


def _integer_division(info, targs):
    """An integer division evaluated on every lane, as the interpreter evaluates each op: lanes
    no thread owns (past the bounds, reduction lanes not yet combined) hold values the kernel
    never stores, zero divisors among them, where torch's reference raises. Those lanes divide
    by 1 and give -1 (a division) or the dividend (a remainder); no output holds them unless
    the program itself divides an integer by zero (eager raises on the CPU; a CUDA kernel,
    eager's or pyfuser's, returns an unspecified value)."""
    a, b = targs
    if not isinstance(b, torch.Tensor) or not bool((b == 0).any()):
        return info.ref(a, b)
    zero = b == 0
    out = info.ref(a, torch.where(zero, torch.ones_like(b), b))
    fill = torch.full_like(out, -1) if info.name.startswith("div") else \
        torch.broadcast_to(a, out.shape).to(out.dtype) if isinstance(a, torch.Tensor) else \
        torch.full_like(out, a)
    return torch.where(torch.broadcast_to(zero, out.shape), fill, out)


def _garbage(shape, dtype) -> torch.Tensor:
    """What an uninitialised local array holds here: NaN, or 0x5a bytes (a kernel reading an
    element it never wrote gives a wrong result, not a lucky zero)."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    t = torch.empty(shape, dtype=dtype)
    if t.numel():
        t.view(-1).view(torch.uint8).fill_(0x5A) if dtype != torch.bool else t.fill_(True)
    return t
