// Dropout (Srivastava et al. 2014) driven by a seed, with a counter-based random number generator:
//
//   keep_i = u_i >= p,   u_i = Philox4x32-10(counter = i / 4, key = seed)[i mod 4] · 2⁻³²  ∈ [0, 1)
//   y_i = keep_i ? x_i · scale : 0,      scale = 1 / (1 - p)      (torch's inverted dropout)
//   dx_i = keep_i ? dy_i · scale : 0     (the same mask: regenerated from (seed, i))
//
// Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3"):
// ten rounds of two 32×32→64-bit multiplies on a 128-bit counter under a 64-bit key bumped by the
// Weyl constants each round. The bits of element i depend only on (seed, i), not on the thread that
// computes them or on how the work is split: the forward and the backward regenerate the same mask,
// which is never stored. (The mask is NOT torch's: torch draws from its own generator.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace transformer_core::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).
inline Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (golden ratio, √3 - 1)
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c0, p1 = kM1 * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// The 32 random bits of element i under `seed`.
inline uint32_t dropout_bits(uint64_t seed, int64_t i) {
  const uint64_t block = static_cast<uint64_t>(i) >> 2;
  const Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), 0u, 0u, uint32_t(seed),
                                     uint32_t(seed >> 32));
  return r.v[i & 3];
}

// keep_i ⇔ bits_i >= threshold, threshold = ceil(p · 2³²) (so that P(keep) = 1 - p to 2⁻³²).
inline uint64_t dropout_threshold(double p) {
  const double t = std::ceil(p * 4294967296.0);
  return t <= 0 ? 0 : static_cast<uint64_t>(t);
}

// The words of kPhiloxRun consecutive blocks b0, b0 + 1, ... in element order (out[4·b + w] = word
// w of block b0 + b): the same bits as philox4x32_10 on each, computed kPhiloxRun blocks abreast in
// SIMD registers where the CPU has them (the 32×32 → 64-bit products of vpmuludq, even and odd
// lanes apart), so a dropout's mask does not depend on the ISA either. 4 to 5 times the scalar
// rate on AVX-512 (1.2 against 5.3 ns an element, one Emerald Rapids core). The ISA is the build's
// (-march=native): the per-ISA kernel files compiled with their own -march (CMakeLists.txt) must
// not include this header, whose kPhiloxRun would differ between translation units.
#if defined(__AVX512F__)
constexpr int kPhiloxRun = 16;
inline void philox_run(uint64_t b0, uint64_t seed, uint32_t* out) {
  const __m512i lo = _mm512_set1_epi32(int(uint32_t(b0))), hi = _mm512_set1_epi32(int(uint32_t(b0 >> 32)));
  __m512i c0 = _mm512_add_epi32(lo, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i c1 = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(c0, lo), hi, _mm512_set1_epi32(1));  // carry
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m512i e0 = _mm512_mul_epu32(c0, m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
    const __m512i e1 = _mm512_mul_epu32(c2, m1), o1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
    const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e0, 32), o0);
    const __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, e1, _mm512_slli_epi64(o1, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e1, 32), o1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(int(k0)));
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(int(k1)));
    c1 = lo1, c3 = lo0;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  // the 4 × 16 words to element order: blocks (0, 1), (2, 3) per 128-bit lane, then the lanes
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);  // blocks 4l, 4l + 1
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);  // blocks 4l + 2, 4l + 3
  const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
  const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
  _mm512_storeu_si512(out, _mm512_shuffle_i32x4(v0, v1, 0x88));
  _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
  _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
  _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
}
#elif defined(__AVX2__)
constexpr int kPhiloxRun = 8;
inline void philox_run(uint64_t b0, uint64_t seed, uint32_t* out) {
  const __m256i lo = _mm256_set1_epi32(int(uint32_t(b0))), hi = _mm256_set1_epi32(int(uint32_t(b0 >> 32)));
  __m256i c0 = _mm256_add_epi32(lo, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // carry: c0 < lo as unsigned, i.e. max(c0, lo) != c0
  const __m256i carry = _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_max_epu32(c0, lo), c0), _mm256_set1_epi32(-1));
  __m256i c1 = _mm256_sub_epi32(hi, carry);  // carry lanes are -1: hi + 1
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
    const __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
    const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
    const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
    const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
    const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(int(k0)));
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(int(k1)));
    c1 = lo1, c3 = lo0;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  // blocks 4l, 4l + 1
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  // blocks 4l + 2, 4l + 3
  auto* o = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(o, _mm256_permute2x128_si256(u0, u1, 0x20));      // blocks 0, 1
  _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));  // blocks 2, 3
  _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));  // blocks 4, 5
  _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));  // blocks 6, 7
}
#else
constexpr int kPhiloxRun = 1;
inline void philox_run(uint64_t b0, uint64_t seed, uint32_t* out) {
  const Philox4x32 r = philox4x32_10(uint32_t(b0), uint32_t(b0 >> 32), 0u, 0u, uint32_t(seed), uint32_t(seed >> 32));
  std::copy(r.v, r.v + 4, out);
}
#endif

// The random words of elements i0 .. i0 + len - 1, a run at a time: f(j, n, bits) with bits[t]
// the word of element i0 + j + t, t < n (keep ⇔ bits[t] >= threshold). For a caller that applies
// one mask to several arrays, or fuses it with its own arithmetic, without drawing it twice.
template <class F>
inline void dropout_runs(uint64_t i0, int64_t len, uint64_t seed, F&& f) {
  alignas(64) uint32_t bits[4 * kPhiloxRun];
  int64_t j = 0;
  while (j < len) {
    const uint64_t i = i0 + uint64_t(j);
    philox_run(i >> 2, seed, bits);  // elements 4 · (i >> 2) ... onwards
    const int64_t n = std::min<int64_t>(len - j, 4 * kPhiloxRun - int64_t(i & 3));
    f(j, n, static_cast<const uint32_t*>(bits + (i & 3)));
    j += n;
  }
}

// y[j] = keep_(i0 + j) ? x[j] · scale : 0 for j in [0, len): elements i0 .. i0 + len - 1 of a
// tensor, of which x and y (which may alias) hold only these.
template <class T>
inline void dropout_range(const T* x, T* y, uint64_t i0, int64_t len, uint64_t seed, uint64_t threshold, T scale) {
  dropout_runs(i0, len, seed, [&](int64_t j, int64_t n, const uint32_t* b) {
    for (int64_t t = 0; t < n; ++t) y[j + t] = b[t] >= threshold ? x[j + t] * scale : T(0);
  });
}

// y[i] = keep_i ? x[i] · scale : 0 for i in [begin, end).   x, y: indexed by the global i (may alias)
template <class T>
inline void dropout_apply(const T* x, T* y, int64_t begin, int64_t end, uint64_t seed, uint64_t threshold, T scale) {
  if (end > begin) dropout_range(x + begin, y + begin, static_cast<uint64_t>(begin), end - begin, seed, threshold, scale);
}

// y[j] = keep_(i0 + j) ? y[j] · scale : 0 for j in [0, len), in place: dropout_apply on the
// elements i0 .. i0 + len - 1 of a larger tensor, of which y holds only these (an attention row).
template <class T>
inline void dropout_apply_at(T* y, int64_t i0, int64_t len, uint64_t seed, uint64_t threshold, T scale) {
  if (len > 0) dropout_range(y, y, static_cast<uint64_t>(i0), len, seed, threshold, scale);
}

}  // namespace transformer_core::kernels
