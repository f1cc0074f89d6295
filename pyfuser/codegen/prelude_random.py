"""The random-number part of the kernel prelude: Philox4x32-10 and the uniform numbers drawn from
it, in C++ (added to the prelude of kernels that draw random numbers only, `needs_random`).

`pf_philox_uniform(seed, offset, k, index, digits)` is ir/philox.py's `uniform` bit for bit:
counter (offset / 4 + k, index / 4) as (low, high) 32-bit word pairs, key the seed's two words,
10 rounds, word index % 4, then (word >> (32 - digits)) / 2^digits (exact in float; see
ir/philox.py for the stream and why). The 32 x 32-bit products are 64-bit multiplications.
`pf_philox_uniform_q(seed, offset, k, quad, word, digits)` is the same number at index
4 * quad + word: a vector's lanes that share a quad (written as one expression) make calls the
compiler merges into one Philox block for four numbers.
"""
from __future__ import annotations

PHILOX_CPP = r"""
// ---- random numbers: Philox4x32-10 (ir/philox.py computes the same stream) ---------------------
PF_D void pf_philox_round(uint32_t* c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = (uint64_t)0xD2511F53u * (uint64_t)c[0];
  const uint64_t p1 = (uint64_t)0xCD9E8D57u * (uint64_t)c[2];
  const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0;
  const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
  c[1] = (uint32_t)p1;
  c[3] = (uint32_t)p0;
  c[0] = n0;
  c[2] = n2;
}
PF_D float pf_philox_uniform_q(int64_t seed, int64_t offset, int k, int64_t quad, int word,
                              int digits) {
  const uint64_t s = (uint64_t)seed;
  const uint64_t ctr = ((uint64_t)offset >> 2) + (uint64_t)k;
  const uint64_t sub = (uint64_t)quad;
  uint32_t c[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), (uint32_t)sub, (uint32_t)(sub >> 32)};
  uint32_t k0 = (uint32_t)s, k1 = (uint32_t)(s >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    pf_philox_round(c, k0, k1);
  }
  const uint32_t lane = (uint32_t)word & 3u;
  const uint32_t w = lane == 0u ? c[0] : (lane == 1u ? c[1] : (lane == 2u ? c[2] : c[3]));
  return (float)(w >> (32 - digits)) / (float)(1u << digits);
}
PF_D float pf_philox_uniform(int64_t seed, int64_t offset, int k, int64_t index, int digits) {
  return pf_philox_uniform_q(seed, offset, k, (int64_t)((uint64_t)index >> 2), (int)(index & 3),
                             digits);
}
"""


def needs_random(kernel) -> bool:
    """Whether a kernel IR Kernel draws random numbers (it takes a launch seed)."""
    return any(p.source[0] == "philox" for p in kernel.params)
