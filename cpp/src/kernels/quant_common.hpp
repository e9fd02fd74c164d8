// Private helpers of the quantized kernels' translation units (quant_<isa>.cpp). Everything here
// has internal linkage (an anonymous namespace): each TU compiles its own copy under its own ISA
// flags, so the linker can never hand one TU's AVX-512 copy to another.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "transformer_core/kernels/quant/formats.hpp"

namespace transformer_core::kernels::quant {
namespace {

// Little-endian 16-bit load (the GGUF scales).
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// IEEE binary16 → binary32, exact (as numpy's float16 → float32 and F16C's vcvtph2ps on every
// finite or infinite value; NaNs keep their payload).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 → 127
  } else if (mant == 0) {
    bits = sign;  // ±0
  } else {        // subnormal: normalise
    int e = 113;  // 127 − 15 + 1
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The per-row rule of formats.hpp, on its scalar parts: the row's scale and multiplier.
struct RowScale {
  float scale;  // amax / 127, 0 (tiny row) or NaN (non-finite row)
  float inv;    // 127 / amax, 0 when the row quantizes to zeros
};

struct AbsMax {
  float amax;   // max |v| (meaningful when finite)
  bool finite;  // no NaN, no ±inf
};

inline RowScale row_scale(float amax, bool finite) {
  if (!finite) return {std::nanf(""), 0.0f};
  if (amax < kMinAbsMax) return {0.0f, 0.0f};
  return {amax / 127.0f, 127.0f / amax};
}

// One value: rint(clamp(v · inv, −127, 127)), rounding half to even (the default rounding mode).
inline int8_t quantize_value(float v, float inv) {
  float t = v * inv;
  t = t < -127.0f ? -127.0f : t;
  t = t > 127.0f ? 127.0f : t;
  return static_cast<int8_t>(static_cast<int>(std::nearbyint(t)));
}

// Scalar decode of element p of a GGUF block (formats.hpp), as dequantize must produce it.
inline float decode_q8_0(const uint8_t* blk, int p, float d) {
  return static_cast<float>(static_cast<int8_t>(blk[2 + p])) * d;
}
inline int nibble(const uint8_t* qs, int p) { return p < 16 ? (qs[p] & 0x0F) : (qs[p - 16] >> 4); }
inline float decode_q4_0(const uint8_t* blk, int p, float d) {
  return static_cast<float>(nibble(blk + 2, p) - 8) * d;
}
inline float decode_q4_1(const uint8_t* blk, int p, float d, float m) {
  const float dq = d * static_cast<float>(nibble(blk + 4, p));
  return dq + m;
}

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// The SIMD product kernels convert the fp16 scales of kScaleChunk blocks of a row at a time (a
// vector conversion instead of one scalar conversion and broadcast per block).
constexpr int64_t kScaleChunk = 64;

// The first 4 bytes of blocks [b0, b0 + n) of a row — the fp16 scale d in the low half, and for
// Q4_1 the fp16 offset m in the high half — zero-padded to a multiple of 16 (the widest conversion
// reads 16 at a time). One load and one store per block; the vector conversion follows.
inline void gather_heads(const uint8_t* row, int64_t type_bytes, int64_t b0, int64_t n, uint32_t* h) {
  const uint8_t* p = row + b0 * type_bytes;
#pragma GCC unroll 8
  for (int64_t b = 0; b < n; ++b) std::memcpy(h + b, p + b * type_bytes, 4);
  for (int64_t b = n; b < ((n + 15) & ~int64_t{15}); ++b) h[b] = 0;
}

// Software prefetch distance for a group of weight rows `group_bytes` long: whole groups, at least
// 4 KiB ahead. The weights are one contiguous stream, but decoding is slow enough per byte that the
// hardware prefetcher alone leaves the core waiting on memory (measured: 2-3x slower streamed than
// cache-resident); each row's block is fetched this far ahead — the same block of a later group.
inline int64_t prefetch_distance(int64_t group_bytes) {
  const int64_t groups = (4096 + group_bytes - 1) / group_bytes;
  return groups * group_bytes;
}

// The arguments of a product kernel (kernels.hpp), gathered for the tile templates below. W: int8
// weight rows (linear_int8), or the packed panels' bytes (linear_int8_packed).
template <class W>
struct Int8ArgsOf {
  const int8_t* xq;
  int64_t ldq;
  const float* sx;
  const int32_t* xsum;
  int64_t k;
  const W* w;
  const float* sw;
  const float* bias;
  float* y;
  int64_t ldy;
  bool accumulate;  // y += the product, instead of y = it
};
using Int8Args = Int8ArgsOf<int8_t>;
struct F32Args {
  const float* x;
  int64_t ldx;
  int64_t k;
  const uint8_t* w;
  int64_t row_bytes;
  const float* bias;
  float* y;
  int64_t ldy;
};
struct Q8Args {
  const int8_t* xq;
  const float* xd;
  const int32_t* xg;
  int64_t k;
  const uint8_t* w;
  int64_t row_bytes;
  const float* bias;
  float* y;
  int64_t ldy;
};

// Register tiling of a SIMD product kernel K: K::tile<NR, MR>(args, j, i) computes the outputs of
// NR weight rows j.. and MR x rows i.. at once (weights decoded once per block for MR rows of x,
// each x vector loaded once for NR weight rows). Every output is computed by the same operations
// in the same order whatever NR and MR are, so the tiling never changes a result.
//   K::kMaxMR   x rows per tile
//   K::kNR1     weight rows per tile when x has one row (decoding: the weights stream once)
//   K::kNRm     weight rows per tile otherwise
template <class K, int NR, int MR, class Args>
void tile_mr(const Args& a, int64_t j, int64_t i, int64_t mr) {
  if constexpr (MR >= 1) {
    if (mr == MR) return K::template tile<NR, MR>(a, j, i);
    tile_mr<K, NR, MR - 1>(a, j, i, mr);
  }
}

template <class K, int NR, class Args>
void tile_rows(const Args& a, int64_t j, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1;) {
    const int64_t mr = imin(K::kMaxMR, i1 - i);
    tile_mr<K, NR, K::kMaxMR>(a, j, i, mr);
    i += mr;
  }
}

// y[i0:i1, j0:j1] by tiles: weight rows outermost, so a group of weight rows stays in L1 while
// every x row passes over it. (The int8 product: no block scales.)
template <class K, class Args>
void drive(const Args& a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  int64_t j = j0;
  if (i1 - i0 == 1) {
    for (; j + K::kNR1 <= j1; j += K::kNR1) tile_rows<K, K::kNR1>(a, j, i0, i1);
  } else {
    for (; j + K::kNRm <= j1; j += K::kNRm) tile_rows<K, K::kNRm>(a, j, i0, i1);
  }
  for (; j < j1; ++j) tile_rows<K, 1>(a, j, i0, i1);
}

// The fixed halving tree of kernels.hpp: reduce(a[0:2n]) = reduce(a[0:n] + a[n:2n]); a may be overwritten.
// With AVX, 8 and 32 floats are reduced in registers by the same additions, lane for lane (a[p] +
// a[p + h] for every p < h at each level): the same result. In a decoding step's product with 576
// inputs (18 blocks a row), the scalar loop was a fifth to a third of the time (Zen 4).
#if defined(__AVX__)
// a[0:8] in one register: levels h = 4, 2, 1
inline float reduce_tree8(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // p < 4
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));                                  // p < 2
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));                         // p < 1
}
#endif

inline float reduce_tree(float* a, int n) {
#if defined(__AVX__)
  if (n == 8) return reduce_tree8(_mm256_loadu_ps(a));
  if (n == 32) {  // h = 16, then 8
    const __m256 lo = _mm256_add_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 16));      // p < 8
    const __m256 hi = _mm256_add_ps(_mm256_loadu_ps(a + 8), _mm256_loadu_ps(a + 24));  // 8 ≤ p < 16
    return reduce_tree8(_mm256_add_ps(lo, hi));
  }
#endif
  for (int h = n / 2; h >= 1; h /= 2)
    for (int p = 0; p < h; ++p) a[p] = a[p] + a[p + h];
  return a[0];
}

// The block products (GGUF weights): the same tiling, with the blocks' scales converted once per
// chunk of kScaleChunk blocks for a group of NR weight rows and used by every x row. The partial
// sums of each output (K::kLanes floats, lane p at [p]) wait in `acc` between chunks — stored and
// reloaded unchanged, so the chunking never changes a result — and are reduced at the end.
//   K::Scales                             the converted scales of NR ≤ 4 rows × kScaleChunk blocks
//   K::load<NR>(a, j, c0, n, sc)          scales of blocks [c0, c0 + n) of rows j..j+NR
//   K::tile<NR, MR>(a, j, i, c0, n, sc, acc)   blocks [c0, c0 + n); acc: [MR][NR][kLanes]
constexpr int64_t kRowsPerPass = 64;

template <class K, int NR, int MR, class Args>
void block_tile_mr(const Args& a, int64_t j, int64_t i, int64_t c0, int64_t n, const typename K::Scales& sc,
                   float* acc, int64_t mr) {
  if constexpr (MR >= 1) {
    if (mr == MR) return K::template tile<NR, MR>(a, j, i, c0, n, sc, acc);
    block_tile_mr<K, NR, MR - 1>(a, j, i, c0, n, sc, acc, mr);
  }
}

template <class K, int NR, class Args>
void block_group(const Args& a, int64_t j, int64_t i0, int64_t i1, typename K::Scales& sc, float* acc) {
  const int64_t nb = a.k / kBlockSize, per_row = NR * K::kLanes;
  std::memset(acc, 0, sizeof(float) * static_cast<size_t>((i1 - i0) * per_row));
  for (int64_t c0 = 0; c0 < nb; c0 += kScaleChunk) {
    const int64_t n = imin(kScaleChunk, nb - c0);
    K::template load<NR>(a, j, c0, n, sc);
    for (int64_t i = i0; i < i1;) {
      const int64_t mr = imin(K::kMaxMR, i1 - i);
      block_tile_mr<K, NR, K::kMaxMR>(a, j, i, c0, n, sc, acc + (i - i0) * per_row, mr);
      i += mr;
    }
  }
  for (int64_t i = i0; i < i1; ++i) {
    for (int r = 0; r < NR; ++r) {
      float out = reduce_tree(acc + (i - i0) * per_row + r * K::kLanes, K::kLanes);
      if (a.bias != nullptr) out = out + a.bias[j + r];
      a.y[i * a.ldy + j + r] = out;
    }
  }
}

template <class K, class Args>
void drive_blocks(const Args& a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  alignas(64) float acc[kRowsPerPass * 4 * K::kLanes];
  typename K::Scales sc;
  for (int64_t p0 = i0; p0 < i1; p0 += kRowsPerPass) {
    const int64_t p1 = imin(i1, p0 + kRowsPerPass);
    int64_t j = j0;
    if (p1 - p0 == 1) {
      for (; j + K::kNR1 <= j1; j += K::kNR1) block_group<K, K::kNR1>(a, j, p0, p1, sc, acc);
    } else {
      for (; j + K::kNRm <= j1; j += K::kNRm) block_group<K, K::kNRm>(a, j, p0, p1, sc, acc);
    }
    for (; j < j1; ++j) block_group<K, 1>(a, j, p0, p1, sc, acc);
  }
}

}  // namespace
}  // namespace transformer_core::kernels::quant
