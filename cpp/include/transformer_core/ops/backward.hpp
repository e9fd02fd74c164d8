// Training ops: the backward of every forward op, and the forwards that only training needs
// (RMSNorm, SiLU, gated units, dropout, cross-entropy). Each checks its sizes (std::invalid_argument
// naming the argument, expected vs got; the bindings turn it into ValueError), then runs its kernel
// in parallel. Every op takes raw, C-contiguous buffers; float and double are instantiated.
//
// Determinism: every reduction over rows (dW, db, dweight, the embedding scatter, dK/dV, the loss)
// is owned by one task and summed in a fixed order, so results are bitwise the same for any thread
// count.
#pragma once

#include <cstdint>
#include <string>

#include "transformer_core/kernels/attention_backward.hpp"
#include "transformer_core/kernels/elementwise_backward.hpp"
#include "transformer_core/ops/positional.hpp"

namespace transformer_core::ops {

using kernels::Activation;
using kernels::AttentionBackwardArgs;

// y = x · Wᵀ + b:   dx = dy · W,   dw (+)= dyᵀ · x,   db (+)= Σ_rows dy
//   x: [rows, in]   dy: [rows, out]   w: [out, in] (or [in, out] with w_in_out: y = x · W + b)
//   dx: [rows, in] or nullptr   dw: like w, or nullptr   db: [out] or nullptr
// accumulate: add into dw, db instead of overwriting them (dx is always overwritten).
template <class T>
void linear_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t in, int64_t out, T* dx, T* dw, T* db,
                     bool accumulate, bool w_in_out);

// LayerNorm over the last dim (mean and rstd recomputed from x, in double):
//   x, dy, dx: [rows, n]   w: [n] or nullptr (no affine: then dw, db must be nullptr)   dw, db: [n] or nullptr
template <class T>
void layer_norm_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t n, double eps, T* dx, T* dw,
                         T* db, bool accumulate);

// RMSNorm (y = x / sqrt(mean(x²) + eps) · w; its forward is ops/norm.hpp):
//   x, dy, dx: [rows, n]   w: [n] or nullptr   dw: [n] or nullptr
template <class T>
void rms_norm_backward(const T* x, const T* dy, const T* w, int64_t rows, int64_t n, double eps, T* dx, T* dw,
                       bool accumulate);

// dx = dy · act'(x), element-wise over n values (the forward: ops/activation.hpp).
template <class T>
void activation_backward(const T* x, const T* dy, int64_t n, Activation act, T* dx);

// The gated unit h = act(gate) · up, backward, element-wise over n values (the forward:
// ops::gated_activation).
template <class T>
void glu_backward(const T* gate, const T* up, const T* dh, int64_t n, Activation act, T* d_gate, T* d_up);

// The gated unit over rows of a packed [gate | up] product (the forward: ops::gated_activation):
//   gate, up: rows of stride ld (GatedFeedForward: ld = 2F, up = gate + F)   dh: [rows, F]
//   d_gate, d_up: rows of stride d_ld (written; GatedFeedForward: d_ld = 2F, d_up = d_gate + F)
template <class T>
void gated_activation_backward(const T* gate, const T* up, int64_t rows, int64_t F, int64_t ld, const T* dh,
                               Activation act, T* d_gate, T* d_up, int64_t d_ld);

// Softmax over the last dim, backward from its output p:  dx = p ∘ (dp - Σ p ∘ dp)
//   p, dp, dx: [rows, n]
template <class T>
void softmax_backward(const T* p, const T* dp, int64_t rows, int64_t n, T* dx);

// dw[V, H] (+)= scatter-add of dy[rows, H] by ids[rows] (each in [0, V)); rows with id == padding_idx
// add nothing (padding_idx < 0: none).
template <class T>
void embedding_backward(const int64_t* ids, const T* dy, int64_t rows, int64_t V, int64_t H, int64_t padding_idx,
                        T* dw, bool accumulate);

// The transpose of apply_rotary (a rotation by -θ), in place on d: [rows, head_dim] (dy in, dx out);
// tables as apply_rotary's.
template <class T>
void rotary_backward(T* d, int64_t rows, int64_t head_dim, const T* cos, const T* sin, int64_t table_rows,
                     RotaryLayout layout);

// The transpose of apply_rotary_heads (ops/positional.hpp), in place: in every row r of d (viewed as
// [rows, ld]) the `heads` heads of head_dim values from column col0 are rotated by -θ of position
// positions[r] (each in [0, table_rows), else std::invalid_argument).
template <class T>
void rotary_heads_backward(T* d, int64_t rows, int64_t ld, int64_t col0, int64_t heads, int64_t head_dim,
                           const int64_t* positions, const T* cos, const T* sin, int64_t table_rows,
                           RotaryLayout layout);

// Inverted dropout of n values with the counter-based mask of (seed, index): y = keep ? x / (1 - p) : 0.
// The backward is the same call on dy with the same seed. 0 <= p <= 1 (p = 1: zeros). x and y may alias.
template <class T>
void dropout(const T* x, T* y, int64_t n, double p, uint64_t seed);
// The layers' two uses of it in training: x = dropout(x) in place (p = 0: nothing), and the gradient
// through a dropout: g itself (p = 0) or dropout(g) written into buf.
template <class T>
inline void dropout_inplace(T* x, int64_t n, double p, uint64_t seed) {
  if (p > 0) dropout(x, x, n, p, seed);
}
template <class T>
inline const T* dropout_grad(const T* g, T* buf, int64_t n, double p, uint64_t seed) {
  if (p <= 0) return g;
  dropout(g, buf, n, p, seed);
  return buf;
}

enum class Reduction { kMean, kSum, kNone };
// Parses "mean", "sum" or "none"; throws otherwise.
Reduction parse_reduction(const std::string& name);

// Cross-entropy of logits [rows, V] against target [rows] (int64, in [0, V) or == ignore_index),
// with torch's label smoothing (kernels/cross_entropy.hpp). Returns the reduced loss: the mean over
// non-ignored rows (0 when every row is ignored; torch gives NaN there), their sum, or, for kNone,
// the sum (the per-row losses go to loss_rows, 0 on ignored rows).
//   loss_rows: [rows] or nullptr     num_valid: out, the number of non-ignored rows (or nullptr)
//   dlogits: [rows, V] or nullptr: the gradient of grad_scale · loss (kMean, kSum), or of
//            Σ_r grad_rows[r] · loss_r (kNone; grad_rows nullptr: grad_scale for every row);
//            ignored rows get zeros.
template <class T>
double cross_entropy(const T* logits, const int64_t* target, int64_t rows, int64_t V, int64_t ignore_index,
                     double label_smoothing, Reduction reduction, double grad_scale, const T* grad_rows, T* loss_rows,
                     T* dlogits, int64_t* num_valid);

// FlashAttention-2's backward (kernels/attention_backward.hpp): dq, dk, dv from q, k, v, out, dout
// and the forward's lse. Throws on inconsistent sizes (as scaled_dot_product_attention does).
template <class T>
void scaled_dot_product_attention_backward(const AttentionBackwardArgs<T>& args);

}  // namespace transformer_core::ops
