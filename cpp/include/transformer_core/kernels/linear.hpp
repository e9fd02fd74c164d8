// The linear layer's kernel (torch's nn.Linear):
//
//   y[m, n] = act(x[m, k] · wᵀ + bias)      x: [m, k]   w: [n, k] (out × in)   bias: [n] or nullptr
//
// Many rows, fp32, on a CPU with AVX2 or AVX-512: our GEMM (sgemm.hpp). Tiles of y (kPackedTileRows
// × kPackedTileCols) are computed in parallel from panels of w shared by all tasks: the first task
// that needs a tile's columns packs them (once per call), the bias is added and the activation
// applied to each tile right after its product, while it is still in cache.
// On the "amx" ISA the same tiles run on AMX (sgemm.hpp, split): x is split into bf16 tiles once
// per call, w into tiles per chunk, and the tiles of y take six bf16 products (fp32's accuracy,
// other bits than the FMA kernels'), starting from the bias; rows of x or columns of w holding Inf
// or NaN take the FMA kernels.
// Many rows otherwise (fp64, other CPUs): parallel over fixed tiles of y (kLinearTileRows ×
// kLinearTileCols), each one single-threaded BLAS GEMM inside our parallel region.
// A few rows (decoding, short sentences): linear_small_rows streams w once (linear_small.hpp).
//
// The tiles do not depend on the thread count and every element is accumulated over k in the same
// order (the FMA tiles: blocks of kLinearDepthBlock, each one chain, added in order), so the result
// is bitwise the same for any number of threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/linear_small.hpp"
#include "transformer_core/kernels/packed_weights.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/sgemm.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::kernels {

constexpr int64_t kLinearTileRows = 64;
constexpr int64_t kLinearTileCols = 512;
// Output features per task of the small-row path: a multiple of its groups of 3 and 4 rows of w,
// long enough for its prefetch of the next rows to run ahead (7 rows of MiniLM: 96 took ~4 % less
// time than 64).
constexpr int64_t kLinearSmallCols = 96;
// Below this many multiply-adds (≈ 10 µs of work) a parallel region costs more than it saves.
constexpr int64_t kLinearSerialMacs = 1 << 18;

// Our GEMM's tiles of y, and the columns of w packed per task. The weight is packed in chunks of
// at most kPackedChunkFloats (8 MiB), so a vocabulary-sized output layer never needs a copy of
// its whole weight.
constexpr int64_t kPackedTileRows = 96;
constexpr int64_t kPackedTileCols = 4 * sgemm::kPanel;
constexpr int64_t kPackedChunkFloats = int64_t(1) << 21;

// The depth of one product of the FMA tiles: a longer k is cut into blocks of kLinearDepthBlock,
// each block's sum taken from 0 and then added to y (sgemm's accumulate). One FMA chain over all
// of k carries a rounding error that grows with k; sums of blocks keep it near the error of one
// block's chain plus that of the k / kLinearDepthBlock additions. Measured against fp64 (outputs of
// size ~3, 33 and 200 rows, Zen 4): k = 4096 1.6–2.2e-6 (one chain: 8.5e-6–9.9e-6), 16384
// 1.7–1.9e-6 (1.6–1.9e-5), 65536 2.0–2.3e-6 (2.9–3.3e-5); torch's 1.0–2.8e-6. k <= 512 (MiniLM's
// 384) is one block: its bits are those of the one chain.
constexpr int64_t kLinearDepthBlock = 512;

// The panels of w's columns [0, cols) for the FMA kernels, a depth block at a time: block
// [p0, p0 + kb) packed as its own k = kb panels, after the blocks before it (at
// packed + sgemm::packed_floats(p0, cols); the same floats in all as one packing of k). w_rows: the
// rows of w (row stride k), column j of the product being row j of w.
inline void pack_depth_blocks(const sgemm::Kernels& kern, int64_t k, int64_t cols, const float* w_rows, float* packed) {
  for (int64_t p0 = 0; p0 < k; p0 += kLinearDepthBlock)
    kern.pack_b(std::min(kLinearDepthBlock, k - p0), cols, w_rows + p0, 1, k, packed + sgemm::packed_floats(p0, cols));
}

// c[rows, cols] (row stride ldc) = a[rows, k] (row stride lda) · the panels of pack_depth_blocks,
// block by block: each block's sum added to c, in the order of the blocks.
inline void multiply_depth_blocks(const sgemm::Kernels& kern, int64_t rows, int64_t cols, int64_t k, const float* a,
                                  int64_t lda, const float* packed, float* c, int64_t ldc) {
  for (int64_t p0 = 0; p0 < k; p0 += kLinearDepthBlock)
    kern.multiply(rows, cols, std::min(kLinearDepthBlock, k - p0), a + p0, lda, 1,
                  packed + sgemm::packed_floats(p0, cols), c, ldc, /*accumulate=*/p0 > 0);
}

// The weight operand of linear_packed and linear_split: w [n, k] in fp32, read in place. Another
// source (GGUF blocks, ops/quantized_linear.cpp) gives the same member: rows(j, cols) returns rows
// [j, j + cols) of w as fp32 with row stride k, decoding them into a scratch of its own if it must
// (called by one task at a time per thread, and used before the next call on that thread).
struct DenseWeight {
  const float* w;
  int64_t k;
  const float* rows(int64_t j, int64_t /*cols*/) const { return w + j * k; }
};

// y = act(x · wᵀ + bias) with our GEMM (m > 0, n > 0, k > 0); w: DenseWeight or another source.
// Inside a PackedWeightScope a DenseWeight of one chunk is packed once per scope (packed_weights.hpp).
template <class Weight>
inline void linear_packed(const sgemm::Kernels& kern, const float* x, int64_t m, int64_t k, const Weight& w,
                          const float* bias, int64_t n, float* y, Activation act, bool serial) {
  const int64_t chunk_cols =
      std::max<int64_t>(kPackedTileCols, kPackedChunkFloats / k / kPackedTileCols * kPackedTileCols);
  const size_t packed_size = sgemm::packed_floats(k, std::min(n, chunk_cols));
  float* packed = nullptr;
  bool packed_before = false;  // the panels of a PackedWeightScope (packed_weights.hpp)
  if constexpr (std::is_same_v<Weight, DenseWeight>) {
    PackedWeightCache* cache = current_packed_weights();
    if (cache != nullptr && n <= chunk_cols) {
      packed = cache->find(w.w, n, k, &kern);
      packed_before = packed != nullptr;
      if (!packed_before) packed = cache->allot(w.w, n, k, &kern, packed_size);
    }
  }
  if (packed == nullptr) packed = workspace<float>(Scratch::kGemmPackedB, packed_size);
  // Whether each column tile of the chunk is packed: kUnpacked → kPacking (one task took it) →
  // kPacked. The task that first needs a tile packs it; another that needs it meanwhile waits.
  enum : uint8_t { kUnpacked, kPacking, kPacked };
  const int64_t max_col_tiles = (std::min(n, chunk_cols) + kPackedTileCols - 1) / kPackedTileCols;
  std::unique_ptr<std::atomic<uint8_t>[]> state(new std::atomic<uint8_t>[max_col_tiles]);
  for (int64_t c0 = 0; c0 < n; c0 += chunk_cols) {
    const int64_t cols = std::min(chunk_cols, n - c0);
    const int64_t col_tiles = (cols + kPackedTileCols - 1) / kPackedTileCols;
    for (int64_t t = 0; t < col_tiles; ++t) state[t].store(packed_before ? kPacked : kUnpacked);
    // w[c0 + j : c0 + j + kPackedTileCols, :]ᵀ into panels at packed + j · k, a depth block at a time
    auto ensure_packed = [&](int64_t ct) {
      std::atomic<uint8_t>& s = state[ct];
      if (s.load(std::memory_order_acquire) == kPacked) return;
      uint8_t expected = kUnpacked;
      if (s.compare_exchange_strong(expected, kPacking, std::memory_order_acq_rel)) {
        const int64_t j = ct * kPackedTileCols, tile_cols = std::min(kPackedTileCols, cols - j);
        pack_depth_blocks(kern, k, tile_cols, w.rows(c0 + j, tile_cols), packed + j * k);
        s.store(kPacked, std::memory_order_release);
        return;
      }
      while (s.load(std::memory_order_acquire) != kPacked) std::this_thread::yield();
    };
    // Tiles of y[:, c0 : c0 + cols], numbered down the columns: each thread's contiguous share of
    // the tasks (parallel_tasks) reads its own part of the packed weight, and packs that part
    // itself, right before its first use, with no wait for the whole weight (a pass of packing
    // tasks, then a barrier, then the products took 1-3 % longer: Emerald Rapids, 2026-11-27).
    // Emerald Rapids, 2 threads, avx512 (bench/gemm.py, 2026-11-26): numbering down the columns took
    // MiniLM QKV 281-295 -> 300 GFLOP/s, SmolLM2 gate/up 202-267 -> 297-298, the other shapes
    // within ±3 %; the same bits.
    const int64_t row_tiles = (m + kPackedTileRows - 1) / kPackedTileRows;
    run_tasks(serial, row_tiles * col_tiles, [&](int64_t task, int) {
      const int64_t ct = task / row_tiles;
      const int64_t r0 = (task % row_tiles) * kPackedTileRows, j = ct * kPackedTileCols;
      const int64_t rows = std::min(kPackedTileRows, m - r0), tile_cols = std::min(kPackedTileCols, cols - j);
      ensure_packed(ct);
      float* yt = y + r0 * n + c0 + j;  // [rows, tile_cols], row stride n
      multiply_depth_blocks(kern, rows, tile_cols, k, x + r0 * k, k, packed + j * k, yt, n);
      for (int64_t i = 0; i < rows; ++i) {
        if (bias != nullptr) add_row(yt + i * n, bias + c0 + j, tile_cols);
        if (act != Activation::kNone) activate(yt + i * n, tile_cols, act);
      }
    });
  }
}

// y = act(x · wᵀ + bias) on AMX tiles (m > 0, n > 0, k > 0): linear_packed's tiles and chunks, with
// x split once (kPackedTileRows rows per task) and w packed per chunk into split tiles. A tile whose
// columns hold an Inf or NaN, and the rows of x that do, are computed by the FMA kernels (fma)
// from an fp32 panel of the tile's columns. w: DenseWeight or another source (as linear_packed).
template <class Weight>
inline void linear_split(const sgemm::split::Kernels& amx, const sgemm::Kernels& fma, const float* x, int64_t m,
                         int64_t k, const Weight& w, const float* bias, int64_t n, float* y, Activation act,
                         bool serial) {
  namespace split = sgemm::split;
  const int64_t kp = split::padded_k(k);
  const int64_t chunk_cols =
      std::max<int64_t>(kPackedTileCols, kPackedChunkFloats / k / kPackedTileCols * kPackedTileCols);
  const int64_t max_col_tiles = (std::min(n, chunk_cols) + kPackedTileCols - 1) / kPackedTileCols;
  uint16_t* a = workspace<uint16_t>(Scratch::kGemmSplitA, 3 * split::padded_rows(m) * kp);
  uint16_t* packed = workspace<uint16_t>(Scratch::kGemmSplitB, split::packed_b_size(k, std::min(n, chunk_cols)));
  uint8_t* finite_rows = workspace<uint8_t>(Scratch::kGemmSplitFinite, m + max_col_tiles);
  uint8_t* finite_cols = finite_rows + m;  // per column tile of the chunk
  const int64_t row_tiles = (m + kPackedTileRows - 1) / kPackedTileRows;
  const int64_t stride = split::packed_b_size(k, kPackedTileCols);  // bf16 values of a packed column tile
  for (int64_t c0 = 0; c0 < n; c0 += chunk_cols) {
    const int64_t cols = std::min(chunk_cols, n - c0);
    const int64_t col_tiles = (cols + kPackedTileCols - 1) / kPackedTileCols;
    // 1. w[c0 : c0 + cols, :]ᵀ into split tiles, kPackedTileCols columns a task; in the first chunk's
    // region also x into tiles of three bf16 parts, kPackedTileRows rows a task (the last one also
    // zeroes the rows up to a multiple of split::kRows): one region, one wait, for both
    const int64_t split_tasks = c0 == 0 ? row_tiles : 0;
    run_tasks(serial, col_tiles + split_tasks, [&](int64_t t, int) {
      if (t < col_tiles) {
        const int64_t j = t * kPackedTileCols, tile_cols = std::min(kPackedTileCols, cols - j);
        finite_cols[t] = amx.pack_b(k, tile_cols, w.rows(c0 + j, tile_cols), k, packed + t * stride);
        return;
      }
      const int64_t r0 = (t - col_tiles) * kPackedTileRows, rows = std::min(kPackedTileRows, m - r0);
      const int64_t fill = r0 + rows == m ? split::padded_rows(m) - r0 : rows;
      amx.split_a(rows, fill, k, x + r0 * k, k, a + 3 * r0 * kp, finite_rows + r0);
    });
    // 2. tiles of y[:, c0 : c0 + cols]
    run_tasks(serial, row_tiles * col_tiles, [&](int64_t task, int) {
      const int64_t ct = task % col_tiles, r0 = (task / col_tiles) * kPackedTileRows, j = ct * kPackedTileCols;
      const int64_t rows = std::min(kPackedTileRows, m - r0), tile_cols = std::min(kPackedTileCols, cols - j);
      float* yt = y + r0 * n + c0 + j;  // [rows, tile_cols], row stride n
      const float* bias_t = bias != nullptr ? bias + c0 + j : nullptr;
      if (finite_cols[ct]) amx.multiply(rows, tile_cols, k, a + 3 * r0 * kp, packed + ct * stride, bias_t, yt, n);
      float* panel = nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        if (!finite_cols[ct] || !finite_rows[r0 + i]) {
          if (panel == nullptr) {
            panel = workspace<float>(Scratch::kGemmSplitFallback, sgemm::packed_floats(k, tile_cols));
            pack_depth_blocks(fma, k, tile_cols, w.rows(c0 + j, tile_cols), panel);
          }
          multiply_depth_blocks(fma, 1, tile_cols, k, x + (r0 + i) * k, k, panel, yt + i * n, n);
          if (bias_t != nullptr) add_row(yt + i * n, bias_t, tile_cols);
        }
        if (act != Activation::kNone) activate(yt + i * n, tile_cols, act);
      }
    });
  }
}

template <class T>
inline void linear(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t n, T* y,
                   Activation act = Activation::kNone) {
  if (m == 0 || n == 0) return;
  // rows × cols tile of y at yt (row stride n): y = act(y)
  auto activate_tile = [&](T* yt, int64_t rows, int64_t cols) {
    if (act == Activation::kNone) return;
    for (int64_t i = 0; i < rows; ++i) activate(yt + i * n, cols, act);
  };
  const bool serial = m * n * k < kLinearSerialMacs;
  if (m <= kSmallRows && k > 0) {
    const int64_t chunks = (n + kLinearSmallCols - 1) / kLinearSmallCols;
    auto chunk = [&](int64_t c, int) {
      const int64_t c0 = c * kLinearSmallCols, c1 = std::min(n, c0 + kLinearSmallCols);
      linear_small_rows(x, m, k, w, bias, c0, c1, n, y);
      activate_tile(y + c0, m, c1 - c0);
    };
    run_tasks(serial, chunks, chunk);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (k > 0)
      if (const sgemm::Kernels* kern = sgemm::active()) {
        if (const sgemm::split::Kernels* amx = sgemm::split::active())
          return linear_split(*amx, *kern, x, m, k, DenseWeight{w, k}, bias, n, y, act, serial);
        return linear_packed(*kern, x, m, k, DenseWeight{w, k}, bias, n, y, act, serial);
      }
  }
  const int64_t row_tiles = (m + kLinearTileRows - 1) / kLinearTileRows;
  const int64_t col_tiles = (n + kLinearTileCols - 1) / kLinearTileCols;
  auto tile = [&](int64_t task, int) {
    const int64_t r0 = (task / col_tiles) * kLinearTileRows, c0 = (task % col_tiles) * kLinearTileCols;
    const int64_t rows = std::min(kLinearTileRows, m - r0), cols = std::min(kLinearTileCols, n - c0);
    T* yt = y + r0 * n + c0;  // [rows, cols], row stride n
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) yt[i * n + j] = bias != nullptr ? bias[c0 + j] : T(0);
    // yt += x[r0 : r0+rows, :] · w[c0 : c0+cols, :]ᵀ
    if (k > 0) gemm(false, true, rows, cols, k, T(1), x + r0 * k, k, w + c0 * k, k, T(1), yt, n);
    activate_tile(yt, rows, cols);
  };
  run_tasks(serial, row_tiles * col_tiles, tile);  // same tiles either way, same result
}

}  // namespace transformer_core::kernels
