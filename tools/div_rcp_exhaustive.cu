// Exhaustive check of `pf_div_rcp` (pyfuser/codegen/prelude.py, ir/ops.py KERNEL_OPS) against
// the IEEE division, on a GPU: for every float32 mantissa pair a in [1/2, 1), d in [1, 2)
// (2^46 pairs) the corrected product from the row values y = 1/d, ys = y 2^-64, ds = d 2^64
// must have the bits of a / d. Other exponents scale every step exactly while the quotient is a
// normal float (the remainder is scaled by 2^64 so that it cannot underflow), so this covers
// every normal quotient. Prints the count of mismatches (and one example) as it goes.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/div_rcp_exhaustive tools/div_rcp_exhaustive.cu && /tmp/div_rcp_exhaustive
//
// H200, 2026-11-29: 2^46 pairs in 54 s, 0 mismatches.
#include <chrono>
#include <cstdio>

__device__ unsigned long long g_bad = 0;
__device__ unsigned g_example[2];

__global__ void check(unsigned a_first, unsigned a_count) {
  const unsigned dm = blockIdx.x * blockDim.x + threadIdx.x;      // d's mantissa bits
  const float d = __uint_as_float((127u << 23) | dm);              // d in [1, 2)
  const float y = 1.0f / d, ys = y * 0x1p-64f, ds = d * 0x1p64f;   // the row's values
  unsigned long long bad = 0;
  for (unsigned i = 0; i < a_count; ++i) {
    const unsigned am = a_first + i;
    const float a = __uint_as_float((126u << 23) | am);            // a in [1/2, 1)
    const float q = a * y;
    const float got = fmaf(fmaf(-q, ds, a * 0x1p64f), ys, q);      // pf_div_rcp
    if (__float_as_uint(got) != __float_as_uint(a / d)) {
      ++bad;
      g_example[0] = am;
      g_example[1] = dm;
    }
  }
  if (bad) atomicAdd(&g_bad, bad);
}

int main() {
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned chunk = 1u << 15, n = 1u << 23;
  unsigned long long bad = 0;
  for (unsigned a0 = 0; a0 < n; a0 += chunk) {
    check<<<n / 256, 256>>>(a0, chunk);
    if (cudaError_t e = cudaDeviceSynchronize()) {
      printf("CUDA error %s\n", cudaGetErrorString(e));
      return 1;
    }
    cudaMemcpyFromSymbol(&bad, g_bad, sizeof bad);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if ((a0 / chunk) % 32 == 31 || bad) {
      unsigned ex[2];
      cudaMemcpyFromSymbol(ex, g_example, sizeof ex);
      printf("a mantissas done %u / %u, %.1f s, mismatches %llu (last: a %u, d %u)\n",
             a0 + chunk, n, s, bad, ex[0], ex[1]);
      fflush(stdout);
    }
  }
  printf("pairs %llu, mismatches %llu\n", (unsigned long long)n * n, bad);
  return bad != 0;
}
