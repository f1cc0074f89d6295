"""Philox4x32-10 in torch ops: the random numbers of fused kernels, for the CPU interpreter and the
reference evaluator (the CUDA prelude has the same function, codegen/prelude_random.py).

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps a
128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1) to four 32-bit words in 10 rounds; a
round multiplies c0 and c2 by two constants (64-bit products split in high and low words) and
mixes in the key, which is bumped by two other constants between rounds.

pyfuser's stream: element `i` of a random op's output (its row-major linear index), op `k` of a
launch whose generator state is (seed, offset), takes word `i % 4` of
    philox(counter = (offset // 4 + k, i // 4), key = seed)
with each 64-bit value split into (low, high) 32-bit words: the subsequence i // 4 and the
offset counter in the layout torch's own Philox-based CUDA kernels use (curand_init(seed,
subsequence, offset)). A launch reserves 4 * (its random ops) of the generator's offset, so
launches (and torch's own random kernels, which reserve theirs) never share a counter.

`uniform(seed, offset, k, index, digits)` turns the word into a number in [0, 1) with `digits`
bits (24 for float32, 11 for half, 8 for bfloat16): (word >> (32 - digits)) * 2^-digits, exact
in the output dtype, so a rounding to that dtype never gives 1.

Values are carried in int64 tensors holding 32-bit words; no product overflows 64 bits (the
32 x 32-bit multiplications are done in 16-bit halves), so the bits do not depend on how a
platform wraps signed overflow.
"""
from __future__ import annotations

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF
ROUNDS = 10
DIGITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}   # dtypes kernels draw


def _mulhilo(m: int, x: torch.Tensor):
    """(high, low) 32-bit words of m * x (m a 32-bit constant, x int64 holding 32-bit words)."""
    p1 = (x & 0xFFFF) * m                      # < 2^48
    p2 = (x >> 16) * m                         # < 2^48
    mid = p1 + ((p2 & 0xFFFF) << 16)           # < 2^49
    return (p2 >> 16) + (mid >> 32), mid & MASK


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = ROUNDS):
    """The four output words (int64 tensors) for counters c* and keys k* (tensors or ints)."""
    c = [torch.as_tensor(v, dtype=torch.int64) & MASK for v in (c0, c1, c2, c3)]
    k0 = torch.as_tensor(k0, dtype=torch.int64) & MASK
    k1 = torch.as_tensor(k1, dtype=torch.int64) & MASK
    for r in range(rounds):
        if r:
            k0 = (k0 + W0) & MASK
            k1 = (k1 + W1) & MASK
        hi0, lo0 = _mulhilo(M0, c[0])
        hi1, lo1 = _mulhilo(M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return c


def _split64(v):
    """(low, high) 32-bit words of a 64-bit value (an int64 tensor or int; negative ints are
    their two's complement)."""
    v = torch.as_tensor(v, dtype=torch.int64)
    return v & MASK, (v >> 32) & MASK


def random_bits(seed, offset, k, index: torch.Tensor) -> torch.Tensor:
    """The 32-bit word (in an int64 tensor) of element `index` of random op `k`."""
    index = torch.as_tensor(index, dtype=torch.int64)
    seed = torch.as_tensor(seed, dtype=torch.int64)
    ctr = (torch.as_tensor(offset, dtype=torch.int64) >> 2) + torch.as_tensor(k, dtype=torch.int64)
    k0, k1 = _split64(seed)
    c0, c1 = _split64(ctr)
    c2, c3 = _split64(index >> 2)
    words = philox4x32(c0, c1, c2, c3, k0, k1)
    lane = index & 3
    out = torch.where(lane == 0, words[0], words[1])
    out = torch.where(lane == 2, words[2], out)
    return torch.where(lane == 3, words[3], out)


def uniform(seed, offset, k, index, digits) -> torch.Tensor:
    """Numbers in [0, 1) with `digits` bits (float32; exact in a dtype of that many digits)."""
    digits = int(digits)
    bits = random_bits(seed, offset, k, index) >> (32 - digits)
    return bits.to(torch.float32) * (2.0 ** -digits)
