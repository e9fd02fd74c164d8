// Scaled dot-product attention kernels (Vaswani et al. 2017, eq. 1):
//
//   Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V
//
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out: [N, H, L, D_v]
//
// Grouped-query attention: query head h reads key/value head h / (H / H_kv); H_kv = H is ordinary
// multi-head attention, H_kv = 1 is multi-query attention. K/V are never repeated in memory.
//
// Every tensor is addressed through strides (in elements, the last dim contiguous), so a layer can
// hand over its projected [N, L, H·D] buffer as [N, H, L, D] without a transpose.
//
// Masks (each optional) combine: a key s is visible to query l only if every given mask allows it.
//   bool_mask (n, h, l, s):   nonzero = may attend          (stride 0 on a dim = broadcast)
//   key_mask  (n, s):         nonzero = a real key (padding mask)
//   float_mask (n, h, l, s):  added to the scores
//   is_causal:                s <= l + causal_offset (top-left alignment: offset 0;
//                             bottom-right, as for a KV cache: offset S - L)
// A query row that can see no key gives zeros (output and weights), never NaN.
//
// Log-sum-exp (optional output, what FlashAttention-2's backward pass needs, Dao 2023, alg. 2):
//   lse_i = log Σ_s exp(x_is),   x_is = scale · q_i · k_s + mask_is   over the keys row i may see
//   lse: [N, H, L] contiguous;  -inf for a row that can see no key;  NaN where the row's scores hold NaN.
//
// Dropout on the probabilities (optional, training: torch's dropout_p, Srivastava et al. 2014):
//   o_i = Σ_s (keep_is / (1 - p)) · P_is · v_s,   keep_is = bits(seed, ((n·H + h)·L + l)·S + s) >= threshold
// with dropout.hpp's counter-based bits, so the mask depends only on the seed and the element's place
// in [N, H, L, S], not on the tiles or the threads, and the backward regenerates it. The softmax's sum
// and lse are those of the undropped P (as torch: softmax, then dropout); weights, when written, are
// the dropped ones (as torch's MultiheadAttention returns them in training).
//
// NaN: a NaN or inf in q or k makes NaN scores, even with scale = 0 (0 · inf = NaN, as in torch's
// math path), and a NaN score makes its row NaN. A key or value hidden from a row (mask, causality)
// may or may not bring its NaN: the flash path skips whole hidden blocks, this one multiplies by 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "transformer_core/kernels/attention_masks.hpp"
#include "transformer_core/kernels/dropout.hpp"
#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

template <class T>
struct AttentionArgs : AttentionMasks<T> {  // the masks: attention_masks.hpp
  const T* q = nullptr;
  int64_t q_stride_n = 0, q_stride_h = 0, q_stride_l = 0;
  const T* k = nullptr;
  int64_t k_stride_n = 0, k_stride_h = 0, k_stride_s = 0;
  const T* v = nullptr;
  int64_t v_stride_n = 0, v_stride_h = 0, v_stride_s = 0;
  T* out = nullptr;
  int64_t o_stride_n = 0, o_stride_h = 0, o_stride_l = 0;

  int64_t batch = 0, num_heads = 0, num_kv_heads = 0;
  int64_t q_len = 0, kv_len = 0, head_dim = 0, v_head_dim = 0;
  T scale = T(1);

  T* weights = nullptr;          // optional output [N, H, L, S], contiguous; [N, L, S] if average_weights
  bool average_weights = false;  // weights: the mean over the heads (torch's average_attn_weights)
  T* lse = nullptr;              // optional output [N, H, L], contiguous: log Σ_s exp(x_is) per query row

  // dropout on the probabilities: threshold = dropout_threshold(p) (0: none), scale = 1 / (1 - p)
  uint64_t dropout_threshold = 0;
  uint64_t dropout_seed = 0;
  T dropout_scale = T(1);
  bool has_dropout() const { return dropout_threshold != 0; }
};

// The flat index of probability (n, h, l, s) in [N, H, L, S]: its place in the dropout mask.
template <class T>
inline int64_t probability_index(const AttentionArgs<T>& a, int64_t n, int64_t h, int64_t l, int64_t s) {
  return ((n * a.num_heads + h) * a.q_len + l) * a.kv_len + s;
}

// The dropout of query row l's probabilities p[0, len) of keys [s0, s0 + len), in place:
// p_j ← keep ? p_j · scale : 0 (the header's mask; the caller checks has_dropout()).
template <class T>
inline void dropout_probabilities_row(const AttentionArgs<T>& a, int64_t n, int64_t h, int64_t l, int64_t s0,
                                      int64_t len, T* p) {
  dropout_apply_at(p, probability_index(a, n, h, l, s0), len, a.dropout_seed, a.dropout_threshold, a.dropout_scale);
}

// Applies every mask of `a` to the scores of query row l, keys [s0, s0 + len), in place.
template <class T>
inline void apply_masks_row(const AttentionArgs<T>& a, int64_t n, int64_t h, int64_t l, int64_t s0,
                            int64_t len, T* row) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  if (a.float_mask != nullptr) {
    const T* fm = a.float_mask + n * a.float_mask_strides[0] + h * a.float_mask_strides[1] +
                  l * a.float_mask_strides[2] + s0 * a.float_mask_strides[3];
    const int64_t st = a.float_mask_strides[3];
    for (int64_t j = 0; j < len; ++j) row[j] += fm[j * st];
  }
  if (a.bool_mask != nullptr) {
    const uint8_t* bm = a.bool_mask + n * a.bool_mask_strides[0] + h * a.bool_mask_strides[1] +
                        l * a.bool_mask_strides[2] + s0 * a.bool_mask_strides[3];
    const int64_t st = a.bool_mask_strides[3];
    for (int64_t j = 0; j < len; ++j)
      if (!bm[j * st]) row[j] = neg_inf;
  }
  if (a.key_mask != nullptr) {
    const uint8_t* km = a.key_mask + n * a.key_mask_stride_n + s0 * a.key_mask_stride_s;
    for (int64_t j = 0; j < len; ++j)
      if (!km[j * a.key_mask_stride_s]) row[j] = neg_inf;
  }
  if (a.is_causal) {
    const int64_t last = l + a.causal_offset;  // last visible key
    for (int64_t j = std::max<int64_t>(0, last + 1 - s0); j < len; ++j) row[j] = neg_inf;
  }
}

// cblas wants ld ≥ the row length even when there is a single row, where ld is never used.
inline int64_t ld_for(int64_t ld, int64_t rows, int64_t cols) {
  return rows <= 1 ? std::max<int64_t>({ld, cols, 1}) : ld;
}

// x[rows, cols] (row stride ldx) *= scale, after the product (see attention_scores)
template <class T>
inline void scale_scores(int64_t rows, int64_t cols, T scale, T* x, int64_t ldx) {
  if (scale == T(1)) return;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[i * ldx + j] *= scale;
}

// x[rows, cols] (row stride ldx) = scale · q[rows, D] (ldq) · k[cols, D]ᵀ (ldk)
// The product (gemm_on_thread: our kernels for fp32, else BLAS), then the scale. Multiplying after,
// never through BLAS's alpha, keeps torch's NaN rules at scale = 0 (0 · NaN = NaN): BLAS returns
// beta · C without reading A and B when alpha = 0. D = 0: every score is 0.
template <class T>
inline void attention_scores(int64_t rows, int64_t cols, int64_t D, T scale, const T* q, int64_t ldq,
                             const T* k, int64_t ldk, T* x, int64_t ldx) {
  if (D == 0) {
    for (int64_t i = 0; i < rows; ++i) std::fill(x + i * ldx, x + i * ldx + cols, T(0));
    return;
  }
  gemm_on_thread(false, true, rows, cols, D, q, ldq, k, ld_for(ldk, cols, D), x, ldx, false);
  scale_scores(rows, cols, scale, x, ldx);
}

// log Σ_j exp(x_j), j < n, computed as m + log Σ_j exp(x_j - m) with m = max_j x_j.
// -inf when every x_j is -inf (or n = 0); NaN when some x_j is NaN.
template <class T>
inline T log_sum_exp_row(const T* x, int64_t n) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  T m = neg_inf;
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] != x[j]) return x[j];  // NaN
    m = x[j] > m ? x[j] : m;
  }
  if (m == neg_inf) return neg_inf;
  double sum = 0;  // in double, as softmax_row
  for (int64_t j = 0; j < n; ++j) sum += std::exp(x[j] - m);
  return m + static_cast<T>(std::log(sum));
}

// One (n, h) of the reference path, task = n · H + h: the whole [L, S] score matrix at once, two
// GEMMs and a row softmax between them. Writes the head's out rows (and lse) and leaves its
// probabilities in scores [L, S] (resized to L · S unless S = 0).
template <class T>
void attention_reference_head(const AttentionArgs<T>& a, int64_t task, std::vector<T>& scores) {
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.v_head_dim;
  const int64_t n = task / a.num_heads, h = task % a.num_heads, hk = h / (a.num_heads / a.num_kv_heads);
  const T* q = a.q + n * a.q_stride_n + h * a.q_stride_h;
  const T* k = a.k + n * a.k_stride_n + hk * a.k_stride_h;
  const T* v = a.v + n * a.v_stride_n + hk * a.v_stride_h;
  T* out = a.out + n * a.o_stride_n + h * a.o_stride_h;
  T* lse = a.lse != nullptr ? a.lse + task * L : nullptr;  // [L] of this (n, h), or none
  if (S == 0) {  // nothing to attend to
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < Dv; ++j) out[l * a.o_stride_l + j] = T(0);
    if (lse != nullptr) std::fill(lse, lse + L, -std::numeric_limits<T>::infinity());
    return;
  }
  scores.resize(static_cast<size_t>(L * S));
  // scores[L, S] = scale · q[L, D] · k[S, D]ᵀ
  attention_scores(L, S, D, a.scale, q, a.q_stride_l, k, a.k_stride_s, scores.data(), S);
  bool any_empty_row = false;  // a row that can see no key: its output is zeros, whatever v holds
  for (int64_t l = 0; l < L; ++l) {
    T* row = scores.data() + l * S;
    if (a.has_any_mask()) apply_masks_row(a, n, h, l, 0, S, row);
    if (lse != nullptr) lse[l] = log_sum_exp_row(row, S);
    softmax_row(row, S);
    if (a.has_dropout()) dropout_probabilities_row(a, n, h, l, 0, S, row);
    any_empty_row = any_empty_row || std::all_of(row, row + S, [](T p) { return p == T(0); });
  }
  // out[L, Dv] = p[L, S] · v[S, Dv]
  if (Dv > 0)
    gemm_on_thread(false, false, L, Dv, S, scores.data(), S, v, ld_for(a.v_stride_s, S, Dv), out, a.o_stride_l, false);
  for (int64_t l = 0; any_empty_row && l < L; ++l) {
    const T* row = scores.data() + l * S;
    if (std::all_of(row, row + S, [](T p) { return p == T(0); }))
      std::fill(out + l * a.o_stride_l, out + l * a.o_stride_l + Dv, T(0));
  }
}

// The (n, h) tasks in a round of attention_reference_averaged: one per thread at least, more while
// their probabilities stay within kAveragedRoundValues values (small heads: fewer rounds, each a
// parallel region), at most all. So the round's buffers hold max(threads · L · S, about
// kAveragedRoundValues) values, never every head's.
constexpr int64_t kAveragedRoundValues = int64_t{1} << 20;
template <class T>
int64_t averaged_weights_round(const AttentionArgs<T>& a, int num_threads) {
  const int64_t tasks = a.batch * a.num_heads, per_head = std::max<int64_t>(1, a.q_len * a.kv_len);
  return std::min(tasks, std::max<int64_t>(num_threads, kAveragedRoundValues / per_head));
}

// The reference path with the weights averaged over the heads (a.weights [N, L, S]):
//   weights[n] = (P[n, 0] + P[n, 1] + ... + P[n, H-1]) / H
// added in that order, as numpy's mean over the heads' axis adds them: the bits of the per-head
// weights' mean, without holding the per-head weights (H times the output). The (n, h) tasks run in
// rounds (averaged_weights_round), each into a buffer of its own; after a round the buffers are
// added into the weights in task order, in parallel over the [L, S] elements.
template <class T>
void attention_reference_averaged(const AttentionArgs<T>& a) {
  const int64_t H = a.num_heads, LS = a.q_len * a.kv_len, tasks = a.batch * H;
  const int num_threads = std::max(1, get_num_threads());
  const int64_t round = averaged_weights_round(a, num_threads);
  std::vector<std::vector<T>> probs(static_cast<size_t>(round));
  for (int64_t t0 = 0; t0 < tasks; t0 += round) {
    const int64_t count = std::min(round, tasks - t0);
    parallel_tasks(count, [&](int64_t i, int) { attention_reference_head(a, t0 + i, probs[static_cast<size_t>(i)]); },
                   num_threads);
    parallel_for(0, LS, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t n = (t0 + i) / H, h = (t0 + i) % H;
        const T* p = probs[static_cast<size_t>(i)].data();
        T* w = a.weights + n * LS;
        if (h == 0) {
          std::copy(p + begin, p + end, w + begin);
        } else {
          for (int64_t e = begin; e < end; ++e) w[e] += p[e];
        }
        if (h == H - 1)
          for (int64_t e = begin; e < end; ++e) w[e] /= static_cast<T>(H);
      }
    });
  }
}

// The reference path: each (n, h) on its own (attention_reference_head), in parallel. Simple and
// exact; the oracle the tiled kernel is tested against.
template <class T>
void attention_reference(const AttentionArgs<T>& a) {
  if (a.weights != nullptr && a.average_weights) return attention_reference_averaged(a);
  const int64_t LS = a.q_len * a.kv_len;
  const int num_threads = std::max(1, get_num_threads());
  std::vector<std::vector<T>> scratch(static_cast<size_t>(num_threads));
  parallel_tasks(a.batch * a.num_heads, [&](int64_t task, int tid) {
    std::vector<T>& scores = scratch[static_cast<size_t>(tid)];
    attention_reference_head(a, task, scores);
    if (a.weights != nullptr) std::copy(scores.data(), scores.data() + LS, a.weights + task * LS);
  }, num_threads);
}

}  // namespace transformer_core::kernels
