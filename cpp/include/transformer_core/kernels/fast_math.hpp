// Vectorisable elementary functions for the hot loops: plain arithmetic, selects and memcpy, so
// that GCC -O3 vectorises the loops that call them (std::exp / std::erf are calls it cannot).
// exp and erf also come for an xsimd register of floats, with the same polynomials and their FMAs
// written out, for kernels that hold their values in registers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <xsimd/xsimd.hpp>

#include "transformer_core/kernels/simd.hpp"

namespace transformer_core::kernels::fast_math {

// ---- exp(x) for x ≤ 0, vectorisable ------------------------------------------------------------
// exp(x) = 2ⁿ · exp(r),  n = round(x / ln 2),  r = x - n ln 2 ∈ [-ln2/2, ln2/2]  (Cody–Waite, ln 2
// split in a part exact in n·hi and a correction). exp(r) by a polynomial (Cephes: degree 5 for
// float, ≤ 1 ulp; Taylor to degree 13 for double, < 1e-16 relative). 2ⁿ is built in the exponent
// bits. Below the smallest normal result we return exactly 0, so exp(-inf) = 0; NaN stays NaN.
// Written with plain arithmetic, selects and memcpy so that GCC -O3 vectorises the loops that call it.
inline float exp_nonpos(float x) {
  const float lo = -87.0f;
  const bool under = x < lo;
  const float xc = under ? lo : x;
  const float shifter = 12582912.0f;                       // 1.5 · 2²³: adding it rounds to an integer
  const float kd = xc * 1.44269504088896341f + shifter;    // n + shifter (n in the low mantissa bits)
  const float n = kd - shifter;
  float r = xc - n * 0.693359375f;                         // ln 2, high part (exact in n · hi)
  r = r - n * -2.12194440e-4f;                             // ln 2, low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;                                // exp(r) = 1 + r + r² P(r)
  uint32_t kb;
  std::memcpy(&kb, &kd, sizeof kb);
  const uint32_t sb = (kb << 23) + (127u << 23);           // bits of 2ⁿ
  float s;
  std::memcpy(&s, &sb, sizeof s);
  const float y = p * s;
  return under ? 0.0f : y;
}

// The same for a SIMD register of floats (xsimd), for kernels that hold their values in registers
// (the short-sequence softmax, flash_attention.hpp): the steps above, lane by lane, each multiply-add
// one FMA.
inline xsimd::batch<float> exp_nonpos(const xsimd::batch<float>& x) {
  using B = xsimd::batch<float>;
  using I = xsimd::batch<int32_t>;
  const auto under = x < B(-87.0f);
  const B xc = xsimd::select(under, B(-87.0f), x);
  const B shifter(12582912.0f);
  const B kd = simd::fma(xc, B(1.44269504088896341f), shifter);
  const B n = kd - shifter;
  B r = simd::fnma(n, B(0.693359375f), xc);
  r = simd::fnma(n, B(-2.12194440e-4f), r);
  B p(1.9875691500e-4f);
  p = simd::fma(p, r, B(1.3981999507e-3f));
  p = simd::fma(p, r, B(8.3334519073e-3f));
  p = simd::fma(p, r, B(4.1665795894e-2f));
  p = simd::fma(p, r, B(1.6666665459e-1f));
  p = simd::fma(p, r, B(5.0000001201e-1f));
  p = simd::fma(p * r, r, r) + B(1.0f);
  const I sb = (xsimd::bitwise_cast<I>(kd) << 23) + I(127 << 23);
  return xsimd::select(under, B(0.0f), p * xsimd::bitwise_cast<B>(sb));
}

// exp(r) = Σ_{k ≤ 13} rᵏ / k!  for |r| ≤ 0.347 (the remainder is < 1e-17 relative)
inline double exp_taylor(double r) {
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  return p * r * r + r + 1.0;
}

// 2ⁿ, from kd = n + 1.5 · 2⁵² (n in the low mantissa bits) by building its exponent bits
inline double pow2_of(double kd) {
  uint64_t kb;
  std::memcpy(&kb, &kd, sizeof kb);
  const uint64_t sb = (kb << 52) + (uint64_t(1023) << 52);
  double s;
  std::memcpy(&s, &sb, sizeof s);
  return s;
}

inline double exp_nonpos(double x) {
  const double lo = -708.0;
  const bool under = x < lo;
  const double xc = under ? lo : x;
  const double shifter = 6755399441055744.0;               // 1.5 · 2⁵²
  const double kd = xc * 1.4426950408889634074 + shifter;
  const double n = kd - shifter;
  double r = xc - n * 6.93147180369123816490e-01;          // ln 2, high part
  r = r - n * 1.90821492927058770002e-10;                  // ln 2, low part
  const double y = exp_taylor(r) * pow2_of(kd);
  return under ? 0.0 : y;
}

// ---- 2^t for t ≤ 0, the online softmax's exponential (flash_attention.hpp) ----------------------
// 2^t = 2ⁿ · 2^f,  n = round(t),  f = t − n ∈ [−½, ½] (exact: Sterbenz). No ln 2 to split, and the
// softmax's scale folds into the product that makes t (t = x · scale · log₂e − m), so a score costs
// one FMA, the rounding and 6 FMAs of the polynomial. Below t = −125 the result is exactly 0 (so
// 2^−inf = 0, and no result is subnormal: 2^f ≥ 2^−½ keeps 2^−125 · 2^f normal); NaN stays NaN.
// float: 2^f = Σ_{k ≤ 6} c_k f^k, coefficients fitted here for relative error on [−½, ½] (iteratively
// reweighted least squares, rounded to float): at most 0.94 ulp on a grid of 2·10⁶ points, evaluated
// in float with FMAs (Cephes' exp above, degree 7 after its ln 2 split: ≤ 1 ulp).
// The register form is written for a short dependency chain, which is what bounds its speed (the
// out-of-order window holds only a few of these chains): n by a rounding instruction (vroundps /
// vrndscaleps) rather than the add-and-subtract of 1.5 · 2²³, and 2ⁿ applied by adding n to the
// exponent bits of 2^f (exact: 2^f · 2ⁿ is normal for n ≥ −125) rather than by a multiplication.
// The same bits as the add-and-subtract, multiply form it replaced; Zen 5: 6.8 cycles a register of
// 16 scores instead of 8.2 (exp2_row_sum, a row of 256 in L1).
// AVX-512 has one instruction for the last steps: vscalefps multiplies by 2ⁿ (exact, as the integer
// add: the result is normal), and its zero-masking writes the 0 below −125 where the mask
// "not t < −125" is false (true for a NaN, which stays NaN). Three fewer instructions than the
// convert, shift, add and blend: 6.5 -> 6.0 cycles a register on Zen 5; the same bits for every t
// in the domain (checked on all floats in [−130, 0]); t = +inf, outside it, gives +inf, not NaN.
inline xsimd::batch<float> exp2_nonpos(const xsimd::batch<float>& t) {
  using B = xsimd::batch<float>;
  using I = xsimd::batch<int32_t>;
  const B n = xsimd::nearbyint(t);  // round half to even, as the default rounding mode
  const B f = t - n;
  B p(1.5345812e-4f);
  p = simd::fma(p, f, B(1.3399931e-3f));
  p = simd::fma(p, f, B(9.618489e-3f));
  p = simd::fma(p, f, B(5.5503286e-2f));
  p = simd::fma(p, f, B(2.4022646e-1f));
  p = simd::fma(p, f, B(6.931472e-1f));
  p = simd::fma(p, f, B(1.0f));
#if defined(__AVX512F__)
  if constexpr (B::size == 16) {
    const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    return B(_mm512_maskz_scalef_ps(keep, p, n));
  }
#endif
  const I scaled = xsimd::bitwise_cast<I>(p) + (xsimd::to_int(n) << 23);  // 2^f · 2ⁿ
  return xsimd::select(t < B(-125.0f), B(0.0f), xsimd::bitwise_cast<B>(scaled));
}

// double: 2^f = exp(f ln 2) by exp_taylor (r = f ln 2 rounds once: < 1e-16
// relative); 0 below t = −1021.
inline double exp2_nonpos(double t) {
  const double shifter = 6755399441055744.0;  // 1.5 · 2⁵²
  const double kd = t + shifter;
  const double f = t - (kd - shifter);
  const double r = f * 0.69314718055994530942;
  const double y = exp_taylor(r) * pow2_of(kd);
  return t < -1021.0 ? 0.0 : y;
}

// erf(x) (Abramowitz & Stegun 1964, 7.1.26): for x >= 0
//   erf(x) = 1 - (a1 t + a2 t² + a3 t³ + a4 t⁴ + a5 t⁵) · exp(-x²),   t = 1 / (1 + p x)
// absolute error <= 1.5e-7, about one float ulp near 1; odd in x. For float only: double keeps
// std::erf (the fp64 paths are checked to 1e-10).
inline float erf_approx(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  poly = poly * t;
  const float y = 1.0f - poly * exp_nonpos(-ax * ax);
  return std::copysign(y, x);
}

// The same for a register of floats, each multiply-add one FMA (the GELU of the linear layers'
// epilogue, elementwise.hpp).
inline xsimd::batch<float> erf_approx(const xsimd::batch<float>& x) {
  using B = xsimd::batch<float>;
  const B ax = xsimd::abs(x);
  const B t = B(1.0f) / simd::fma(B(0.3275911f), ax, B(1.0f));
  B poly(1.061405429f);
  poly = simd::fma(poly, t, B(-1.453152027f));
  poly = simd::fma(poly, t, B(1.421413741f));
  poly = simd::fma(poly, t, B(-0.284496736f));
  poly = simd::fma(poly, t, B(0.254829592f));
  poly = poly * t;
  const B y = simd::fnma(poly, exp_nonpos(-(ax * ax)), B(1.0f));
  return xsimd::copysign(y, x);
}

// tanh(x) for float (Cephes' tanhf, Moshier 1992): for |x| < 0.625 an odd minimax polynomial,
//   tanh(x) = x + x³ P(x²);
// above, from e = exp(-2|x|) ∈ (0, 0.29]:  tanh|x| = (1 − e) / (1 + e), no cancellation there.
// Both are computed and one selected, so loops that call it vectorise. Relative error ≤ 2e-7
// (tests/test_activations: against fp64 on a dense grid); odd in x; ±1 beyond |x| ≈ 9; NaN stays NaN.
inline float tanh_approx(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * ax + ax;
  const float e = exp_nonpos(-2.0f * ax);
  const float large = (1.0f - e) / (1.0f + e);
  return std::copysign(ax < 0.625f ? small : large, x);
}

// The same for a register of floats (the whole-array activation loops, elementwise.hpp), each
// multiply-add one FMA.
inline xsimd::batch<float> tanh_approx(const xsimd::batch<float>& x) {
  using B = xsimd::batch<float>;
  const B ax = xsimd::abs(x);
  const B z = x * x;
  B p(-5.70498872745e-3f);
  p = simd::fma(p, z, B(2.06390887954e-2f));
  p = simd::fma(p, z, B(-5.37397155531e-2f));
  p = simd::fma(p, z, B(1.33314422036e-1f));
  p = simd::fma(p, z, B(-3.33332819422e-1f));
  const B small = simd::fma(p * z, ax, ax);
  const B e = exp_nonpos(B(-2.0f) * ax);
  const B large = (B(1.0f) - e) / (B(1.0f) + e);
  return xsimd::copysign(xsimd::select(ax < B(0.625f), small, large), x);
}

}  // namespace transformer_core::kernels::fast_math
