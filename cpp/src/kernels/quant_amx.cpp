// The int8 product on AMX tiles (Intel Sapphire Rapids and later): tdpbssd multiplies a 16 × 64 tile
// of signed bytes by a 64 × 16 one and adds the 16 × 16 int32 products into a third, 16,384
// multiply-adds per instruction where vpdpbusd does 64. Everything else of this ISA's table is the
// avx512vnni one. Compiled with the AVX-512 flags plus AMX-TILE and AMX-INT8 (CMakeLists.txt), and
// only called when the CPU has them and Linux has granted this process the tile state
// (quant_dispatch.cpp).
//
// The roles. The weights w [out, k] are row-major int8, which is the layout of the tile that
// tdpbssd takes first (A: 16 rows × 64 bytes), so they are loaded in place, 16 output features × 64
// values of k at a time. The second tile (B) holds 16 x rows in the "VNNI" layout: its row q is
// four consecutive values of k of each of the 16 x rows, x[n, 4q : 4q + 4] at bytes 4n .. 4n + 3.
// That is a 16 × 16 transpose of 4-byte words of the x rows, done once per 32 rows of x (and reused
// for every output feature of the rectangle). The result C [feature m, x row n] is transposed back
// in the epilogue.
//
//   C[m, n] += Σ_{q<16} Σ_{t<4} w[j + m, 64s + 4q + t] · x[i + n, 64s + 4q + t]     (step s of k)
//
// Signed × signed: no shift by 128 to undo, the sum is Σ w·x itself, exact in int32 (k <= kInt8MaxK).
// The epilogue is kernels.hpp's: y = float(acc) · (sx · sw) + bias, the same operations in the same
// order as every other ISA, so the bits are the same.
//
// Edges. Beyond k the x rows are zero (zero-padded to ldq, a multiple of 64), so a weight tile may
// hold anything there; but a weight row's last 64-byte step may run past the end of the matrix, and
// a group of fewer than 16 features past its last row. Those tiles come from a zero-padded copy.
// Missing x rows are zeros in the packed tile; outputs outside the rectangle are never written.

// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (_mm*_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "quant_common.hpp"
#include "amx_tiles.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"

namespace transformer_core::kernels::quant {
namespace {

constexpr int64_t kGroup = 16;   // rows of a tile: output features (A) or x rows (B, C)
constexpr int64_t kStep = 64;    // bytes of k per tile row
constexpr int64_t kTileBytes = kGroup * kStep;
// Fewer x rows than this go to the avx512vnni kernel: it streams each weight row once, where a tile
// would be mostly zero padding.
constexpr int64_t kMinRows = 9;

// The tiles (full_tiles(), amx_tiles.hpp: all eight 16 rows × 64 bytes):
//   tmm0-3  C, int32 accumulators: (feature group a, x group b) in tmm(2a + b)
//   tmm4-5  A, weight groups 0, 1
//   tmm6-7  B, packed x groups 0, 1

// x rows [i, i + n) (n <= 16) of xq [*, ldq] → B tiles, one per step of k: out + s · kTileBytes.
// Rows past n are zeros.
inline void pack_x_group(const int8_t* xq, int64_t ldq, int64_t n, int64_t steps, int8_t* out) {
  for (int64_t s = 0; s < steps; ++s) {
    __m512i r[16];
    for (int64_t p = 0; p < kGroup; ++p)
      r[p] = p < n ? _mm512_loadu_si512(xq + p * ldq + s * kStep) : _mm512_setzero_si512();
    transpose16(r);
    for (int q = 0; q < 16; ++q) _mm512_store_si512(out + s * kTileBytes + q * kStep, r[q]);
  }
}

// Where the A tile (weight group g, step s) of a rectangle lives: in place, or in the zero-padded
// copies of the last partial step (tail) and of a last group of fewer than 16 features (part).
struct WeightTiles {
  const int8_t* w;       // the rectangle's first feature row
  int64_t k;
  int64_t full_steps;    // steps whose 64 bytes lie inside every row
  int64_t full_groups;   // groups of 16 features inside the rectangle
  const int8_t* tail;    // [full_groups · 16, 64]: bytes 64 · full_steps … k of each row, then zeros
  const int8_t* part;    // [16, part_stride]: the partial group's rows, zero-padded both ways
  int64_t part_stride;   // steps · 64

  const int8_t* at(int64_t g, int64_t s, int64_t& stride) const {
    if (g >= full_groups) {
      stride = part_stride;
      return part + s * kStep;
    }
    if (s < full_steps) {
      stride = k;
      return w + g * kGroup * k + s * kStep;
    }
    stride = kStep;
    return tail + g * kTileBytes;
  }
};

// One rectangle of AG feature groups × BG x groups over all steps of k: C tiles zeroed, then one
// tdpbssd per pair a step. Tile numbers are immediates, hence the template.
template <int AG, int BG>
inline void multiply(const WeightTiles& wt, int64_t g0, const int8_t* xp, int64_t steps, int32_t* c) {
  _tile_zero(0);
  if constexpr (BG > 1) _tile_zero(1);
  if constexpr (AG > 1) _tile_zero(2);
  if constexpr (AG > 1 && BG > 1) _tile_zero(3);
  const int64_t b_stride = steps * kTileBytes;  // from x group 0 to group 1
  for (int64_t s = 0; s < steps; ++s) {
    int64_t lda0 = 0, lda1 = 0;
    _tile_loadd(4, wt.at(g0, s, lda0), lda0);
    if constexpr (AG > 1) _tile_loadd(5, wt.at(g0 + 1, s, lda1), lda1);
    _tile_loadd(6, xp + s * kTileBytes, kStep);
    if constexpr (BG > 1) _tile_loadd(7, xp + b_stride + s * kTileBytes, kStep);
    _tile_dpbssd(0, 4, 6);
    if constexpr (BG > 1) _tile_dpbssd(1, 4, 7);
    if constexpr (AG > 1) _tile_dpbssd(2, 5, 6);
    if constexpr (AG > 1 && BG > 1) _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, c, kStep);
  if constexpr (BG > 1) _tile_stored(1, c + 256, kStep);
  if constexpr (AG > 1) _tile_stored(2, c + 512, kStep);
  if constexpr (AG > 1 && BG > 1) _tile_stored(3, c + 768, kStep);
}

// y[i + n, j + m] = float(C[m, n]) · (sx[i + n] · sw[j + m]) + bias[j + m], for n < rows, m < cols
// (with accumulate: y[i + n, j + m] + that).
inline void epilogue(const int32_t* c, const Int8Args& a, int64_t i, int64_t rows, int64_t j, int64_t cols) {
  __m512i r[16];
  for (int m = 0; m < 16; ++m) r[m] = _mm512_load_si512(c + m * 16);
  transpose16(r);  // r[n]: the 16 features of x row i + n
  const __mmask16 mk = static_cast<__mmask16>((1u << cols) - 1u);
  const __m512 sw = _mm512_maskz_loadu_ps(mk, a.sw + j);
  const __m512 bias = a.bias != nullptr ? _mm512_maskz_loadu_ps(mk, a.bias + j) : _mm512_setzero_ps();
  for (int64_t n = 0; n < rows; ++n) {
    const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(a.sx[i + n]), sw);
    __m512 out = _mm512_mul_ps(_mm512_cvtepi32_ps(r[n]), sc);
    if (a.bias != nullptr) out = _mm512_add_ps(out, bias);
    float* dst = a.y + (i + n) * a.ldy + j;
    if (a.accumulate) out = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, dst), out);
    _mm512_mask_storeu_ps(dst, mk, out);
  }
}

void linear_int8(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* xsum, int64_t i0, int64_t i1,
                 int64_t k, const int8_t* w, const float* sw, const float* bias, int64_t j0, int64_t j1, float* y,
                 int64_t ldy, bool accumulate) {
  if (i1 - i0 < kMinRows || j1 <= j0) {
    avx512vnni_kernels().linear_int8(xq, ldq, sx, xsum, i0, i1, k, w, sw, bias, j0, j1, y, ldy, accumulate);
    return;
  }
  const Int8Args a{xq, ldq, sx, xsum, k, w, sw, bias, y, ldy, accumulate};
  const int64_t steps = (k + kStep - 1) / kStep;
  const int64_t cols = j1 - j0, full_groups = cols / kGroup, groups = (cols + kGroup - 1) / kGroup;
  const int64_t full_steps = k / kStep;

  // One buffer: the packed x of 2 groups, the weights' tail copy, the partial group's copy, C.
  const size_t x_bytes = static_cast<size_t>(2 * steps * kTileBytes);
  const size_t tail_bytes = static_cast<size_t>(full_groups * kTileBytes);
  const size_t part_bytes = static_cast<size_t>(steps * kTileBytes);
  const size_t c_bytes = 4 * 256 * sizeof(int32_t);
  const size_t total = x_bytes + tail_bytes + part_bytes + c_bytes;
  auto* buf = static_cast<int8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
  if (buf == nullptr) {  // no memory for the copies: the avx512vnni kernel needs none (same bits)
    avx512vnni_kernels().linear_int8(xq, ldq, sx, xsum, i0, i1, k, w, sw, bias, j0, j1, y, ldy, accumulate);
    return;
  }
  int8_t* xp = buf;
  int8_t* tail = xp + x_bytes;
  int8_t* part = tail + tail_bytes;
  auto* c = reinterpret_cast<int32_t*>(part + part_bytes);

  const int8_t* wr = w + j0 * k;
  if (full_steps < steps) {
    std::memset(tail, 0, tail_bytes);
    for (int64_t m = 0; m < full_groups * kGroup; ++m)
      std::memcpy(tail + m * kStep, wr + m * k + full_steps * kStep, static_cast<size_t>(k - full_steps * kStep));
  }
  if (full_groups < groups) {
    std::memset(part, 0, part_bytes);
    for (int64_t m = 0; m < cols - full_groups * kGroup; ++m)
      std::memcpy(part + m * steps * kStep, wr + (full_groups * kGroup + m) * k, static_cast<size_t>(k));
  }
  const WeightTiles wt{wr, k, full_steps, full_groups, tail, part, steps * kStep};

  const TileConfig cfg = full_tiles();
  _tile_loadconfig(&cfg);
  for (int64_t i = i0; i < i1; i += 2 * kGroup) {
    const int64_t rows = imin(2 * kGroup, i1 - i);
    const int64_t bg = rows > kGroup ? 2 : 1;
    for (int64_t b = 0; b < bg; ++b)
      pack_x_group(xq + (i + b * kGroup) * ldq, ldq, imin(kGroup, rows - b * kGroup), steps,
                   xp + b * steps * kTileBytes);
    for (int64_t g = 0; g < groups; g += 2) {
      const int64_t ag = groups - g > 1 ? 2 : 1;
      if (ag == 2 && bg == 2) multiply<2, 2>(wt, g, xp, steps, c);
      else if (ag == 2) multiply<2, 1>(wt, g, xp, steps, c);
      else if (bg == 2) multiply<1, 2>(wt, g, xp, steps, c);
      else multiply<1, 1>(wt, g, xp, steps, c);
      for (int64_t ga = 0; ga < ag; ++ga)
        for (int64_t gb = 0; gb < bg; ++gb)
          epilogue(c + (2 * ga + gb) * 256, a, i + gb * kGroup, imin(kGroup, rows - gb * kGroup),
                   j0 + (g + ga) * kGroup, imin(kGroup, cols - (g + ga) * kGroup));
    }
  }
  _tile_release();
  std::free(buf);
}

}  // namespace

const KernelTable& amx_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx512vnni_kernels();
    t.isa = Isa::kAmx;
    t.linear_int8 = linear_int8;
    t.pack_int8 = nullptr;  // many rows run on the tiles (linear_int8 above)
    t.linear_int8_packed = nullptr;
    t.int8_tile_rows = 2 * kGroup;
    t.int8_tile_cols = 768;
    return t;
  }();
  return table;
}

}  // namespace transformer_core::kernels::quant
