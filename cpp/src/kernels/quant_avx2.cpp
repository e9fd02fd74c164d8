// The quantized kernels for AVX2 + FMA + F16C (256-bit). Compiled with exactly those flags
// (CMakeLists.txt), and only called when the CPU has them (quant_dispatch.cpp). Must match
// quant_scalar.cpp bit for bit: the kernels.hpp contract fixes every floating-point operation.
//
// Integer dots with vpmaddubsw (u8 × s8 → pairs summed into int16, SATURATING) then vpmaddwd by ones
// (pairs of int16 → int32, exact). The unsigned operand must be non-negative, so the weight's
// magnitude goes there and its sign moves onto x:  w · x = |w| · (sign(w) · x).
// No saturation: |w| ≤ 128 (int8 weights, -128 included: vpabsb(-128) = 0x80 = 128 as u8) and
// |x| ≤ 127 (our quantizer clamps to ±127), so each pair sum is at most 2 · 128 · 127 = 32512 < 32767.
// The 4-bit formats' nibbles (0..15) are non-negative already: pair sums ≤ 2 · 15 · 127 = 3810.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant_common.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"

namespace transformer_core::kernels::quant {
namespace {

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x55));
  return _mm_cvtsi128_si32(s);
}

inline float hmax_ps(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 floats → 32 int8 by rint(clamp(v · inv, −127, 127)); returns the 8 int32 partial sums added to sum.
inline __m256i quantize32(const float* v, __m256 inv, int8_t* q, __m256i sum) {
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i r[4];
  for (int t = 0; t < 4; ++t) {
    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(v + 8 * t), inv);
    s = _mm256_min_ps(_mm256_max_ps(s, lo), hi);
    r[t] = _mm256_cvtps_epi32(s);  // rounds half to even (MXCSR default)
    sum = _mm256_add_epi32(sum, r[t]);
  }
  const __m256i ab = _mm256_packs_epi32(r[0], r[1]), cd = _mm256_packs_epi32(r[2], r[3]);
  const __m256i bytes = _mm256_packs_epi16(ab, cd);  // lanes interleaved by 128-bit halves: reorder
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  return sum;
}

// max |v| over n values, and whether all are finite.
inline AbsMax abs_max(const float* v, int64_t n) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 big = _mm256_set1_ps(3.402823466e38f);
  __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + t), absmask);
    vmax = _mm256_max_ps(vmax, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // NaN or inf
  }
  float amax = hmax_ps(vmax);
  bool ok = _mm256_movemask_ps(bad) == 0;
  for (; t < n; ++t) {
    const float a = std::fabs(v[t]);
    if (!(a <= 3.402823466e38f)) ok = false;
    amax = a > amax ? a : amax;
  }
  return {amax, ok};
}

void quantize_rows_int8(const float* v, int64_t rows, int64_t k, int8_t* q, int64_t ldq, float* scale,
                        int32_t* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* vr = v + r * k;
    int8_t* qr = q + r * ldq;
    const AbsMax am = abs_max(vr, k);
    const RowScale rs = row_scale(am.amax, am.finite);
    int32_t s = 0;
    if (rs.inv == 0.0f) {
      std::memset(qr, 0, static_cast<size_t>(k));
    } else {
      const __m256 inv = _mm256_set1_ps(rs.inv);
      __m256i vs = _mm256_setzero_si256();
      int64_t t = 0;
      for (; t + 32 <= k; t += 32) vs = quantize32(vr + t, inv, qr + t, vs);
      s = hsum_i32(vs);
      for (; t < k; ++t) {
        qr[t] = quantize_value(vr[t], rs.inv);
        s += qr[t];
      }
    }
    std::memset(qr + k, 0, static_cast<size_t>(ldq - k));
    scale[r] = rs.scale;
    if (sum != nullptr) sum[r] = s;
  }
}

// ---- int8 × int8 -------------------------------------------------------------------------------

struct Int8Kernel {
  static constexpr int kMaxMR = 4, kNR1 = 4, kNRm = 2;

  template <int NR, int MR>
  static void tile(const Int8Args& a, int64_t j, int64_t i) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* w = a.w + j * a.k;
    const int8_t* x = a.xq + i * a.ldq;
    const int64_t pf = prefetch_distance(NR * a.k);
    __m256i acc[MR][NR];
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r) acc[u][r] = _mm256_setzero_si256();
    const int64_t k32 = a.k & ~int64_t{31};
    for (int64_t t = 0; t < k32; t += 32) {
      __m256i wv[NR], wa[NR];
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * a.k + t + pf), _MM_HINT_T0);
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * a.k + t));
        wa[r] = _mm256_abs_epi8(wv[r]);
      }
      for (int u = 0; u < MR; ++u) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + u * a.ldq + t));
        for (int r = 0; r < NR; ++r) {
          const __m256i p16 = _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xv, wv[r]));
          acc[u][r] = _mm256_add_epi32(acc[u][r], _mm256_madd_epi16(p16, ones));
        }
      }
    }
    for (int u = 0; u < MR; ++u) {
      for (int r = 0; r < NR; ++r) {
        int32_t s = hsum_i32(acc[u][r]);
        for (int64_t t = k32; t < a.k; ++t)
          s += static_cast<int32_t>(x[u * a.ldq + t]) * static_cast<int32_t>(w[r * a.k + t]);
        const float sc = a.sx[i + u] * a.sw[j + r];
        float out = static_cast<float>(s) * sc;
        if (a.bias != nullptr) out = out + a.bias[j + r];
        float& dst = a.y[(i + u) * a.ldy + j + r];
        dst = a.accumulate ? dst + out : out;
      }
    }
  }
};

void linear_int8(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* xsum, int64_t i0, int64_t i1,
                 int64_t k, const int8_t* w, const float* sw, const float* bias, int64_t j0, int64_t j1, float* y,
                 int64_t ldy, bool accumulate) {
  const Int8Args a{xq, ldq, sx, xsum, k, w, sw, bias, y, ldy, accumulate};
  drive<Int8Kernel>(a, i0, i1, j0, j1);
}

// ---- GGUF blocks decoded to fp32 ---------------------------------------------------------------

// The fp32 scales of blocks [b0, b0 + n) of NR rows, d[r][b], and their offsets off[r][b]: −8·d (Q4_0,
// exact: a power of two), m (Q4_1), unused (Q8_0).
template <GgmlType T, int NR>
inline void load_scales(const uint8_t* w, int64_t row_bytes, int64_t b0, int64_t n, float (*d)[kScaleChunk],
                        float (*off)[kScaleChunk]) {
  alignas(32) uint32_t h[kScaleChunk];
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int r = 0; r < NR; ++r) {
    gather_heads(w + r * row_bytes, type_size(T), b0, n, h);
    for (int64_t t = 0; t < n; t += 8) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(h + t));
      // the 8 low halves → 8 × int16 in order: pack (lanes interleave by 128 bits), then reorder
      const __m256i lo = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(v, low16), v), 0x08);
      const __m256 dv = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
      _mm256_store_ps(d[r] + t, dv);
      if constexpr (T == GgmlType::kQ4_0) _mm256_store_ps(off[r] + t, _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f)));
      if constexpr (T == GgmlType::kQ4_1) {
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(v, 16), v), 0x08);
        _mm256_store_ps(off[r] + t, _mm256_cvtph_ps(_mm256_castsi256_si128(hi)));
      }
    }
  }
}

// Block → 4 × 8 floats (elements 0-7, 8-15, 16-23, 24-31), the values dequantize gives:
// Q8_0 q·d; Q4_0 fma(q, d, −8d) = round(d·(q − 8)), one rounding of the same exact value as
// d·(q − 8) — but +0 where d·(q − 8) is −0 (d < 0, q = 8), which no sum can tell apart (an fma
// accumulator starting at +0 never becomes −0), so only dequantize (kSignedZero) pays the subtraction;
// Q4_1 q·d + m, two roundings.
template <GgmlType T, bool kSignedZero = false>
inline void decode(const uint8_t* blk, const float* d_ptr, const float* off_ptr, __m256 v[4]) {
  const __m256 d = _mm256_broadcast_ss(d_ptr);
  if constexpr (T == GgmlType::kQ8_0) {
    for (int t = 0; t < 4; ++t) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * t)));
      v[t] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
    }
  } else {
    constexpr int at = T == GgmlType::kQ4_0 ? 2 : 4;
    const __m256 off = _mm256_broadcast_ss(off_ptr);
    const __m256i z0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + at)));
    const __m256i z1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + at + 8)));
    const __m256i low = _mm256_set1_epi32(0x0F);
    const __m256i q[4] = {_mm256_and_si256(z0, low), _mm256_and_si256(z1, low), _mm256_srli_epi32(z0, 4),
                          _mm256_srli_epi32(z1, 4)};
    for (int t = 0; t < 4; ++t) {
      const __m256 qf = _mm256_cvtepi32_ps(q[t]);
      if constexpr (T == GgmlType::kQ4_0 && kSignedZero)
        v[t] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[t], _mm256_set1_epi32(8))), d);
      else if constexpr (T == GgmlType::kQ4_0)
        v[t] = _mm256_fmadd_ps(qf, d, off);
      else
        v[t] = _mm256_add_ps(_mm256_mul_ps(qf, d), off);
    }
  }
}

template <GgmlType T>
void dequantize_t(const uint8_t* w, int64_t k, int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* out,
                  int64_t ldo) {
  constexpr int64_t ts = type_size(T);
  const int64_t row_bytes = (k / kBlockSize) * ts;
  alignas(32) float d[1][kScaleChunk], off[1][kScaleChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t c0 = b0; c0 < b1; c0 += kScaleChunk) {
      const int64_t n = imin(kScaleChunk, b1 - c0);
      load_scales<T, 1>(row, row_bytes, c0, n, d, off);
      for (int64_t b = 0; b < n; ++b) {
        __m256 v[4];
        decode<T, true>(row + (c0 + b) * ts, &d[0][b], &off[0][b], v);
        float* o = out + (r - r0) * ldo + (c0 + b - b0) * kBlockSize;
        for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + 8 * t, v[t]);
      }
    }
  }
}

void dequantize(GgmlType type, const uint8_t* w, int64_t k, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                float* out, int64_t ldo) {
  switch (type) {
    case GgmlType::kQ8_0: return dequantize_t<GgmlType::kQ8_0>(w, k, r0, r1, b0, b1, out, ldo);
    case GgmlType::kQ4_0: return dequantize_t<GgmlType::kQ4_0>(w, k, r0, r1, b0, b1, out, ldo);
    case GgmlType::kQ4_1: return dequantize_t<GgmlType::kQ4_1>(w, k, r0, r1, b0, b1, out, ldo);
  }
}

// Lane p of the 32 partial sums lives in acc[p / 8], lane p % 8 (and at acc_mem[p] between chunks).
template <GgmlType T>
struct F32Kernel {
  static constexpr int kMaxMR = 2, kNR1 = 2, kNRm = 1, kLanes = 32;
  struct Scales {
    alignas(32) float d[4][kScaleChunk];
    alignas(32) float off[4][kScaleChunk];
  };

  template <int NR>
  static void load(const F32Args& a, int64_t j, int64_t c0, int64_t n, Scales& sc) {
    load_scales<T, NR>(a.w + j * a.row_bytes, a.row_bytes, c0, n, sc.d, sc.off);
  }

  template <int NR, int MR>
  static void tile(const F32Args& a, int64_t j, int64_t i, int64_t c0, int64_t n, const Scales& sc, float* acc_mem) {
    constexpr int64_t ts = type_size(T);
    const uint8_t* w = a.w + j * a.row_bytes;
    const float* x = a.x + i * a.ldx;
    const int64_t pf = prefetch_distance(NR * a.row_bytes);
    __m256 acc[MR][NR][4];
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r)
        for (int t = 0; t < 4; ++t) acc[u][r][t] = _mm256_loadu_ps(acc_mem + (u * NR + r) * kLanes + 8 * t);
    for (int64_t cb = 0; cb < n; ++cb) {
      const int64_t b = c0 + cb;
      __m256 wv[NR][4];
      for (int r = 0; r < NR; ++r) {
        const uint8_t* blk = w + r * a.row_bytes + b * ts;
        _mm_prefetch(reinterpret_cast<const char*>(blk + pf), _MM_HINT_T0);
        decode<T>(blk, &sc.d[r][cb], &sc.off[r][cb], wv[r]);
      }
      for (int u = 0; u < MR; ++u) {
        const float* xb = x + u * a.ldx + b * kBlockSize;
        for (int t = 0; t < 4; ++t) {
          const __m256 xv = _mm256_loadu_ps(xb + 8 * t);
          for (int r = 0; r < NR; ++r) acc[u][r][t] = _mm256_fmadd_ps(wv[r][t], xv, acc[u][r][t]);
        }
      }
    }
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r)
        for (int t = 0; t < 4; ++t) _mm256_storeu_ps(acc_mem + (u * NR + r) * kLanes + 8 * t, acc[u][r][t]);
  }
};

void linear_gguf_f32(GgmlType type, const float* x, int64_t ldx, int64_t i0, int64_t i1, int64_t k,
                     const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const F32Args a{x, ldx, k, w, (k / kBlockSize) * type_size(type), bias, y, ldy};
  switch (type) {
    case GgmlType::kQ8_0: return drive_blocks<F32Kernel<GgmlType::kQ8_0>>(a, i0, i1, j0, j1);
    case GgmlType::kQ4_0: return drive_blocks<F32Kernel<GgmlType::kQ4_0>>(a, i0, i1, j0, j1);
    case GgmlType::kQ4_1: return drive_blocks<F32Kernel<GgmlType::kQ4_1>>(a, i0, i1, j0, j1);
  }
}

// ---- GGUF blocks × Q8 activation blocks --------------------------------------------------------

template <GgmlType T>
struct Q8Kernel {
  static constexpr int kMaxMR = 4, kNR1 = 4, kNRm = 2, kLanes = 8;
  using Scales = typename F32Kernel<T>::Scales;

  template <int NR>
  static void load(const Q8Args& a, int64_t j, int64_t c0, int64_t n, Scales& sc) {
    load_scales<T, NR>(a.w + j * a.row_bytes, a.row_bytes, c0, n, sc.d, sc.off);
  }

  template <int NR, int MR>
  static void tile(const Q8Args& a, int64_t j, int64_t i, int64_t c0, int64_t n, const Scales& sc, float* acc_mem) {
    constexpr int64_t ts = type_size(T);
    const int64_t nb = a.k / kBlockSize;
    const int64_t pf = prefetch_distance(NR * a.row_bytes);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i low = _mm256_set1_epi8(0x0F);
    const uint8_t* w = a.w + j * a.row_bytes;
    __m256 acc[MR][NR];
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r) acc[u][r] = _mm256_loadu_ps(acc_mem + (u * NR + r) * kLanes);
    for (int64_t cb = 0; cb < n; ++cb) {
      const int64_t b = c0 + cb;
      __m256i wv[NR], wa[NR];
      for (int r = 0; r < NR; ++r) {
        const uint8_t* blk = w + r * a.row_bytes + b * ts;
        _mm_prefetch(reinterpret_cast<const char*>(blk + pf), _MM_HINT_T0);
        if constexpr (T == GgmlType::kQ8_0) {
          wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
          wa[r] = _mm256_abs_epi8(wv[r]);
        } else {
          constexpr int at = T == GgmlType::kQ4_0 ? 2 : 4;
          const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + at));
          // elements 0..15 = low nibbles, 16..31 = high nibbles
          wa[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
        }
      }
      for (int u = 0; u < MR; ++u) {
        const int64_t row = i + u;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + row * a.k + b * kBlockSize));
        const __m256 xd = _mm256_broadcast_ss(a.xd + row * nb + b);
        const __m256i g = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xg + (row * nb + b) * 8));
        for (int r = 0; r < NR; ++r) {
          __m256i s;
          if constexpr (T == GgmlType::kQ8_0) {
            s = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xv, wv[r])), ones);
          } else {
            s = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], xv), ones);
            if constexpr (T == GgmlType::kQ4_0) s = _mm256_sub_epi32(s, _mm256_slli_epi32(g, 3));  // Σ (nib − 8) x
          }
          const __m256 dd = _mm256_mul_ps(_mm256_broadcast_ss(&sc.d[r][cb]), xd);  // d_w · xd, as the scalar
          acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[u][r]);
          if constexpr (T == GgmlType::kQ4_1)
            acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g), _mm256_mul_ps(_mm256_broadcast_ss(&sc.off[r][cb]), xd),
                                        acc[u][r]);
        }
      }
    }
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc_mem + (u * NR + r) * kLanes, acc[u][r]);
  }
};

void linear_gguf_q8(GgmlType type, const int8_t* xq, const float* xd, const int32_t* xg, int64_t i0, int64_t i1,
                    int64_t k, const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const Q8Args a{xq, xd, xg, k, w, (k / kBlockSize) * type_size(type), bias, y, ldy};
  switch (type) {
    case GgmlType::kQ8_0: return drive_blocks<Q8Kernel<GgmlType::kQ8_0>>(a, i0, i1, j0, j1);
    case GgmlType::kQ4_0: return drive_blocks<Q8Kernel<GgmlType::kQ4_0>>(a, i0, i1, j0, j1);
    case GgmlType::kQ4_1: return drive_blocks<Q8Kernel<GgmlType::kQ4_1>>(a, i0, i1, j0, j1);
  }
}

void quantize_q8_blocks(const float* v, int64_t rows, int64_t k, int8_t* q, float* d, int32_t* g) {
  const int64_t nb = k / kBlockSize;
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* vb = v + r * k + b * kBlockSize;
      int8_t* qb = q + r * k + b * kBlockSize;
      const AbsMax am = abs_max(vb, kBlockSize);
      const RowScale rs = row_scale(am.amax, am.finite);
      if (rs.inv == 0.0f) {
        std::memset(qb, 0, kBlockSize);
      } else {
        quantize32(vb, _mm256_set1_ps(rs.inv), qb, _mm256_setzero_si256());
      }
      d[r * nb + b] = rs.scale;
      if (g != nullptr) {  // sums of 4 consecutive values: |q| ≤ 127 as s8 against ones as u8
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb));
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qv), ones16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + (r * nb + b) * 8), s);
      }
    }
  }
}

constexpr KernelTable kTable{Isa::kAvx2,     quantize_rows_int8, linear_int8,       dequantize,
                             linear_gguf_f32, linear_gguf_q8,    quantize_q8_blocks, 64, 64,
                             nullptr,         nullptr,           0,  0};

}  // namespace

const KernelTable& avx2_kernels() { return kTable; }

}  // namespace transformer_core::kernels::quant
