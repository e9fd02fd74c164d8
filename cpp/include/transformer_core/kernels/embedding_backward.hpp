// Embedding backward: y[r, :] = W[ids[r], :]  ⇒  dW[v, :] (+)= Σ_{r : ids[r] = v} dy[r, :]
//
//   ids: [rows] (int64, each in [0, V))   dy: [rows, H]   dw: [V, H]
//
// A scatter-add, made deterministic without atomics: the task is a block of kEmbeddingGradCols
// columns of H, which walks ALL rows in order and adds each dy[r, block] into dw[ids[r], block].
// Every element of dw is owned by one task and summed in row order, whatever the thread count.
// Rows whose id equals padding_idx add nothing (torch's padding_idx: that row gets no gradient).
#pragma once

#include <algorithm>
#include <cstdint>

namespace transformer_core::kernels {

constexpr int64_t kEmbeddingGradCols = 64;

// Columns [c0, c1) of dw (+)= the scatter of dy by ids.   padding_idx < 0: none.
template <class T>
inline void embedding_backward_cols(const int64_t* ids, const T* dy, int64_t rows, int64_t H, int64_t padding_idx,
                                    int64_t c0, int64_t c1, T* dw) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = ids[r];
    if (id == padding_idx) continue;
    const T* src = dy + r * H;
    T* dst = dw + id * H;
    for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
  }
}

}  // namespace transformer_core::kernels
