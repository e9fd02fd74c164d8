#include "transformer_core/ops/backward.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "transformer_core/kernels/cross_entropy.hpp"
#include "transformer_core/kernels/dropout.hpp"
#include "transformer_core/kernels/embedding_backward.hpp"
#include "transformer_core/kernels/linear_backward.hpp"
#include "transformer_core/kernels/norm_backward.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
void check_nonnegative(int64_t v, const char* what) {
  if (v < 0) throw std::invalid_argument(std::string(what) + " must be >= 0, got " + str(v));
}
// Rows per task so that a task holds ~16K elements: small inputs stay serial.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }
constexpr int64_t kElementGrain = 32768;
// Rows per chunk of the norms' dweight / dbias sums (see norm_backward_rows): at least
// kNormGradRows, and more when the rows would make over kNormGradChunks chunks, so that the partial
// sums stay a small buffer ([chunks, n] doubles) however many rows come.
constexpr int64_t kNormGradRows = 32;
constexpr int64_t kNormGradChunks = 256;

// The rows of a norm's backward: row(r, scratch) writes dx of row r and returns its (shift, scale)
// (LayerNorm: mean, rstd; RMSNorm: 0, r), from which dw, db (when given) take the row's terms:
//   dw_j (+)= Σ_r dy[r, j] · (x[r, j] - shift_r) · scale_r,   db_j (+)= Σ_r dy[r, j]
// The rows go in chunks of kNormGradRows or more, cut by the shape alone; each chunk sums its rows into its
// own partial sums while the row is in cache, and the partials are added in chunk order, so the
// result does not depend on the thread count. A second pass over the columns after the rows read
// x and dy again from memory: LayerNorm's backward of (1024, 768) took 1,210 µs that way and 1,085
// this way in float, 1,870 and 1,510 in double (one thread, Emerald Rapids). scratch: [2n] doubles
// of the task's own for rows up to kernels::kNormRowScratch (layer_norm_backward_row keeps g and x̂
// there), else nullptr.
template <class T, class Row>
void norm_backward_rows(const T* x, const T* dy, int64_t rows, int64_t n, T* dw, T* db, bool accumulate,
                        const Row& row) {
  const size_t scratch_size = n <= kernels::kNormRowScratch ? static_cast<size_t>(2 * n) : 0;
  if (dw == nullptr && db == nullptr) {
    kernels::parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
      std::vector<double> scratch(scratch_size);
      for (int64_t r = b; r < e; ++r) row(r, scratch_size > 0 ? scratch.data() : nullptr);
    });
    return;
  }
  const int64_t chunk_rows = std::max(kNormGradRows, (rows + kNormGradChunks - 1) / kNormGradChunks);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  // the partial sums, before the region: a size this machine cannot hold is a ValueError, not a
  // bad_alloc on a worker thread
  require_allocatable(checked_product({(dw != nullptr) + (db != nullptr), chunks, n}, "x"), sizeof(double),
                      "x: the partial sums of grad_weight and grad_bias ([rows / 32 up to 256, n] doubles each)");
  std::vector<double> part_w(dw != nullptr ? static_cast<size_t>(chunks * n) : 0);  // [chunks, n], zeros
  std::vector<double> part_b(db != nullptr ? static_cast<size_t>(chunks * n) : 0);
  double* pw = dw != nullptr ? part_w.data() : nullptr;
  double* pb = db != nullptr ? part_b.data() : nullptr;
  kernels::parallel_for(0, chunks, std::max<int64_t>(1, row_grain(n) / chunk_rows), [&](int64_t b, int64_t e) {
    std::vector<double> scratch(scratch_size);
    for (int64_t c = b; c < e; ++c)
      for (int64_t r = c * chunk_rows; r < std::min(rows, (c + 1) * chunk_rows); ++r) {
        const auto [shift, scale] = row(r, scratch_size > 0 ? scratch.data() : nullptr);
        kernels::norm_param_grad_row(x + r * n, dy + r * n, n, shift, scale, pw ? pw + c * n : nullptr,
                                     pb ? pb + c * n : nullptr);
      }
  });
  for (int64_t c = 1; c < chunks; ++c)  // the chunks in order, into the first one
    for (int64_t j = 0; j < n; ++j) {
      if (pw != nullptr) pw[j] += pw[c * n + j];
      if (pb != nullptr) pb[j] += pb[c * n + j];
    }
  for (int64_t j = 0; j < n; ++j) {
    if (dw != nullptr) dw[j] = static_cast<T>(accumulate ? dw[j] + pw[j] : pw[j]);
    if (db != nullptr) db[j] = static_cast<T>(accumulate ? db[j] + pb[j] : pb[j]);
  }
}
}  // namespace

Reduction parse_reduction(const std::string& name) {
  if (name == "mean") return Reduction::kMean;
  if (name == "sum") return Reduction::kSum;
  if (name == "none") return Reduction::kNone;
  throw std::invalid_argument("reduction: expected 'mean', 'sum' or 'none', got '" + name + "'");
}

template <class T>
void linear_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t in, int64_t out, T* dx, T* dw, T* db,
                     bool accumulate, bool w_in_out) {
  check_nonnegative(rows, "linear_backward: rows");
  check_nonnegative(in, "linear_backward: in_features");
  check_nonnegative(out, "linear_backward: out_features");
  kernels::linear_backward(x, dy, w, rows, in, out, dx, dw, db, accumulate, w_in_out);
}

template <class T>
void layer_norm_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t n, double eps, T* dx, T* dw,
                         T* db, bool accumulate) {
  check_nonnegative(rows, "layer_norm_backward: rows");
  if (n <= 0) throw std::invalid_argument("layer_norm_backward: normalized size must be >= 1, got " + str(n));
  if (!(eps >= 0)) throw std::invalid_argument("layer_norm_backward: eps must be >= 0, got " + std::to_string(eps));
  if (w == nullptr && dw != nullptr)
    throw std::invalid_argument("layer_norm_backward: grad_weight given for a LayerNorm without weight");
  norm_backward_rows(x, dy, rows, n, dw, db, accumulate, [&](int64_t r, double* scratch) {
    double mean = 0, rstd = 0;
    kernels::layer_norm_stats(x + r * n, n, eps, mean, rstd);
    kernels::layer_norm_backward_row(x + r * n, dy + r * n, w, n, mean, rstd, dx + r * n, scratch);
    return std::pair<double, double>(mean, rstd);
  });
}

template <class T>
void rms_norm_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t n, double eps, T* dx, T* dw,
                       bool accumulate) {
  check_nonnegative(rows, "rms_norm_backward: rows");
  if (n <= 0) throw std::invalid_argument("rms_norm_backward: normalized size must be >= 1, got " + str(n));
  if (!(eps >= 0)) throw std::invalid_argument("rms_norm_backward: eps must be >= 0, got " + std::to_string(eps));
  if (w == nullptr && dw != nullptr)
    throw std::invalid_argument("rms_norm_backward: grad_weight given for an RMSNorm without weight");
  norm_backward_rows(x, dy, rows, n, dw, static_cast<T*>(nullptr), accumulate, [&](int64_t r, double*) {
    const double rstd = kernels::rms_norm_rstd(x + r * n, n, eps);
    kernels::rms_norm_backward_row(x + r * n, dy + r * n, w, n, rstd, dx + r * n);
    return std::pair<double, double>(0.0, rstd);
  });
}

template <class T>
void activation_backward(const T* x, const T* dy, int64_t n, Activation act, T* dx) {
  check_nonnegative(n, "activation_backward: size");
  kernels::parallel_for(0, n, kElementGrain,
                        [&](int64_t b, int64_t e) { kernels::activation_backward(x + b, dy + b, e - b, act, dx + b); });
}

template <class T>
void glu_backward(const T* gate, const T* up, const T* dh, int64_t n, Activation act, T* d_gate, T* d_up) {
  check_nonnegative(n, "glu_backward: size");
  kernels::parallel_for(0, n, kElementGrain, [&](int64_t b, int64_t e) {
    kernels::glu_backward(gate + b, up + b, dh + b, e - b, act, d_gate + b, d_up + b);
  });
}

template <class T>
void gated_activation_backward(const T* gate, const T* up, int64_t rows, int64_t F, int64_t ld, const T* dh,
                               Activation act, T* d_gate, T* d_up, int64_t d_ld) {
  check_nonnegative(rows, "gated_activation_backward: rows");
  check_nonnegative(F, "gated_activation_backward: features");
  if (ld < F || d_ld < F)
    throw std::invalid_argument("gated_activation_backward: row strides (" + str(ld) + ", " + str(d_ld) +
                                ") must be >= the features (" + str(F) + ")");
  kernels::parallel_for(0, rows, row_grain(F), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels::glu_backward(gate + r * ld, up + r * ld, dh + r * F, F, act, d_gate + r * d_ld, d_up + r * d_ld);
  });
}

template <class T>
void softmax_backward(const T* p, const T* dp, int64_t rows, int64_t n, T* dx) {
  check_nonnegative(rows, "softmax_backward: rows");
  check_nonnegative(n, "softmax_backward: n");
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::softmax_backward_row(p + r * n, dp + r * n, n, dx + r * n);
  });
}

template <class T>
void embedding_backward(const int64_t* ids, const T* dy, int64_t rows, int64_t V, int64_t H, int64_t padding_idx,
                        T* dw, bool accumulate) {
  check_nonnegative(rows, "embedding_backward: rows");
  check_nonnegative(V, "embedding_backward: num_embeddings");
  check_nonnegative(H, "embedding_backward: embedding_dim");
  for (int64_t r = 0; r < rows; ++r)
    if (ids[r] < 0 || ids[r] >= V)
      throw std::invalid_argument("embedding_backward: ids must be in [0, " + str(V) + "), got " + str(ids[r]) +
                                  " at flat position " + str(r));
  if (!accumulate)
    kernels::parallel_for(0, V, row_grain(H), [&](int64_t b, int64_t e) { std::fill(dw + b * H, dw + e * H, T(0)); });
  const int64_t blocks = (H + kernels::kEmbeddingGradCols - 1) / kernels::kEmbeddingGradCols;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, rows * kernels::kEmbeddingGradCols));
  kernels::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kernels::kEmbeddingGradCols, c1 = std::min(H, c0 + kernels::kEmbeddingGradCols);
      kernels::embedding_backward_cols(ids, dy, rows, H, padding_idx, c0, c1, dw);
    }
  });
}

template <class T>
void rotary_backward(T* d, int64_t rows, int64_t head_dim, const T* cos, const T* sin, int64_t table_rows,
                     RotaryLayout layout) {
  check_nonnegative(rows, "rotary_backward: rows");
  if (head_dim < 2 || head_dim % 2 != 0)
    throw std::invalid_argument("rotary_backward: head_dim must be even and >= 2, got " + str(head_dim));
  if (rows == 0) return;
  if (table_rows < 1 || rows % table_rows != 0)
    throw std::invalid_argument("rotary_backward: rows (" + str(rows) + ") must be a multiple of the cos/sin table's rows (" +
                                str(table_rows) + ")");
  const int64_t half = head_dim / 2;
  const int64_t width = layout == RotaryLayout::kHalf ? head_dim : half;
  kernels::parallel_for(0, rows, row_grain(head_dim), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = r % table_rows;
      if (layout == RotaryLayout::kHalf)
        kernels::rotary_half_row_backward(d + r * head_dim, half, cos + t * width, sin + t * width);
      else
        kernels::rotary_interleaved_row_backward(d + r * head_dim, half, cos + t * width, sin + t * width);
    }
  });
}

template <class T>
void dropout(const T* x, T* y, int64_t n, double p, uint64_t seed) {
  check_nonnegative(n, "dropout: size");
  if (!(p >= 0.0 && p <= 1.0)) throw std::invalid_argument("dropout: p must be in [0, 1], got " + std::to_string(p));
  if (p == 1.0) {  // everything dropped (torch: zeros)
    kernels::parallel_for(0, n, kElementGrain, [&](int64_t b, int64_t e) { std::fill(y + b, y + e, T(0)); });
    return;
  }
  const T scale = T(1) / static_cast<T>(1.0 - p);  // torch: noise = 1 / (1 - p) in the tensor's dtype
  const uint64_t threshold = kernels::dropout_threshold(p);
  kernels::parallel_for(0, n, kElementGrain,
                        [&](int64_t b, int64_t e) { kernels::dropout_apply(x, y, b, e, seed, threshold, scale); });
}

template <class T>
double cross_entropy(const T* logits, const int64_t* target, int64_t rows, int64_t V, int64_t ignore_index,
                     double label_smoothing, Reduction reduction, double grad_scale, const T* grad_rows, T* loss_rows,
                     T* dlogits, int64_t* num_valid) {
  check_nonnegative(rows, "cross_entropy: rows");
  if (V < 1 && rows > 0) throw std::invalid_argument("cross_entropy: the number of classes must be >= 1, got " + str(V));
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    throw std::invalid_argument("cross_entropy: label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = target[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= V)
      throw std::invalid_argument("cross_entropy: target must be in [0, " + str(V) + ") or ignore_index (" +
                                  str(ignore_index) + "), got " + str(t) + " at flat position " + str(r));
    ++valid;
  }
  if (num_valid != nullptr) *num_valid = valid;
  // Per-row weight of the gradient: mean → grad_scale / #valid, sum → grad_scale, none → grad_rows[r].
  const double w_all = reduction == Reduction::kMean ? (valid > 0 ? grad_scale / static_cast<double>(valid) : 0.0)
                                                     : grad_scale;
  std::vector<double> losses(static_cast<size_t>(rows));
  kernels::parallel_for(0, rows, row_grain(V), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = target[r];
      T* dx = dlogits != nullptr ? dlogits + r * V : nullptr;
      if (t == ignore_index) {
        losses[r] = 0.0;
        if (dx != nullptr) std::fill(dx, dx + V, T(0));
        continue;
      }
      const double w = reduction == Reduction::kNone && grad_rows != nullptr ? static_cast<double>(grad_rows[r]) : w_all;
      losses[r] = kernels::cross_entropy_row(logits + r * V, V, t, label_smoothing, w, dx);
    }
  });
  double total = 0;  // in row order: the same sum for any thread count
  for (int64_t r = 0; r < rows; ++r) total += losses[r];
  if (loss_rows != nullptr)
    for (int64_t r = 0; r < rows; ++r) loss_rows[r] = static_cast<T>(losses[r]);
  if (reduction == Reduction::kMean) return valid > 0 ? total / static_cast<double>(valid) : 0.0;
  return total;
}

template <class T>
void scaled_dot_product_attention_backward(const AttentionBackwardArgs<T>& b) {
  const auto& a = b.fwd;
  if (a.batch < 0 || a.num_heads < 1 || a.num_kv_heads < 1 || a.q_len < 0 || a.kv_len < 0 || a.head_dim < 0 ||
      a.v_head_dim < 0)
    throw std::invalid_argument("scaled_dot_product_attention_backward: invalid sizes N=" + str(a.batch) +
                                " H=" + str(a.num_heads) + " H_kv=" + str(a.num_kv_heads) + " L=" + str(a.q_len) +
                                " S=" + str(a.kv_len) + " D=" + str(a.head_dim) + " Dv=" + str(a.v_head_dim));
  if (a.num_heads % a.num_kv_heads != 0)
    throw std::invalid_argument("scaled_dot_product_attention_backward: num_heads (" + str(a.num_heads) +
                                ") must be a multiple of num_kv_heads (" + str(a.num_kv_heads) + ")");
  kernels::attention_backward(b);
}

#define TC_INSTANTIATE(T)                                                                                        \
  template void linear_backward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*, T*, T*, bool, bool); \
  template void layer_norm_backward<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, T*, T*, bool);    \
  template void rms_norm_backward<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, T*, bool);         \
  template void activation_backward<T>(const T*, const T*, int64_t, Activation, T*);                           \
  template void glu_backward<T>(const T*, const T*, const T*, int64_t, Activation, T*, T*);                    \
  template void softmax_backward<T>(const T*, const T*, int64_t, int64_t, T*);                                     \
  template void gated_activation_backward<T>(const T*, const T*, int64_t, int64_t, int64_t, const T*, Activation,  \
                                             T*, T*, int64_t);                                                     \
  template void embedding_backward<T>(const int64_t*, const T*, int64_t, int64_t, int64_t, int64_t, T*, bool);      \
  template void rotary_backward<T>(T*, int64_t, int64_t, const T*, const T*, int64_t, RotaryLayout);               \
  template void dropout<T>(const T*, T*, int64_t, double, uint64_t);                                               \
  template double cross_entropy<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, double, Reduction, double, \
                                   const T*, T*, T*, int64_t*);                                                    \
  template void scaled_dot_product_attention_backward<T>(const AttentionBackwardArgs<T>&);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
