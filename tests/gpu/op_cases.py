"""Op-table test cases shared by the GPU and CPU-interpreter tests: for (op, dtype) a Fusion with
broadcasting operands, and inputs drawn from the op's domain (no zeros as divisors, positive
arguments for logs, ...) so that the reference has no NaN an unwritten output could hide behind."""
from __future__ import annotations

import torch

from pyfuser.errors import FusionDefinitionError
from pyfuser.ir import DataType, Fusion, OPS
from pyfuser.ir import builder as B

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.bool]
POSITIVE = {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "lgamma", "reciprocal"}
UNIT = {"asin", "acos", "atanh", "erfinv"}
DIVISION = {"div", "div_trunc", "div_floor", "remainder", "fmod"}
SHIFTS = {"bitwise_left_shift", "bitwise_right_shift"}
# Python-scalar operands (positions in OpInfo.scalar_args): (float version, int version)
SCALARS = {"leaky_relu": {1: (0.1, 1)}, "addcmul": {3: (0.5, 2)},
           "threshold": {1: (0.1, 1), 2: (2.0, 7)}, "softplus": {1: (1.5, 1), 2: (2.0, 2)},
           "hardtanh": {1: (-0.5, -1), 2: (0.5, 1)}}
# operand i's defined sizes: full, rank-1 (broadcast by rank), and a size-1 broadcast axis
PATTERNS = [[-1, -1], [-1], [-1, 1], [-1, -1]]


def cases():
    return [(name, dt) for name in sorted(OPS) for dt in DTYPES]


def case_id(case) -> str:
    return f"{case[0]}-{str(case[1]).replace('torch.', '')}"


def build(name: str, dtype: torch.dtype):
    """(fusion, operand specs) or None when the builder refuses this op/dtype (as eager would)."""
    info = OPS[name]
    scalar_args = getattr(info, "scalar_args", frozenset())
    f = Fusion()
    specs = []
    try:
        with f:
            operands = []
            for i in range(info.arity):
                if i in scalar_args:
                    fl, it = SCALARS[name][i]
                    operands.append(fl if dtype.is_floating_point else it)
                    continue
                dt = torch.bool if (name == "where" and i == 0) else dtype
                pattern = PATTERNS[len(specs) % len(PATTERNS)]
                tv = B.define_tensor(pattern, DataType.from_torch(dt))
                specs.append((i, dt, pattern))
                operands.append(tv)
            out = B.elementwise(name, *operands)
            f.add_output(out)
    except FusionDefinitionError:
        return None
    return f, specs


def _values(name: str, i: int, dtype: torch.dtype, shape, gen) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not dtype.is_floating_point:
        if name in DIVISION and i == 1:
            v = torch.randint(1, 6, shape, generator=gen)
            return (v * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)).to(dtype)
        if name == "pow":
            return torch.randint(0, 4, shape, generator=gen).to(dtype) if i == 1 else \
                torch.randint(-3, 4, shape, generator=gen).to(dtype)
        if name in SHIFTS:
            return torch.randint(0, 8 if i == 1 else 100, shape, generator=gen).to(dtype)
        return torch.randint(-5, 6, shape, generator=gen).to(dtype)
    lo, hi = -2.0, 2.0
    if name in POSITIVE or (name == "pow" and i == 0):
        lo, hi = 0.1, 3.0
    elif name in UNIT:
        lo, hi = -0.9, 0.9
    elif name == "acosh":
        lo, hi = 1.1, 3.0
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    if name in DIVISION and i == 1:
        x = torch.where(x.abs() < 0.25, torch.full_like(x, 0.5), x)
    return x.to(dtype)


def inputs(name: str, specs, shape=(37, 53), device="cpu", seed=0) -> list:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, dt, pattern in specs:
        if pattern == [-1]:
            s = (shape[1],)
        elif pattern == [-1, 1]:
            s = (shape[0], 1)
        else:
            s = tuple(shape)
        out.append(_values(name, i, dt, s, gen).to(device))
    return out


def tolerances(dtype: torch.dtype) -> dict:
    if dtype == torch.float16:
        return {"rtol": 2e-3, "atol": 1e-3}
    if dtype == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": 1e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    if dtype == torch.float64:
        return {"rtol": 1e-12, "atol": 1e-13}
    return {"rtol": 0, "atol": 0}


def assert_same(outs, refs, what=""):
    assert len(outs) == len(refs), what
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == r.dtype, f"{what} output {k}: dtype {o.dtype} != {r.dtype}"
        assert o.shape == r.shape, f"{what} output {k}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        if o.dtype == torch.bool:
            raw = o.view(torch.uint8) if o.is_contiguous() else o.contiguous().view(torch.uint8)
            assert (int(raw.max()) if raw.numel() else 0) <= 1, f"{what} output {k}: unwritten bools"
        torch.testing.assert_close(o, r, equal_nan=True, msg=lambda m: f"{what} output {k}: {m}",
                                   **tolerances(o.dtype))
