"""A reference Philox4x32-10 in plain Python integers (no torch): what pyfuser's torch-op version
(pyfuser/ir/philox.py), its CUDA version (codegen/prelude_random.py) and hence the CPU
interpreter and the GPU kernels are checked against. It is checked itself against Random123's
published known-answer vectors (KATS)."""
from __future__ import annotations

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF

# (counter, key, output) from the Random123 distribution's kat_vectors, philox4x32 10 rounds
KATS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


def bits(seed: int, offset: int, k: int, index: int) -> int:
    """Element `index` of random op `k` of a launch with this seed and offset (pyfuser's stream:
    counter (offset // 4 + k, index // 4), key seed, word index % 4)."""
    seed &= (1 << 64) - 1
    ctr = (offset // 4 + k) & ((1 << 64) - 1)
    sub = index // 4
    words = philox4x32_10((ctr & MASK, ctr >> 32, sub & MASK, sub >> 32),
                          (seed & MASK, seed >> 32))
    return words[index % 4]


def uniform(seed: int, offset: int, k: int, index: int, digits: int) -> float:
    return (bits(seed, offset, k, index) >> (32 - digits)) / float(1 << digits)
