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

#if defined(__AVX512F__)
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

}  // namespace transformer_core::kernels::simd
