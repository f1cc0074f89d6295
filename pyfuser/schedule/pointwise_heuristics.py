"""Heuristics of the pointwise scheduler: block size, unroll and the 1-D / 2-D choice.

Inputs are plain numbers (sizes seen when planning, the vector width the layout allows, the
device's multiprocessor count); the output is a `PointwiseParams`. These choices only affect speed:
the lowering is correct for any of them and any size, which is why a kernel planned for one size
is reused for other sizes of the same signature.

Targets (H100/H200, memory bound): 16-byte accesses, 2-4 independent vectors in flight per
thread and tensor, enough blocks to fill every SM several times, no div/mod per element.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from . import cache_policy

DEFAULT_SM_COUNT = 132  # H100 / H200 SXM


def sm_count() -> int:
    """Multiprocessors of the target device: $PYFUSER_SM_COUNT, else the CUDA device, else 132."""
    env = os.environ.get("PYFUSER_SM_COUNT")
    if env:
        return int(env)
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # pragma: no cover - device query is best effort
        pass
    return DEFAULT_SM_COUNT


@dataclass
class PointwiseParams:
    kind: str = "1d"            # "1d": one linear axis; "2d": rows (outer) x columns (inner)
    vec: int = 1                # elements per vectorized access
    block: int = 128            # threads per block (TIDx)
    unroll: int = 1             # vectors per thread (1-D) or rows per thread (2-D)
    index_type: str = "int"     # "int" or "int64_t"
    groups: list = field(default_factory=list)   # collapsed groups of reference axes, outer first
    dropped: list = field(default_factory=list)  # reference axes of size 1 (index always 0)
    max_blocks: int = 0         # grid cap (0: one pass, a block per chunk); the kernel
                                # grid-strides, so any cap is correct
    min_blocks: int = 0         # __launch_bounds__(block, min_blocks): caps registers so that
                                # min_blocks blocks fit on an SM (0: no cap)
    load_cache: str = ""        # cache policy of contiguous (non-broadcast) loads and of
    store_cache: str = ""       # stores: "" plain, "cs" streaming, "ef" L2 evict_first, "el" L2
                                # evict_last (schedule/cache_policy.py)
    reason: str = ""            # why this kind / vector width, for the dump

    def as_dict(self) -> dict:
        return asdict(self)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _env_int(name: str):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _overrides(params: PointwiseParams, sms: int) -> None:
    """Tuning knobs (speed only, never correctness): $PYFUSER_PW_BLOCK, $PYFUSER_PW_UNROLL,
    $PYFUSER_PW_WAVES (grid cap = waves x SMs x resident blocks per SM; 0: one pass),
    $PYFUSER_PW_MINBLOCKS, and $PYFUSER_LOAD_CACHE / $PYFUSER_STORE_CACHE (schedule/cache_policy.py)."""
    b, u, w, mb = (_env_int(n) for n in ("PYFUSER_PW_BLOCK", "PYFUSER_PW_UNROLL",
                                         "PYFUSER_PW_WAVES", "PYFUSER_PW_MINBLOCKS"))
    if b:
        params.block = b
    if u:
        params.unroll = u
    if w is not None:
        params.max_blocks = w * sms * max(1, 2048 // params.block) if w > 0 else 0
    params.load_cache, params.store_cache = cache_policy.choose(params.load_cache,
                                                                params.store_cache)
    if mb is not None:
        params.min_blocks = mb


def choose(params: PointwiseParams, group_extents: list[int], row_invariant_loads: int,
           vec_bytes: int = 0, kind: str | None = None) -> None:
    """Fill kind, block and unroll of `params` from the collapsed extents seen at planning.

    `vec_bytes`: bytes of the widest vectorized access (16 = full 16-byte vectors). Measured on
    an H200 (bench/pointwise.py, 2026-11-22): with 16-byte vectors a 2-D schedule is fastest with
    one row per thread (BN+add+relu 24.4 us vs 25.3 us at 4 rows, broadcast add 51.8 vs 52.5);
    1-D is best at block 128 x unroll 2 for vectors of up to 4 elements, unroll 1 for 8 (bf16 /
    half): unroll 4 measured 2-5% slower; 256 threads, unroll 8, a persistent grid: all slower."""
    sms = sm_count()
    numel = 1
    for e in group_extents:
        numel *= e
    vec = params.vec
    inner = group_extents[-1] if group_extents else 1
    force = kind or os.environ.get("PYFUSER_PW_KIND")   # "1d" / "2d" (speed only)
    if force != "1d" and len(group_extents) >= 2 and (inner >= 64 * vec or force == "2d"):
        params.kind = "2d"
        outer = numel // inner if inner else 0
        cols = _ceil(inner, vec)
        # 128 threads unless a row leaves more than a quarter of them idle and 64 leaves fewer
        # (H200, bench/sweep.py bn, 2026-11-22: 3136-wide rows, 784 vectors, 14% idle at 128:
        # 24.3 / 20.0 / 21.3 us write / read / steady vs 25.2 / 20.4 / 21.6 at 64).
        idle = {b: _ceil(cols, b) * b - cols for b in (128, 64)}
        params.block = 64 if idle[128] > cols / 4 and idle[64] < idle[128] else 128
        nbx = _ceil(cols, params.block)
        unroll = 1 if vec_bytes >= 16 else 4
        while unroll > 1 and nbx * _ceil(outer, unroll) < 4 * sms:
            unroll //= 2
        params.unroll = unroll
        params.reason = f"2-D: {len(group_extents)} collapsed axes, inner extent {inner}"
        _overrides(params, sms)
        return
    params.kind = "1d"
    params.block = 128
    vectors = _ceil(numel, vec)
    # 2 vectors per thread up to 4 elements a vector, else 1 (H200, bench/sweep.py 1d,
    # 2026-11-22, write / read / steady us): GELU f32 8192x3072 u2 52.4 / 48.4 / 50.9, u1 52.7 /
    # 48.5 / 50.5, u4 55.1 / 49.7 / 52.6; SiLU-mul bf16 8192^2 (8 a vector) u2 99.3 / 92.9 / 95.5,
    # u1 98.5 / 92.1 / 94.4 (torch.compile 99.0 / 92.1 / 94.4).
    unroll = 2 if vec <= 4 else 1
    while unroll > 1 and _ceil(vectors, params.block * unroll) < 4 * sms:
        unroll //= 2
    params.unroll = unroll
    params.reason = f"1-D: {len(group_extents)} collapsed axes, {numel} elements"
    _overrides(params, sms)
