// What the AMX kernels (quant_amx.cpp, sgemm_amx.cpp) share: the tile configuration they load, and
// a 16 × 16 transpose of 4-byte words in AVX-512 registers for their tile layouts. Internal
// linkage: each translation unit compiles its own copy under its own ISA flags (quant_common.hpp
// says why).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace transformer_core::kernels {
namespace {

// The tile configuration (palette 1) for ldtilecfg: all eight tiles 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

// Transposes 16 × 16 four-byte words in place: r[o] word p ← r[p] word o. Interleaves pairs of rows
// (32-bit, then 64-bit elements), then moves 128-bit quarters: 64 shuffles.
inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], quarter L: words 4L + c of rows 4i … 4i + 3
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);       // quarter 0 of each u: word c
    r[4 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);   // quarter 1: word 4 + c
    r[8 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);   // quarter 2: word 8 + c
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);  // quarter 3: word 12 + c
  }
}

}  // namespace
}  // namespace transformer_core::kernels
