// Fused multiply-adds on xsimd registers, one rounding each on every ISA that has the instruction.
//
// xsimd 8 (Debian's libxsimd-dev) has no AVX-512 kernel for fma / fnma: its generic one computes
// x * y + z, which GCC used to fuse, but the core is built without FMA contraction
// (CMakeLists.txt: contraction could differ between two inlined copies of a loop), so there it
// would be a multiply and an add, two roundings and twice the instructions. These call the
// AVX-512 instruction themselves and leave every other ISA to xsimd (AVX2 + FMA: its fma3 kernel).
#pragma once

#include <xsimd/xsimd.hpp>

#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace transformer_core::kernels::simd {

// x · y + z
template <class T, class A>
inline xsimd::batch<T, A> fma(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y, const xsimd::batch<T, A>& z) {
#if defined(__AVX512F__)
  if constexpr (sizeof(xsimd::batch<T, A>) == 64 && std::is_same_v<T, float>) return _mm512_fmadd_ps(x, y, z);
  if constexpr (sizeof(xsimd::batch<T, A>) == 64 && std::is_same_v<T, double>) return _mm512_fmadd_pd(x, y, z);
#endif
  return xsimd::fma(x, y, z);
}

// z − x · y  (the same single rounding as fma: −x · y is exact)
template <class T, class A>
inline xsimd::batch<T, A> fnma(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y, const xsimd::batch<T, A>& z) {
  return simd::fma(-x, y, z);
}

// max over the lanes of x, in registers: halves folded by shuffles (log₂ lanes steps), where a
// store and a loop over the lanes went through memory, a store-to-load forward each step (about 3 %
// of SDPA (8, 12, 512, 64) on Emerald Rapids). With a NaN in x the result is NaN or the max of the
// other lanes, depending on its lane (maxps returns its second operand when either is NaN).
template <class A>
inline float reduce_max(const xsimd::batch<float, A>& x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(xsimd::batch<float, A>) == 64) return _mm512_reduce_max_ps(x);
#endif
#if defined(__AVX__)
  if constexpr (sizeof(xsimd::batch<float, A>) == 32) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
#endif
  alignas(64) float lanes[xsimd::batch<float, A>::size];
  x.store_aligned(lanes);
  float m = lanes[0];
  for (float v : lanes) m = v > m ? v : m;
  return m;
}

// Keeps x in a register: a loop that uses one loaded vector in several FMAs then reads it once.
// Left alone, GCC 12 folds such a load into each FMA as a memory operand instead, so the vector is
// read once per FMA: the few-row linear kernel (linear_small.hpp) then made 24 loads per 21 FMAs
// rather than 10, and each load that crosses a cache line costs Zen 4 about twice (numpy's arrays
// are 16-byte aligned): 59 cycles per step there in place of 28. An empty asm with the vector as
// its in-out register operand is a barrier GCC cannot fold a load through; no instruction results.
template <class T, class A>
inline void keep_in_register(xsimd::batch<T, A>& x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(x.data));
#else
  (void)x;
#endif
}

}  // namespace transformer_core::kernels::simd
