"""The kernel prelude: C++ every generated kernel starts with.

It needs no header (NVRTC compiles it alone): fixed-width integer typedefs, half and bfloat16
storage types converted with PTX `cvt` (round to nearest even, as PyTorch), vector load/store
helpers, eager-exact dtype conversions (`pf_cast`), and every `pf_*` function the op table's
`cuda` column names, overloaded for bool, the integer types, float and double.

Invariants:
- float add/sub/mul between ops use `__fadd_rn`-style intrinsics, so the compiler never fuses two
  Fusion ops into one FMA (eager rounds after every op); inside one op's formula (gelu...) it may,
  as it does when PyTorch's own kernels are compiled.
- Signed integer add/sub/mul/neg/abs go through the unsigned type: they wrap like eager, no UB.
- No fast-math: exp/erf/tanh... are the precise CUDA functions (overloads of expf/erff/tanhf).
"""


def _cache_policy_cpp() -> str:
    """C++ of `pf_ldc<P, N>` / `pf_stc<P, N>`: N-element loads and stores of 4, 8 or 16 bytes
    with a cache policy P (other sizes fall back to pf_ld / pf_st). PF_CS: `.cs` streaming
    (evict-first in L1 and L2); PF_EF: L2 evict_first (loads skip L1); PF_EL: L2 evict_last;
    PF_CG: `.cg`, cached in L2 only (data other blocks of the launch wrote)."""
    out = ["enum { PF_CS = 1, PF_EF = 2, PF_EL = 3, PF_CG = 4 };",
           "PF_D unsigned long long pf_l2_policy(int p) { unsigned long long q;",
           "  if (p == PF_EF) asm(\"createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\" : \"=l\"(q));",
           "  else asm(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(q));",
           "  return q; }",
           "template <int P, int BYTES> struct pf_mem;"]
    quals = {"PF_CS": ("ld.global.cs", "st.global.cs", False),
             "PF_EF": ("ld.global.L1::no_allocate.L2::cache_hint", "st.global.L2::cache_hint", True),
             "PF_EL": ("ld.global.L2::cache_hint", "st.global.L2::cache_hint", True),
             "PF_CG": ("ld.global.cg", "st.global.cg", False)}
    for pol, (ld, st, hint) in quals.items():
        for nbytes, words in ((16, 4), (8, 2), (4, 1)):
            vec = {4: ".v4", 2: ".v2", 1: ""}[words]
            regs = ", ".join(f"%{i}" for i in range(words))
            regs = "{" + regs + "}" if words > 1 else regs
            outs = ", ".join(f'"=r"(w[{i}])' for i in range(words))
            ins = ", ".join(f'"r"(w[{i}])' for i in range(words))
            pol_arg = f", %{words + 1}" if hint else ""
            pol_in = f', "l"(pf_l2_policy({pol}))' if hint else ""
            sregs = "{" + ", ".join(f"%{i + 1}" for i in range(words)) + "}" if words > 1 else "%1"
            out.append(
                f"template <> struct pf_mem<{pol}, {nbytes}> {{\n"
                f"  static PF_D void ld(const void* p, unsigned int* w) {{ asm volatile("
                f"\"{ld}{vec}.u32 {regs}, [%{words}]{pol_arg};\" : {outs} : \"l\"(p){pol_in}); }}\n"
                f"  static PF_D void st(void* p, const unsigned int* w) {{ asm volatile("
                f"\"{st}{vec}.u32 [%0], {sregs}{pol_arg};\" :: \"l\"(p), {ins}{pol_in} : \"memory\"); }} }};")
    out.append("""template <typename T, int N> union pf_words {
  pf_vec<T, N> v; unsigned int w[(sizeof(T) * N + 3) / 4]; };
template <typename T, int N> constexpr bool pf_word_sized() {
  return sizeof(T) * N == 4 || sizeof(T) * N == 8 || sizeof(T) * N == 16; }
// one element loaded with ld.global.cg (L2 only), whatever its size
template <typename T> PF_D T pf_ldcg(const T* p) {
  union { T t; unsigned long long u8; unsigned int u4; unsigned short u2; } v;
  if constexpr (sizeof(T) == 8) {
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v.u8) : "l"(p));
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v.u4) : "l"(p));
  } else if constexpr (sizeof(T) == 2) {
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v.u2) : "l"(p));
  } else {
    unsigned short b; asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(b) : "l"(p));
    v.u2 = b;
  }
  return v.t;
}
// L2 cache hints (createpolicy, .L2::cache_hint) need sm_80: before it, those accesses are plain
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PF_L2_HINTS 0
#else
#define PF_L2_HINTS 1
#endif
template <int P> constexpr bool pf_policy_ok() { return PF_L2_HINTS || (P != PF_EF && P != PF_EL); }
template <int P, int N, typename T> PF_D void pf_ldc(T* dst, const T* __restrict__ src) {
  if constexpr (!pf_policy_ok<P>()) {
    pf_ld<N>(dst, src);
  } else if constexpr (pf_word_sized<T, N>()) {
    pf_words<T, N> u;
    pf_mem<P, sizeof(T) * N>::ld(src, u.w);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = u.v.v[i];
  } else if constexpr (P == PF_CG) {     // never a plain (L1-cached) load
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = pf_ldcg(src + i);
  } else {
    pf_ld<N>(dst, src);
  }
}
template <int P, int N, typename T> PF_D void pf_stc(T* __restrict__ dst, const T* src) {
  if constexpr (pf_word_sized<T, N>() && pf_policy_ok<P>()) {
    pf_words<T, N> u;
#pragma unroll
    for (int i = 0; i < N; ++i) u.v.v[i] = src[i];
    pf_mem<P, sizeof(T) * N>::st(dst, u.w);
  } else {
    pf_st<N>(dst, src);
  }
}""")
    return "\n".join(out)


PRELUDE = r"""
// ---- pyfuser kernel prelude -------------------------------------------------------------------
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define PF_D __device__ __forceinline__

struct __align__(2) pf_half { unsigned short x; };
struct __align__(2) pf_bf16 { unsigned short x; };

PF_D float pf_to_reg(pf_half h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x)); return f; }
PF_D float pf_to_reg(pf_bf16 h) { return __uint_as_float(((unsigned int)h.x) << 16); }
template <typename T> PF_D T pf_to_reg(T x) { return x; }
template <typename S> PF_D S pf_to_storage(float f);
template <> PF_D pf_half pf_to_storage<pf_half>(float f) {
  pf_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h; }
template <> PF_D pf_bf16 pf_to_storage<pf_bf16>(float f) {
  pf_bf16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h; }
PF_D float pf_round_half(float f) { return pf_to_reg(pf_to_storage<pf_half>(f)); }
// thread-block clusters (sm_90): this block's rank, the cluster barrier (whole, or its arrive and
// wait halves), a load from the shared memory of the block of rank `rank` (4- and 8-byte elements)
#if __CUDA_ARCH__ >= 900
PF_D unsigned pf_cluster_rank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
PF_D void pf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }
PF_D void pf_cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
PF_D void pf_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// the 32-bit shared-memory address of a shared variable
PF_D unsigned pf_smem_addr(const void* p) {
  unsigned a; asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a; }
template <typename T> PF_D T pf_dsmem_load(const T* p, unsigned rank) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "distributed shared memory loads of 4 or 8 bytes");
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(pf_smem_addr(p)), "r"(rank));
  union { T t; unsigned u4; unsigned long long u8; } v;
  if constexpr (sizeof(T) == 8) {
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v.u8) : "r"(remote) : "memory");
  } else {
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v.u4) : "r"(remote) : "memory");
  }
  return v.t;
}
// mbarriers (sm_90): a block's barrier counting arrivals and the bytes other blocks of its cluster
// push into its shared memory (st.async ... complete_tx); a thread waits for a phase by parity
PF_D void pf_mbar_init(int64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(pf_smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
PF_D void pf_mbar_expect(int64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(pf_smem_addr(bar)), "r"(bytes) : "memory"); }
// (the wait acquires at cluster scope: the pushes it counts are other blocks' releases)
PF_D void pf_mbar_wait(int64_t* bar, unsigned parity) {
  const unsigned a = pf_smem_addr(bar);
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done); }
template <typename T> PF_D void pf_push(T* dst, T value, unsigned rank, int64_t* bar) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pushes of 4 or 8 bytes");
  unsigned d, b;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(pf_smem_addr(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(pf_smem_addr(bar)), "r"(rank));
  union { T t; unsigned u4; unsigned long long u8; } v;
  v.t = value;
  if constexpr (sizeof(T) == 8) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 :: "r"(d), "l"(v.u8), "r"(b) : "memory");
  } else {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 :: "r"(d), "r"(v.u4), "r"(b) : "memory");
  }
}
#endif
// one of the two 2-byte elements of a 32-bit word (packed register arrays), as a float
PF_D float pf_unpack_bf16(uint32_t w, int hi) { return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16)); }
PF_D float pf_unpack_half(uint32_t w, int hi) {
  pf_half h; h.x = (unsigned short)(hi ? (w >> 16) : (w & 0xffffu)); return pf_to_reg(h); }
PF_D float pf_round_bf16(float f) { return pf_to_reg(pf_to_storage<pf_bf16>(f)); }
// a gathered load's index, which must lie in [0, n): else the kernel stops (eager's assert)
template <typename T> PF_D T pf_checked_index(T v, long long n, const char* what) {
  if (v < 0 || (long long)v >= n) { printf("%s: %lld\n", what, (long long)v); __trap(); }
  return v; }

// ---- vector memory access (16 bytes at most per access) ---------------------------------------
template <typename T, int N> struct __align__(sizeof(T) * N) pf_vec { T v[N]; };
template <int N, typename T> PF_D void pf_ld(T* dst, const T* __restrict__ src) {
  const pf_vec<T, N> x = *reinterpret_cast<const pf_vec<T, N>*>(src);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = x.v[i];
}
template <int N, typename T> PF_D void pf_st(T* __restrict__ dst, const T* src) {
  pf_vec<T, N> x;
#pragma unroll
  for (int i = 0; i < N; ++i) x.v[i] = src[i];
  *reinterpret_cast<pf_vec<T, N>*>(dst) = x;
}
// global -> shared copies of 4, 8 or 16 bytes the thread does not wait for (sm_80+: cp.async,
// 16 bytes cached in L2 only; older GPUs: a plain copy); it reads what they wrote only after
// pf_cp_async_wait(), other threads only after a barrier as well
template <int BYTES> PF_D void pf_cp_async(void* dst, const void* src) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "async copies of 4, 8 or 16 bytes");
#if __CUDA_ARCH__ >= 800
  unsigned d;
  asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(d) : "l"(dst));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(d), "l"(src), "n"(BYTES) : "memory");
  }
#else
  *reinterpret_cast<pf_vec<uint32_t, BYTES / 4>*>(dst) = *reinterpret_cast<const pf_vec<uint32_t, BYTES / 4>*>(src);
#endif
}
PF_D void pf_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// cache-policy accesses (speed only: the same bytes as pf_ld / pf_st), generated below
""" + _cache_policy_cpp() + r"""
// ---- conversions as eager does them -----------------------------------------------------------
template <typename To, typename From> struct pf_caster { static PF_D To run(From x) { return static_cast<To>(x); } };
template <typename From> struct pf_caster<bool, From> { static PF_D bool run(From x) { return x != From(0); } };
template <> struct pf_caster<bool, bool> { static PF_D bool run(bool x) { return x; } };
// float -> uint8 goes through int64 (c10's static_cast_with_inter_type)
template <> struct pf_caster<uint8_t, float> { static PF_D uint8_t run(float x) { return (uint8_t)(int64_t)x; } };
template <> struct pf_caster<uint8_t, double> { static PF_D uint8_t run(double x) { return (uint8_t)(int64_t)x; } };
template <typename To, typename From> PF_D To pf_cast(From x) { return pf_caster<To, From>::run(x); }

// ---- integer helpers ----------------------------------------------------------------------------
template <typename T> struct pf_unsigned { typedef T type; };
template <> struct pf_unsigned<int8_t> { typedef uint8_t type; };
template <> struct pf_unsigned<int16_t> { typedef uint16_t type; };
template <> struct pf_unsigned<int32_t> { typedef uint32_t type; };
template <> struct pf_unsigned<int64_t> { typedef uint64_t type; };
#define PF_U(T) typename pf_unsigned<T>::type

template <typename T> PF_D T pf_add(T a, T b) { return (T)((PF_U(T))a + (PF_U(T))b); }
template <typename T> PF_D T pf_sub(T a, T b) { return (T)((PF_U(T))a - (PF_U(T))b); }
template <typename T> PF_D T pf_mul(T a, T b) { return (T)((PF_U(T))a * (PF_U(T))b); }
template <typename T> PF_D T pf_neg(T a) { return (T)((PF_U(T))0 - (PF_U(T))a); }
PF_D bool pf_add(bool a, bool b) { return a || b; }
PF_D bool pf_mul(bool a, bool b) { return a && b; }
PF_D float pf_add(float a, float b) { return __fadd_rn(a, b); }
PF_D float pf_sub(float a, float b) { return __fsub_rn(a, b); }
PF_D float pf_mul(float a, float b) { return __fmul_rn(a, b); }
PF_D float pf_neg(float a) { return -a; }
PF_D double pf_add(double a, double b) { return __dadd_rn(a, b); }
PF_D double pf_sub(double a, double b) { return __dsub_rn(a, b); }
PF_D double pf_mul(double a, double b) { return __dmul_rn(a, b); }
PF_D double pf_neg(double a) { return -a; }
template <typename T> PF_D T pf_addcmul(T s, T a, T b, T v) { return pf_add(s, pf_mul(pf_mul(v, a), b)); }
PF_D float pf_addcmul(float s, float a, float b, float v) { return s + v * a * b; }
PF_D double pf_addcmul(double s, double a, double b, double v) { return s + v * a * b; }

template <typename T> PF_D T pf_abs(T a) { return a < 0 ? pf_neg(a) : a; }
PF_D bool pf_abs(bool a) { return a; }
PF_D uint8_t pf_abs(uint8_t a) { return a; }
PF_D float pf_abs(float a) { return fabsf(a); }
PF_D double pf_abs(double a) { return fabs(a); }
template <typename T> PF_D T pf_bitwise_not(T a) { return (T)(~a); }
PF_D bool pf_bitwise_not(bool a) { return !a; }

template <typename T> PF_D bool pf_isnan(T a) { return a != a; }
template <typename T> PF_D bool pf_isinf(T a) { return false; }
PF_D bool pf_isinf(float a) { return fabsf(a) == __int_as_float(0x7f800000); }
PF_D bool pf_isinf(double a) { return fabs(a) == __longlong_as_double(0x7ff0000000000000LL); }
template <typename T> PF_D bool pf_isfinite(T a) { return !pf_isnan(a) && !pf_isinf(a); }

template <typename T> PF_D T pf_relu(T a) { return a > T(0) ? a : T(0); }
PF_D float pf_relu(float a) { return a != a ? a : (a > 0.0f ? a : 0.0f); }
PF_D double pf_relu(double a) { return a != a ? a : (a > 0.0 ? a : 0.0); }
template <typename T> PF_D T pf_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
PF_D bool pf_sign(bool a) { return a; }
PF_D uint8_t pf_sign(uint8_t a) { return a > 0; }

template <typename T> PF_D T pf_maximum(T a, T b) { return a > b ? a : b; }
template <typename T> PF_D T pf_minimum(T a, T b) { return a < b ? a : b; }
// float: NaN wins, as in eager; sm_80+ has it in one instruction (a canonical NaN; otherwise the
// value of fmaxf / fminf, the same instruction without .NaN)
#if __CUDA_ARCH__ >= 800
PF_D float pf_maximum(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
PF_D float pf_minimum(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
#else
PF_D float pf_maximum(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }
PF_D float pf_minimum(float a, float b) { return a != a ? a : (b != b ? b : fminf(a, b)); }
#endif
PF_D double pf_maximum(double a, double b) { return a != a ? a : (b != b ? b : fmax(a, b)); }
PF_D double pf_minimum(double a, double b) { return a != a ? a : (b != b ? b : fmin(a, b)); }
// the two 2-byte floats of 32-bit words (packed register arrays) at once, NaN winning: one
// instruction from sm_80; before, the float ops on the unpacked halves (exact: the result is
// one of the inputs, so packing it back loses nothing)
#if __CUDA_ARCH__ >= 800
PF_D uint32_t pf_maximum_x2_bf16(uint32_t a, uint32_t b) { uint32_t r; asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
PF_D uint32_t pf_minimum_x2_bf16(uint32_t a, uint32_t b) { uint32_t r; asm("min.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
PF_D uint32_t pf_maximum_x2_half(uint32_t a, uint32_t b) { uint32_t r; asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
PF_D uint32_t pf_minimum_x2_half(uint32_t a, uint32_t b) { uint32_t r; asm("min.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
#else
PF_D uint32_t pf_pack_bf16(float lo, float hi) { return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u); }
PF_D uint32_t pf_pack_half(float lo, float hi) {
  return (uint32_t)pf_to_storage<pf_half>(lo).x | ((uint32_t)pf_to_storage<pf_half>(hi).x << 16); }
#define PF_X2(OP, K) PF_D uint32_t pf_##OP##_x2_##K(uint32_t a, uint32_t b) { \
  return pf_pack_##K(pf_##OP(pf_unpack_##K(a, 0), pf_unpack_##K(b, 0)), pf_##OP(pf_unpack_##K(a, 1), pf_unpack_##K(b, 1))); }
PF_X2(maximum, bf16) PF_X2(minimum, bf16) PF_X2(maximum, half) PF_X2(minimum, half)
#undef PF_X2
#endif
template <typename T> PF_D T pf_clamp_min(T a, T lo) { return pf_maximum(a, lo); }
template <typename T> PF_D T pf_clamp_max(T a, T hi) { return pf_minimum(a, hi); }
template <typename T> PF_D T pf_clamp(T a, T lo, T hi) {
  if (pf_isnan(a)) return a;
  return pf_minimum(pf_maximum(a, lo), hi);
}

// ---- division family ----------------------------------------------------------------------------
template <typename T> PF_D T pf_div_trunc(T a, T b) { return a / b; }
PF_D float pf_div_trunc(float a, float b) { return truncf(a / b); }
PF_D double pf_div_trunc(double a, double b) { return trunc(a / b); }
template <typename T> PF_D T pf_div_floor(T a, T b) {
  if ((a < 0) != (b < 0)) { T q = a / b; T r = a % b; return r ? q - 1 : q; }
  return a / b;
}
template <typename T> PF_D T pf_div_floor_fp(T a, T b) {
  if (b == T(0)) return a / b;
  T mod = fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
  T fl;
  if (div != T(0)) { fl = floor(div); if (div - fl > T(0.5)) fl += T(1); }
  else { fl = copysign(T(0), a / b); }
  return fl;
}
PF_D float pf_div_floor(float a, float b) { return pf_div_floor_fp(a, b); }
PF_D double pf_div_floor(double a, double b) { return pf_div_floor_fp(a, b); }
template <typename T> PF_D T pf_remainder(T a, T b) {
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> PF_D T pf_remainder_fp(T a, T b) {
  T m = fmod(a, b);
  if (m != T(0) && ((b < T(0)) != (m < T(0)))) m += b;
  return m;
}
PF_D float pf_remainder(float a, float b) { return pf_remainder_fp(a, b); }
PF_D double pf_remainder(double a, double b) { return pf_remainder_fp(a, b); }
template <typename T> PF_D T pf_fmod(T a, T b) { return a % b; }
PF_D float pf_fmod(float a, float b) { return fmodf(a, b); }
PF_D double pf_fmod(double a, double b) { return fmod(a, b); }

template <typename T> PF_D T pf_pow(T a, T b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == T(-1)) return (b & 1) ? T(-1) : T(1);
    return 0;
  }
  T r = 1;
  while (b) { if (b & 1) r = pf_mul(r, a); b >>= 1; a = pf_mul(a, a); }
  return r;
}
PF_D uint8_t pf_pow(uint8_t a, uint8_t b) {
  uint8_t r = 1; while (b) { if (b & 1) r = pf_mul(r, a); b >>= 1; a = pf_mul(a, a); } return r; }
PF_D float pf_pow(float a, float b) { return powf(a, b); }
PF_D double pf_pow(double a, double b) { return pow(a, b); }

template <typename T> PF_D T pf_shl(T a, T b) {
  const int bits = sizeof(T) * 8;
  typedef PF_U(T) U;
  if ((int64_t)b < 0 || (int64_t)b >= bits) return 0;
  return (T)((U)a << b);
}
template <typename T> PF_D T pf_shr(T a, T b) {
  const int bits = sizeof(T) * 8 - (T(-1) < T(0) ? 1 : 0);
  if ((int64_t)b < 0 || (int64_t)b >= bits) return (T)(a >> bits);
  return (T)(a >> b);
}
PF_D uint8_t pf_shl(uint8_t a, uint8_t b) { return ((int8_t)b < 0 || b >= 8) ? 0 : (uint8_t)(a << b); }
PF_D uint8_t pf_shr(uint8_t a, uint8_t b) { return ((int8_t)b < 0 || b >= 8) ? 0 : (uint8_t)(a >> b); }

// ---- floating point activations -----------------------------------------------------------------
template <typename T> PF_D T pf_sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
template <typename T> PF_D T pf_reciprocal(T x) { return T(1) / x; }
// exp of a value shifted below a running max (ir/ops.py KERNEL_OPS): float on the exp2 unit
PF_D float pf_exp_shifted(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f)); return y; }
template <typename T> PF_D T pf_exp_shifted(T x) { return exp(x); }
// a * b + c rounded once (ir/ops.py KERNEL_OPS: a reduction's own sums of squares)
PF_D float pf_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
PF_D double pf_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
// a / d from the row's y = 1 / d, ys = y 2^-64 and ds = d 2^64 (ir/ops.py KERNEL_OPS): q = a y
// corrected once by the remainder (a - q d) 2^64, exact where unscaled it could underflow
PF_D float pf_div_rcp(float a, float y, float ys, float ds) {
  const float q = a * y; return fmaf(fmaf(-q, ds, a * 0x1p64f), ys, q); }
template <typename T> PF_D T pf_div_rcp(T a, T y, T ys, T ds) { return a / (ds * T(0x1p-64)); }
template <typename T> PF_D T pf_gelu(T x) {
  const T alpha = T(0.70710678118654752440);
  return x * T(0.5) * (T(1) + erf(x * alpha));
}
template <typename T> PF_D T pf_gelu_tanh(T x) {
  const T beta = T(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
  const T kappa = T(0.044715);
  const T cube = x * x * x;
  return T(0.5) * x * (T(1) + tanh(beta * (x + kappa * cube)));
}
template <typename T> PF_D T pf_silu(T x) { return x / (T(1) + exp(-x)); }
template <typename T> PF_D T pf_mish(T x) { return x * tanh(log1p(exp(x))); }
// As PyTorch's CUDA kernels: multiply by one_sixth = opmath_t(1.0f / 6.0f), a float constant
// even for double (so the double result is x * y * 0.1666666716337204, not x * y / 6).
template <typename T> PF_D T pf_hardsigmoid(T x) {
  const T one_sixth = T(1.0f / 6.0f);
  T y = x + T(3); y = y < T(0) ? T(0) : y; y = y > T(6) ? T(6) : y; return y * one_sixth; }
template <typename T> PF_D T pf_hardswish(T x) {
  const T one_sixth = T(1.0f / 6.0f);
  T y = x + T(3); y = y < T(0) ? T(0) : y; y = y > T(6) ? T(6) : y; return x * y * one_sixth; }
template <typename T> PF_D T pf_leaky_relu(T x, T s) { return x > T(0) ? x : x * s; }
template <typename T> PF_D T pf_softplus(T x, T beta, T threshold) {
  return (x * beta) > threshold ? x : log1p(exp(x * beta)) / beta; }
template <typename T> PF_D T pf_lerp(T a, T b, T w) {
  return (fabs(w) < T(0.5)) ? a + w * (b - a) : b - (b - a) * (T(1) - w); }
// ------------------------------------------------------------------------------------------------
"""
