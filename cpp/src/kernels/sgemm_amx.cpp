// fp32 products on AMX tiles: six bf16 products of three-way split values (sgemm.hpp, split).
// Compiled with the AVX-512 flags plus AVX512-BF16, AMX-TILE and AMX-BF16 (CMakeLists.txt), and only called
// while the "amx" ISA is active (quant_dispatch.cpp checks the CPU, the OS and Linux's grant).
//
// The roles. tdpbf16ps C += A · B takes A as 16 rows × 32 bf16 and B as 16 rows of pairs: row q
// holds, for each of 16 columns j, B[2q, j] and B[2q + 1, j] side by side. For B = wᵀ that is a
// 16 × 16 transpose of 4-byte words (pairs of w's row j), done once per call by pack_b. split_a
// writes A's parts as whole tiles too (16 rows × 32 values, 1 KiB each, contiguous), so every tile
// load reads 16 consecutive cache lines, not 16 rows a row stride apart. C is 16 × 16 fp32, started
// from the bias (or zero) and stored straight into y.
//
// One step of the kernel: 2 × 2 C tiles (32 rows × 32 columns), and for each 32 values of k the six
// products (a2·b0, a1·b0, a1·b1, a0·b1, a0·b2, a0·b0: the small ones first), each with 2 × 2 tiles:
//   tmm0-3  C (row group r, column group c) in tmm(2r + c)
//   tmm4-5  A, one part of row groups 0, 1
//   tmm6-7  B, one part of column groups 0, 1
// What bounds it: tdpbf16ps takes 16 cycles; a tile load from L2 can take longer than that, and
// a load into tmm4-7 waits for the products still reading the tile. So consecutive products share
// one operand pair, and the data sit where the loads stream them. Measured on a Xeon (Sapphire
// Rapids class), 96 × 128 outputs at k = 384, in TSC ticks per tdpbf16ps: 23.5 with row-major
// planes of A and 18 loads a step, 20.4 now, 16.7 with every operand in L1.

// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (_mm*_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "transformer_core/kernels/sgemm.hpp"
#include "amx_tiles.hpp"

namespace transformer_core::kernels::sgemm::split {
namespace {

constexpr int64_t kTile = 16 * kDepth;  // bf16 values of one A or B tile (16 × 64 bytes)

// 16 floats → their three bf16 parts (part[s]: 16 values), each rounded to nearest-even by
// vcvtneps2bf16 from what the previous parts left; bad gains the lanes holding Inf or NaN.
// A finite value that would round up to Inf (|a| >= 0x7F7F8000: within half a bf16 step of FLT_MAX)
// is truncated to its high part first; the residuals still hold the rest, so the split stays exact.
inline void split16(__m512 a, __m256i part[3], __mmask16& bad) {
  const __m512i bits = _mm512_castps_si512(a);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  bad |= _mm512_cmpge_epu32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
  const __mmask16 huge = _mm512_cmpge_epu32_mask(magnitude, _mm512_set1_epi32(0x7F7F8000));
  const __m512i truncated = _mm512_mask_and_epi32(bits, huge, bits, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m512 high = _mm512_castsi512_ps(truncated);
  const __m256bh a0 = _mm512_cvtneps_pbh(high);
  const __m512 r1 = _mm512_sub_ps(a, _mm512_cvtpbh_ps(a0));  // exact
  const __m256bh a1 = _mm512_cvtneps_pbh(r1);
  const __m512 r2 = _mm512_sub_ps(r1, _mm512_cvtpbh_ps(a1));  // exact, and at most 8 significant bits
  const __m256bh a2 = _mm512_cvtneps_pbh(r2);                // so this rounding is exact too
  part[0] = reinterpret_cast<const __m256i&>(a0);
  part[1] = reinterpret_cast<const __m256i&>(a1);
  part[2] = reinterpret_cast<const __m256i&>(a2);
}

inline __mmask16 tail_mask16(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? 0 : __mmask16((1u << n) - 1u); }

void split_a(int64_t m, int64_t rows, int64_t k, const float* a, int64_t lda, uint16_t* out, uint8_t* finite) {
  const int64_t steps = padded_k(k) / kDepth;
  for (int64_t g = 0; g < rows; g += 16) {  // a row group: its tiles, one step (3 tiles) at a time
    __mmask16 bad[16] = {};
    const int64_t filled = std::min<int64_t>(16, m - g);  // rows of x in the group (zero after)
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* tiles = out + (g / 16 * steps + s) * 3 * kTile;
      for (int64_t r = 0; r < 16; ++r) {
        if (r >= filled) {
          for (int t = 0; t < 3; ++t) std::memset(tiles + t * kTile + r * kDepth, 0, kDepth * sizeof(uint16_t));
          continue;
        }
        for (int64_t h = 0; h < kDepth; h += 16) {
          const int64_t p = s * kDepth + h;
          __m256i part[3];
          split16(_mm512_maskz_loadu_ps(tail_mask16(k - p), a + (g + r) * lda + p), part, bad[r]);
          for (int t = 0; t < 3; ++t)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(tiles + t * kTile + r * kDepth + h), part[t]);
        }
      }
    }
    for (int64_t r = 0; r < filled; ++r) finite[g + r] = bad[r] == 0;
  }
}

bool pack_b(int64_t k, int64_t cols, const float* w, int64_t ldw, uint16_t* packed) {
  const int64_t kp = padded_k(k), steps = kp / kDepth;
  const int64_t groups = (cols + kCols - 1) / kCols * (kCols / 16);
  __mmask16 bad = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t s = 0; s < steps; ++s) {
      __m512i r[3][16];  // r[part][j]: the 16 pairs of k of column 16g + j
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t col = 16 * g + j, p = s * kDepth;
        if (col >= cols) {
          for (auto& part : r) part[j] = _mm512_setzero_si512();
          continue;
        }
        const float* row = w + col * ldw + p;
        __m256i lo[3], hi[3];
        split16(_mm512_maskz_loadu_ps(tail_mask16(k - p), row), lo, bad);
        split16(_mm512_maskz_loadu_ps(tail_mask16(k - p - 16), row + 16), hi, bad);
        for (int t = 0; t < 3; ++t) r[t][j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[t]), hi[t], 1);
      }
      for (int t = 0; t < 3; ++t) {
        transpose16(r[t]);  // r[t][q]: pair q of the 16 columns
        uint16_t* tile = packed + ((g * steps + s) * 3 + t) * kTile;
        for (int q = 0; q < 16; ++q) _mm512_storeu_si512(tile + q * 32, r[t][q]);
      }
    }
  return bad == 0;
}

// C tiles 0-3 += Σ over the steps of the six products. A: the row block's tiles at a (row group 0;
// group 1 a group further, 3 · steps tiles), B: column groups at b0 and b1 (each step's three part
// tiles consecutive). Each product keeps one operand pair from the one before (14 tile loads a step,
// not 18): a2·b0, a1·b0, a1·b1, a0·b1, a0·b2, a0·b0.
inline void product(const uint16_t* a, const uint16_t* b0, const uint16_t* b1, int64_t steps) {
  const uint16_t* a1 = a + steps * 3 * kTile;
  for (int64_t s = 0; s < steps; ++s, a += 3 * kTile, a1 += 3 * kTile, b0 += 3 * kTile, b1 += 3 * kTile) {
#define TC_QUAD()          \
  _tile_dpbf16ps(0, 4, 6); \
  _tile_dpbf16ps(1, 4, 7); \
  _tile_dpbf16ps(2, 5, 6); \
  _tile_dpbf16ps(3, 5, 7)
    _tile_loadd(4, a + 2 * kTile, 64);  // a2 · b0
    _tile_loadd(5, a1 + 2 * kTile, 64);
    _tile_loadd(6, b0, 64);
    _tile_loadd(7, b1, 64);
    TC_QUAD();
    _tile_loadd(4, a + kTile, 64);  // a1 · b0
    _tile_loadd(5, a1 + kTile, 64);
    TC_QUAD();
    _tile_loadd(6, b0 + kTile, 64);  // a1 · b1
    _tile_loadd(7, b1 + kTile, 64);
    TC_QUAD();
    _tile_loadd(4, a, 64);  // a0 · b1
    _tile_loadd(5, a1, 64);
    TC_QUAD();
    _tile_loadd(6, b0 + 2 * kTile, 64);  // a0 · b2
    _tile_loadd(7, b1 + 2 * kTile, 64);
    TC_QUAD();
    _tile_loadd(6, b0, 64);  // a0 · b0
    _tile_loadd(7, b1, 64);
    TC_QUAD();
#undef TC_QUAD
  }
}

void multiply(int64_t m, int64_t cols, int64_t k, const uint16_t* a, const uint16_t* packed, const float* bias,
              float* c, int64_t ldc) {
  const int64_t kp = padded_k(k), steps = kp / kDepth;
  const int64_t group = steps * 3 * kTile;  // bf16 values of 16 packed columns (or of 16 rows of A)
  alignas(64) float edge[kRows * kCols];    // a step at the bottom or right edge, stored here first
  alignas(64) float edge_bias[kCols];       // the bias of the right edge's columns, zero beyond
  const TileConfig cfg = full_tiles();
  _tile_loadconfig(&cfg);
  for (int64_t j = 0; j < cols; j += kCols) {
    const uint16_t* b0 = packed + (j / 16) * group;
    const int64_t nc = std::min(kCols, cols - j);
    const float* bias_j = bias == nullptr ? nullptr : bias + j;
    if (bias != nullptr && nc < kCols) {
      std::memset(edge_bias, 0, sizeof edge_bias);
      std::memcpy(edge_bias, bias + j, nc * sizeof(float));
      bias_j = edge_bias;
    }
    for (int64_t i = 0; i < m; i += kRows) {
      if (bias_j != nullptr) {  // C starts at the bias: each of the 16 rows loaded from the same 64 bytes
        _tile_loadd(0, bias_j, 0);
        _tile_loadd(1, bias_j + 16, 0);
        _tile_loadd(2, bias_j, 0);
        _tile_loadd(3, bias_j + 16, 0);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      product(a + i * 3 * kp, b0, b0 + group, steps);
      const int64_t rows = std::min(kRows, m - i);
      const bool whole = rows == kRows && nc == kCols;
      float* dst = whole ? c + i * ldc + j : edge;
      const int64_t ld = whole ? ldc : kCols;
      const int64_t stride = ld * static_cast<int64_t>(sizeof(float));
      _tile_stored(0, dst, stride);
      _tile_stored(1, dst + 16, stride);
      _tile_stored(2, dst + 16 * ld, stride);
      _tile_stored(3, dst + 16 * ld + 16, stride);
      if (!whole)
        for (int64_t r = 0; r < rows; ++r) std::memcpy(c + (i + r) * ldc + j, edge + r * kCols, nc * sizeof(float));
    }
  }
  _tile_release();
}

}  // namespace

const Kernels& amx_kernels() {
  static const Kernels k{"amx", split_a, pack_b, multiply};
  return k;
}

}  // namespace transformer_core::kernels::sgemm::split
