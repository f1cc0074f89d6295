"""The per-call key code and the environment switches of the cached call paths.

`key_function(fusion_inputs)` generates `key_of(inputs) -> (key, tensor pointers)`: the flat
tuple that fixes everything a compiled kernel depends on (executor.py's fast cache, dispatch's
recorded programs, the native runner, which fixes the same things); `key_parts` gives its
pieces for callers that inline the key into their own generated code. `slow_env()` says whether
PYFUSER_DUMP or PYFUSER_POISON_OUTPUTS is set (the fast paths then step aside, so dumps and
poisoning see every call), read from the raw POSIX environment dict on the hot path; `poison`
fills fresh outputs with NaN / 0x7f bytes. Nothing here launches or compiles.
"""
from __future__ import annotations

import math
import os

import torch

from ..ir.tensor import TensorView


def key_function(fusion_inputs):
    """Generate `key_of(inputs) -> (key, tensor pointers)` for a fusion with these inputs.

    The key is one flat tuple: per tensor input (dtype, shape, strides, data_ptr & 15, device
    index), per scalar input (type, value, sign) (the sign tells -0.0 from 0.0; a 0-dim tensor's
    value is (dtype, shape, item), never the tensor: it hashes by identity, so a value changed in
    place would hit the old key); each input gives a fixed number of entries, so flat is
    unambiguous (and cheaper to build and hash than a tuple per input). The pointers come as a
    list the caller may extend. A wrong input list (count, or a non-tensor where a tensor is
    declared) raises; callers then take their checked slow path.
    """
    names, ptrs, key = key_parts(fusion_inputs)
    unpack = (", ".join(names) + ("," if len(names) == 1 else "")) if names else "()"
    lines = ["def key_of(inputs):", f"    {unpack} = inputs"]
    lines += [f"    {p} = x{p[1:]}.data_ptr()" for p in ptrs]
    lines.append(f"    return ({key}), [{', '.join(ptrs)}]")
    env = {"_sign": math.copysign, "_T": torch.Tensor}
    exec(compile("\n".join(lines) + "\n", "<pyfuser key>", "exec"), env)  # noqa: S102
    return env["key_of"]


def key_parts(fusion_inputs):
    """(names x0.., pointer names p.., the key's tuple body) for generated key code: inputs
    unpacked to x<i>, tensor pointers read into p<i> first; `_sign` is math.copysign, `_T`
    torch.Tensor."""
    names, parts, ptrs = [], [], []
    for i, v in enumerate(fusion_inputs):
        names.append(f"x{i}")
        if isinstance(v, TensorView):
            ptrs.append(f"p{i}")
            parts.append(f"x{i}.dtype, x{i}.shape, x{i}.stride(), p{i} & 15, x{i}.get_device()")
        else:
            parts.append(f"type(x{i}), (x{i}.dtype, x{i}.shape, x{i}.item()) "
                         f"if isinstance(x{i}, _T) else x{i}, _sign(1.0, x{i})")
    return names, ptrs, "".join(q + ", " for q in parts)


# os.environ.get costs ~1 us (it encodes the key); the hot path reads the raw POSIX dict, which
# os.environ (and pytest's monkeypatch) keeps in sync. Elsewhere it falls back to os.environ.
_RAW_ENV = getattr(os.environ, "_data", None)
if not (isinstance(_RAW_ENV, dict) and os.name == "posix"):
    _RAW_ENV = None


def _env_set(name: str, raw: bytes) -> bool:
    """True when the variable is set to something other than '' or '0'."""
    v = _RAW_ENV.get(raw) if _RAW_ENV is not None else os.environ.get(name)
    return bool(v) and v not in (b"0", "0")


def poison_enabled() -> bool:
    return _env_set("PYFUSER_POISON_OUTPUTS", b"PYFUSER_POISON_OUTPUTS")


def slow_env() -> bool:
    """True when PYFUSER_POISON_OUTPUTS or PYFUSER_DUMP is set: fast calls step aside."""
    if _RAW_ENV is not None:
        return b"PYFUSER_DUMP" in _RAW_ENV or b"PYFUSER_POISON_OUTPUTS" in _RAW_ENV
    return "PYFUSER_DUMP" in os.environ or "PYFUSER_POISON_OUTPUTS" in os.environ


def poison(outputs) -> None:
    """Fill outputs with NaN (floating/complex) or 0x7f bytes over their whole storage."""
    for out in outputs:
        if out.numel() == 0:
            continue
        if out.is_floating_point() or out.is_complex():
            out.fill_(float("nan"))
        else:
            raw = torch.empty(0, dtype=torch.uint8, device=out.device)
            raw.set_(out.untyped_storage())
            raw.fill_(0x7F)
