// The quantized kernels for AVX-512 (F, BW, VL, DQ) + VNNI, with FMA and F16C. Compiled with exactly
// those flags (CMakeLists.txt), and only called when the CPU and OS have them (quant_dispatch.cpp).
// Must match quant_scalar.cpp bit for bit: the kernels.hpp contract fixes every floating-point operation.
//
// Integer dots with vpdpbusd: u8 × s8, four products summed into each int32 lane, no intermediate
// saturation. The unsigned operand is the weight moved up by 128 (w xor 0x80 = w + 128 ∈ [0, 255]),
// and the shift comes back off exactly:   Σ w·x = Σ (w + 128)·x − 128 · Σ x,
// with Σ x known per row (int8 activations) or per group of 4 (Q8 activation blocks). Exact for any
// int8 weight, -128 included. The 4-bit formats' nibbles (0..15) are unsigned as they are:
//   Q4_0: Σ (nib − 8)·x = Σ nib·x − 8 · Σ x.

// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (_mm*_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "quant_common.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"

namespace transformer_core::kernels::quant {
namespace {

inline __mmask16 tail_mask16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask64 tail_mask64(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// max |v| over n values, and whether all are finite.
inline AbsMax abs_max(const float* v, int64_t n) {
  const __m512 big = _mm512_set1_ps(3.402823466e38f);
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 mk = n - t >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - t);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, v + t));
    vmax = _mm512_max_ps(vmax, a);
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);  // NaN or inf
  }
  return {_mm512_reduce_max_ps(vmax), bad == 0};
}

// n ≤ 16 floats → int8 by rint(clamp(v · inv, −127, 127)); returns their int32 values.
inline __m512i quantize16(const float* v, int64_t n, __m512 inv, int8_t* q) {
  const __mmask16 mk = n >= 16 ? __mmask16(0xFFFF) : tail_mask16(n);
  __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, v), inv);
  s = _mm512_min_ps(_mm512_max_ps(s, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  const __m512i r = _mm512_cvtps_epi32(s);  // rounds half to even (MXCSR default)
  _mm512_mask_cvtsepi32_storeu_epi8(q, mk, r);
  return r;
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
      const __m512 inv = _mm512_set1_ps(rs.inv);
      __m512i vs = _mm512_setzero_si512();
      for (int64_t t = 0; t < k; t += 16) vs = _mm512_add_epi32(vs, quantize16(vr + t, k - t, inv, qr + t));
      s = _mm512_reduce_add_epi32(vs);
    }
    std::memset(qr + k, 0, static_cast<size_t>(ldq - k));
    scale[r] = rs.scale;
    if (sum != nullptr) sum[r] = s;
  }
}

// ---- int8 × int8 -------------------------------------------------------------------------------

// acc + vpdpbusd(u: unsigned bytes, s: signed bytes), as _mm512_dpbusd_epi32(acc, u, s). Written as
// one instruction in asm: with the intrinsic, GCC 12 moves every accumulator of a register tile
// through one spare register and stores it to the stack on every step (2.7 instructions per dot).
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

// Lane t of the result = the sum of the 16 lanes of v[t], for 16 vectors at once: pairs of vectors
// are interleaved and added (32-bit, then 64-bit elements), then the 128-bit quarters: 15 additions
// of 16 lanes and 30 shuffles in all, where 16 separate reductions take ~4× as many instructions.
// (The vectors come by value: an accumulator array whose address escaped would be kept in memory,
// stored on every step of the loop that fills it.)
template <class... V>
inline __m512i reduce16(V... vs) {
  static_assert(sizeof...(V) == 16);
  const __m512i v[16] = {vs...};
  __m512i s[8], t[4];
  for (int i = 0; i < 8; ++i)  // per quarter: [v2i, v2i+1, v2i, v2i+1] partial sums
    s[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per quarter: the quarter's sums of v4i … v4i+3
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * i], s[2 * i + 1]), _mm512_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
  // quarters: [t0.q0 + t0.q1, t0.q2 + t0.q3, t1.q0 + t1.q1, t1.q2 + t1.q3], and the same for t2, t3
  const __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[0], t[1], 0x88), _mm512_shuffle_i32x4(t[0], t[1], 0xDD));
  const __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[2], t[3], 0x88), _mm512_shuffle_i32x4(t[2], t[3], 0xDD));
  // quarter g: the four totals of v4g … v4g+3
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xDD));
}

struct Int8Kernel {
  static constexpr int kMaxMR = 4, kNR1 = 4, kNRm = 4;

  template <int NR, int MR>
  static void tile(const Int8Args& a, int64_t j, int64_t i) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const int8_t* w = a.w + j * a.k;
    const int8_t* x = a.xq + i * a.ldq;
    const int64_t pf = prefetch_distance(NR * a.k);
    __m512i acc[MR * NR];  // acc[u · NR + r]: x row i + u, weight row j + r
    #pragma GCC unroll 16
    for (int q = 0; q < MR * NR; ++q) acc[q] = _mm512_setzero_si512();
    // 64 values of k a step; the weights' tail is masked (zeros: (0 + 128) · x = 0 since x is
    // zero-padded to ldq)
    for (int64_t t = 0; t < a.k; t += 64) {
      const __mmask64 mk = tail_mask64(a.k - t);
      __m512i wu[NR];
      #pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * a.k + t + pf), _MM_HINT_T0);
        wu[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + r * a.k + t), flip);
      }
      #pragma GCC unroll 4
      for (int u = 0; u < MR; ++u) {
        const __m512i xv = _mm512_loadu_si512(x + u * a.ldq + t);
        #pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) acc[u * NR + r] = dpbusd(acc[u * NR + r], wu[r], xv);
      }
    }
    // the lane sums of every accumulator (int32 addition wraps and is associative: any order is exact)
    alignas(64) int32_t sums[MR][NR];
    if constexpr (MR * NR == 16) {
      _mm512_store_si512(sums, reduce16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7], acc[8],
                                         acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15]));
    } else {
      for (int u = 0; u < MR; ++u)
        for (int r = 0; r < NR; ++r) sums[u][r] = _mm512_reduce_add_epi32(acc[u * NR + r]);
    }
    for (int u = 0; u < MR; ++u) {
      for (int r = 0; r < NR; ++r) {
        // Σ (w + 128)·x − 128 · Σ x, in wrapping int32: exact whenever the true sum fits (k ≤ kInt8MaxK)
        const int32_t s = static_cast<int32_t>(static_cast<uint32_t>(sums[u][r]) -
                                               (static_cast<uint32_t>(a.xsum[i + u]) << 7));
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

// ---- int8 × int8 from packed weights (many rows) ------------------------------------------------
//
// The dot kernel above sums each output along k inside one register and reduces the 16 lanes at the
// end: for k = 384 the reductions and the scalar epilogue cost about as much as the products. Here
// (the layout of kernels.hpp) a lane of an accumulator is one output feature: a step broadcasts 4
// values of a row of x and multiplies them with the 4 matching weights of 16 features, so nothing
// is reduced. A register tile holds kPackedRows rows of x × kPackedPanels panels (24 accumulators),
// and each step loads the panels' 4 weight vectors once for all 6 rows (Zen 4, one thread, k = 384:
// 440 against 215 billion int8 multiply-adds a second, the latter with the activations' quantization).
// The int32 sums are exact, so the outputs have linear_int8's bits.
constexpr int64_t kPackedRows = 6, kPackedPanels = 4;

inline int64_t panel_bytes(int64_t k) { return (k + 3) / 4 * 64; }

void pack_int8(const int8_t* w, int64_t k, int64_t j0, int64_t j1, uint8_t* packed) {
  const int64_t full = k / 4;  // whole groups of 4, gathered from the 16 rows at once
  const __m512i row_at = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(static_cast<int>(k)));
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = j0; j < j1; j += kInt8PanelFeatures) {
    const int64_t nf = imin(kInt8PanelFeatures, j1 - j);
    const __mmask16 live = tail_mask16(nf);
    const int8_t* rows = w + j * k;
    uint8_t* out = packed + (j / kInt8PanelFeatures) * panel_bytes(k);
    for (int64_t g = 0; g < full; ++g) {
      const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, row_at, rows + 4 * g, 1);
      _mm512_storeu_si512(out + 64 * g, _mm512_xor_si512(v, flip));
    }
    if (full * 4 < k) {  // the last group: k mod 4 values, then zeros
      alignas(64) uint8_t last[64];
      for (int c = 0; c < 16; ++c)
        for (int t = 0; t < 4; ++t) {
          const int64_t kk = 4 * full + t;
          const int8_t v = c < nf && kk < k ? rows[c * k + kk] : 0;
          last[4 * c + t] = static_cast<uint8_t>(static_cast<uint8_t>(v) ^ 0x80u);
        }
      _mm512_storeu_si512(out + 64 * full, _mm512_load_si512(last));
    }
  }
}

using PackedArgs = Int8ArgsOf<uint8_t>;  // w: the panels of pack_int8

// y[i : i + MR, j : j + cols] (j a multiple of 16, cols ≤ 16 · NP).
template <int MR, int NP>
void packed_tile(const PackedArgs& a, int64_t i, int64_t j, int64_t cols) {
  const int64_t groups = (a.k + 3) / 4, pb = panel_bytes(a.k);
  const uint8_t* wp = a.w + (j / kInt8PanelFeatures) * pb;
  const int8_t* x = a.xq + i * a.ldq;
  __m512i acc[MR][NP];
  #pragma GCC unroll 24
  for (int q = 0; q < MR * NP; ++q) acc[q / NP][q % NP] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {  // x is zero-padded to ldq ≥ 4 · groups
    __m512i wv[NP];
    #pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) wv[p] = _mm512_loadu_si512(wp + p * pb + 64 * g);
    #pragma GCC unroll 6
    for (int u = 0; u < MR; ++u) {
      int32_t four;
      std::memcpy(&four, x + u * a.ldq + 4 * g, 4);
      const __m512i xv = _mm512_set1_epi32(four);
      #pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[u][p] = dpbusd(acc[u][p], wv[p], xv);
    }
  }
  // linear_int8's epilogue, 16 features at a time: the same operations in the same order
  for (int u = 0; u < MR; ++u) {
    // Σ (w + 128)·x − 128 · Σ x, in wrapping int32 (exact whenever the true sum fits)
    const __m512i shift = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(a.xsum[i + u]) << 7));
    const __m512 sx = _mm512_set1_ps(a.sx[i + u]);
    float* yrow = a.y + (i + u) * a.ldy + j;
    for (int p = 0; p < NP; ++p) {
      const int64_t c0 = 16 * p;
      if (c0 >= cols) break;
      const __mmask16 mk = tail_mask16(imin(16, cols - c0));
      const __m512 sc = _mm512_mul_ps(sx, _mm512_maskz_loadu_ps(mk, a.sw + j + c0));
      __m512 out = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[u][p], shift)), sc);
      if (a.bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mk, a.bias + j + c0));
      if (a.accumulate) out = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yrow + c0), out);
      _mm512_mask_storeu_ps(yrow + c0, mk, out);
    }
  }
}

// The tile for MR (1..kPackedRows) rows and NP (1..kPackedPanels) panels, chosen at run time.
template <int MR, int NP>
void packed_tile_np(const PackedArgs& a, int64_t i, int64_t j, int64_t cols, int np) {
  if constexpr (NP >= 1) {
    if (np == NP) return packed_tile<MR, NP>(a, i, j, cols);
    packed_tile_np<MR, NP - 1>(a, i, j, cols, np);
  }
}
template <int MR>
void packed_tile_mr(const PackedArgs& a, int64_t i, int64_t j, int64_t cols, int np, int64_t mr) {
  if constexpr (MR >= 1) {
    if (mr == MR) return packed_tile_np<MR, kPackedPanels>(a, i, j, cols, np);
    packed_tile_mr<MR - 1>(a, i, j, cols, np, mr);
  }
}

void linear_int8_packed(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* xsum, int64_t i0, int64_t i1,
                        int64_t k, const uint8_t* packed, const float* sw, const float* bias, int64_t j0, int64_t j1,
                        float* y, int64_t ldy, bool accumulate) {
  const PackedArgs a{xq, ldq, sx, xsum, k, packed, sw, bias, y, ldy, accumulate};
  // panels outermost: a group of 4 panels (64 features) stays in L1 / L2 while every row passes
  for (int64_t j = j0; j < j1; j += kPackedPanels * kInt8PanelFeatures) {
    const int64_t cols = imin(kPackedPanels * kInt8PanelFeatures, j1 - j);
    const int np = static_cast<int>((cols + kInt8PanelFeatures - 1) / kInt8PanelFeatures);
    for (int64_t i = i0; i < i1; i += kPackedRows) packed_tile_mr<kPackedRows>(a, i, j, cols, np, imin(kPackedRows, i1 - i));
  }
}

// ---- GGUF blocks decoded to fp32 ---------------------------------------------------------------

// The fp32 scales of blocks [b0, b0 + n) of NR rows, d[r][b], and the Q4_1 offsets m[r][b].
template <GgmlType T, int NR>
inline void load_scales(const uint8_t* w, int64_t row_bytes, int64_t b0, int64_t n, float (*d)[kScaleChunk],
                        float (*m)[kScaleChunk]) {
  alignas(64) uint32_t h[kScaleChunk];
  for (int r = 0; r < NR; ++r) {
    gather_heads(w + r * row_bytes, type_size(T), b0, n, h);
    for (int64_t t = 0; t < n; t += 16) {
      const __m512i v = _mm512_load_si512(h + t);
      _mm512_store_ps(d[r] + t, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));  // low halves
      if constexpr (T == GgmlType::kQ4_1)
        _mm512_store_ps(m[r] + t, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
    }
  }
}

// Block → 2 × 16 floats (elements 0-15, 16-31), the values dequantize gives. The 4-bit formats look
// their 16 possible values up in a table built once per block (vpermps indexes by the low 4 bits):
// Q4_0 (i − 8)·d, Q4_1 i·d + m (two roundings), exactly the scalar decode's.
template <GgmlType T>
inline void decode(const uint8_t* blk, const float* d_ptr, const float* m_ptr, __m512& v0, __m512& v1) {
  const __m512 d = _mm512_set1_ps(*d_ptr);
  if constexpr (T == GgmlType::kQ8_0) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
  } else {
    constexpr int at = T == GgmlType::kQ4_0 ? 2 : 4;
    __m512 table;
    if constexpr (T == GgmlType::kQ4_0) {
      table = _mm512_mul_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), d);
    } else {
      table = _mm512_add_ps(_mm512_mul_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), d),
                            _mm512_set1_ps(*m_ptr));
    }
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + at)));
    v0 = _mm512_permutexvar_ps(z, table);                          // low nibbles: elements 0..15
    v1 = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), table);    // high nibbles: elements 16..31
  }
}

template <GgmlType T>
void dequantize_t(const uint8_t* w, int64_t k, int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* out,
                  int64_t ldo) {
  constexpr int64_t ts = type_size(T);
  const int64_t row_bytes = (k / kBlockSize) * ts;
  alignas(64) float d[1][kScaleChunk], m[1][kScaleChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t c0 = b0; c0 < b1; c0 += kScaleChunk) {
      const int64_t n = imin(kScaleChunk, b1 - c0);
      load_scales<T, 1>(row, row_bytes, c0, n, d, m);
      for (int64_t b = 0; b < n; ++b) {
        __m512 v0, v1;
        decode<T>(row + (c0 + b) * ts, &d[0][b], &m[0][b], v0, v1);
        float* o = out + (r - r0) * ldo + (c0 + b - b0) * kBlockSize;
        _mm512_storeu_ps(o, v0);
        _mm512_storeu_ps(o + 16, v1);
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

// Lanes 0..15 of the 32 partial sums live in acc0, 16..31 in acc1 (and at acc_mem[p] between chunks).
template <GgmlType T>
struct F32Kernel {
  static constexpr int kMaxMR = 4, kNR1 = 4, kNRm = 2, kLanes = 32;
  struct Scales {
    alignas(64) float d[4][kScaleChunk];
    alignas(64) float m[4][kScaleChunk];
  };

  template <int NR>
  static void load(const F32Args& a, int64_t j, int64_t c0, int64_t n, Scales& sc) {
    load_scales<T, NR>(a.w + j * a.row_bytes, a.row_bytes, c0, n, sc.d, sc.m);
  }

  template <int NR, int MR>
  static void tile(const F32Args& a, int64_t j, int64_t i, int64_t c0, int64_t n, const Scales& sc, float* acc_mem) {
    constexpr int64_t ts = type_size(T);
    const uint8_t* w = a.w + j * a.row_bytes;
    const float* x = a.x + i * a.ldx;
    const int64_t pf = prefetch_distance(NR * a.row_bytes);
    __m512 acc0[MR][NR], acc1[MR][NR];
    for (int u = 0; u < MR; ++u) {
      for (int r = 0; r < NR; ++r) {
        acc0[u][r] = _mm512_loadu_ps(acc_mem + (u * NR + r) * kLanes);
        acc1[u][r] = _mm512_loadu_ps(acc_mem + (u * NR + r) * kLanes + 16);
      }
    }
    for (int64_t cb = 0; cb < n; ++cb) {
      const int64_t b = c0 + cb;
      __m512 w0[NR], w1[NR];
      for (int r = 0; r < NR; ++r) {
        const uint8_t* blk = w + r * a.row_bytes + b * ts;
        _mm_prefetch(reinterpret_cast<const char*>(blk + pf), _MM_HINT_T0);
        decode<T>(blk, &sc.d[r][cb], &sc.m[r][cb], w0[r], w1[r]);
      }
      for (int u = 0; u < MR; ++u) {
        const __m512 x0 = _mm512_loadu_ps(x + u * a.ldx + b * kBlockSize);
        const __m512 x1 = _mm512_loadu_ps(x + u * a.ldx + b * kBlockSize + 16);
        for (int r = 0; r < NR; ++r) {
          acc0[u][r] = _mm512_fmadd_ps(w0[r], x0, acc0[u][r]);
          acc1[u][r] = _mm512_fmadd_ps(w1[r], x1, acc1[u][r]);
        }
      }
    }
    for (int u = 0; u < MR; ++u) {
      for (int r = 0; r < NR; ++r) {
        _mm512_storeu_ps(acc_mem + (u * NR + r) * kLanes, acc0[u][r]);
        _mm512_storeu_ps(acc_mem + (u * NR + r) * kLanes + 16, acc1[u][r]);
      }
    }
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

// ---- GGUF blocks × Q8 activation blocks (256-bit VNNI: one block per register) -----------------

template <GgmlType T>
struct Q8Kernel {
  static constexpr int kMaxMR = 4, kNR1 = 4, kNRm = 4, kLanes = 8;
  using Scales = typename F32Kernel<T>::Scales;

  template <int NR>
  static void load(const Q8Args& a, int64_t j, int64_t c0, int64_t n, Scales& sc) {
    load_scales<T, NR>(a.w + j * a.row_bytes, a.row_bytes, c0, n, sc.d, sc.m);
  }

  template <int NR, int MR>
  static void tile(const Q8Args& a, int64_t j, int64_t i, int64_t c0, int64_t n, const Scales& sc, float* acc_mem) {
    constexpr int64_t ts = type_size(T);
    const int64_t nb = a.k / kBlockSize;
    const int64_t pf = prefetch_distance(NR * a.row_bytes);
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const uint8_t* w = a.w + j * a.row_bytes;
    __m256 acc[MR][NR];
    for (int u = 0; u < MR; ++u)
      for (int r = 0; r < NR; ++r) acc[u][r] = _mm256_loadu_ps(acc_mem + (u * NR + r) * kLanes);
    for (int64_t cb = 0; cb < n; ++cb) {
      const int64_t b = c0 + cb;
      __m256i wu[NR];
      for (int r = 0; r < NR; ++r) {
        const uint8_t* blk = w + r * a.row_bytes + b * ts;
        _mm_prefetch(reinterpret_cast<const char*>(blk + pf), _MM_HINT_T0);
        if constexpr (T == GgmlType::kQ8_0) {
          wu[r] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), flip);
        } else {
          constexpr int at = T == GgmlType::kQ4_0 ? 2 : 4;
          const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + at));
          wu[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
        }
      }
      for (int u = 0; u < MR; ++u) {
        const int64_t row = i + u;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + row * a.k + b * kBlockSize));
        const __m256 xd = _mm256_broadcast_ss(a.xd + row * nb + b);
        const __m256i g = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xg + (row * nb + b) * 8));
        // the start of each group's sum: −128 Σx (Q8_0's shift), −8 Σx (Q4_0's offset), 0 (Q4_1)
        const __m256i zero = _mm256_setzero_si256();
        __m256i start = zero;
        if constexpr (T == GgmlType::kQ8_0) start = _mm256_sub_epi32(zero, _mm256_slli_epi32(g, 7));
        if constexpr (T == GgmlType::kQ4_0) start = _mm256_sub_epi32(zero, _mm256_slli_epi32(g, 3));
        for (int r = 0; r < NR; ++r) {
          const __m256i s = _mm256_dpbusd_epi32(start, wu[r], xv);
          const __m256 dd = _mm256_mul_ps(_mm256_broadcast_ss(&sc.d[r][cb]), xd);  // d_w · xd, as the scalar
          acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[u][r]);
          if constexpr (T == GgmlType::kQ4_1)
            acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g), _mm256_mul_ps(_mm256_broadcast_ss(&sc.m[r][cb]), xd),
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
  const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* vb = v + r * k + b * kBlockSize;
      int8_t* qb = q + r * k + b * kBlockSize;
      const AbsMax am = abs_max(vb, kBlockSize);
      const RowScale rs = row_scale(am.amax, am.finite);
      if (rs.inv == 0.0f) {
        std::memset(qb, 0, kBlockSize);
      } else {
        const __m512 inv = _mm512_set1_ps(rs.inv);
        quantize16(vb, 16, inv, qb);
        quantize16(vb + 16, 16, inv, qb + 16);
      }
      d[r * nb + b] = rs.scale;
      if (g != nullptr) {  // sums of 4 consecutive values: ones (u8) · q (s8) by vpdpbusd
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + (r * nb + b) * 8), _mm256_dpbusd_epi32(zero, ones, qv));
      }
    }
  }
}

constexpr KernelTable kTable{Isa::kAvx512Vnni, quantize_rows_int8, linear_int8,       dequantize,
                             linear_gguf_f32,  linear_gguf_q8,    quantize_q8_blocks, 64, 64,
                             pack_int8,        linear_int8_packed, 96, 128};

}  // namespace

const KernelTable& avx512vnni_kernels() { return kTable; }

}  // namespace transformer_core::kernels::quant
