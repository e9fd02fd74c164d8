// The linear layer's kernel (torch's nn.Linear):
//
//   y[m, n] = act(x[m, k] · wᵀ + bias)      x: [m, k]   w: [n, k] (out × in)   bias: [n] or nullptr
//
// Many rows: parallel over fixed tiles of y (kLinearTileRows × kLinearTileCols), each one
// single-threaded GEMM inside our parallel region, the bias written first and the activation applied
// to the tile right after its product, while it is still in cache (no extra pass over memory).
// A few rows (decoding, short sentences): linear_small_rows streams w once (linear_small.hpp).
//
// The tiles do not depend on the thread count and every element is accumulated over k in the same
// order, so the result is bitwise the same for any number of threads.
#pragma once

#include <algorithm>
#include <cstdint>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/linear_small.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

constexpr int64_t kLinearTileRows = 64;
constexpr int64_t kLinearTileCols = 512;
// Output features per task of the small-row path.
constexpr int64_t kLinearSmallCols = 64;
// Below this many multiply-adds (≈ 10 µs of work) a parallel region costs more than it saves.
constexpr int64_t kLinearSerialMacs = 1 << 18;

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
    if (serial) {
      for (int64_t c = 0; c < chunks; ++c) chunk(c, 0);
    } else {
      parallel_tasks(chunks, chunk);
    }
    return;
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
  if (serial) {
    for (int64_t t = 0; t < row_tiles * col_tiles; ++t) tile(t, 0);  // same tiles, same result
  } else {
    parallel_tasks(row_tiles * col_tiles, tile);
  }
}

}  // namespace transformer_core::kernels
