// Backward of scaled dot-product attention, FlashAttention-2 style (Dao 2023, algorithm 2), on the
// CPU: the [L, S] probabilities are never stored; each tile recomputes them from the forward's
// log-sum-exp.
//
//   forward:  X = scale · Q Kᵀ + mask,   P = softmax_rows(X) = exp(X - lse),   O = P V
//
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out, dout: [N, H, L, D_v]
//   lse: [N, H, L] (contiguous; -inf for a row that sees no key)
//   dq: [N, H, L, D]   dk: [N, H_kv, S, D]   dv: [N, H_kv, S, D_v]
//
// With Δ_i = Σ_d dO_id O_id  (= Σ_j P_ij dP_ij), per tile of Br query rows × Bc keys:
//   P  = exp(scale · Q Kᵀ + mask - lse)        (the masks of kernels::AttentionArgs, attention.hpp)
//   dV += Pᵀ dO                                 dP = dO Vᵀ
//   dS = P ∘ (dP - Δ)                           (softmax backward; dX = dS)
//   dQ += scale · dS K                          dK += scale · dSᵀ Q
// With dropout on the probabilities (Z = keep / (1 - p), the forward's mask regenerated from its
// seed, attention.hpp): dV += (P ∘ Z)ᵀ dO and dS = P ∘ (dP ∘ Z - Δ).
//
// Deterministic without atomics: every output element is one task's sum in a fixed order, so the
// result does not depend on the thread count. Two schedules, chosen by the shape alone:
//   one pass (N · H_kv >= kOnePassMinTasks): a task per (n, kv head) owns dK, dV of its keys AND dQ
//           of the query heads of its GQA group; it walks the key blocks in order, and for each
//           every query head of the group and every query block: dQ of a block is summed over the
//           key blocks in ascending order. Five GEMMs per tile, as FlashAttention-2 (whose dQ sum
//           uses atomics instead).
//   two passes (few (n, kv head) pairs: more, smaller tasks for the threads):
//     pass 1, parallel over (n, kv head, key block): dK, dV of the block, looping over every query
//             head of the group and every query block in order;
//     pass 2, parallel over (n, head, query block): dQ of the block, looping over the key blocks in
//             ascending order, recomputing P and dP (seven GEMMs per tile in all).
// Both schedules issue the same GEMMs on the same operands in the same order for every output
// block, so they give the same bits. O(Br · Bc) extra memory per thread; the tile products are
// single-threaded GEMMs.
//
// Causal masks skip whole tiles that no row of the block can see. A row that sees no key (lse =
// -inf) has P = 0: zero dq, and no contribution to dk, dv — never NaN. S = 0: dq = 0; L = 0: dk =
// dv = 0. The masks get no gradient.
//
// A row whose lse is large (|lse| ≥ kExactRowStats: 64 in float, 2^16 in double) cannot use it: its
// rounding, |lse| · 2^-digits, is an error of that size in every exponent, and a row whose keys all
// carry a huge finite float mask (finfo.min, -1e9) would get P = 1 for every key instead of 1/S.
// For those rows a pre-pass recomputes the max m_i and the sum l_i of the backward's own scores,
// and P = exp((X - m) - log l); every other row keeps P = exp(X - lse) (m_i = lse_i, log l_i = 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "transformer_core/kernels/attention.hpp"
#include "transformer_core/kernels/fast_math.hpp"
#include "transformer_core/kernels/flash_attention.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

template <class T>
struct AttentionBackwardArgs {
  // q, k, v, out (read only: out is not written), sizes, scale and masks of the forward call.
  // fwd.weights is ignored.
  AttentionArgs<T> fwd;
  const T* dout = nullptr;
  int64_t do_stride_n = 0, do_stride_h = 0, do_stride_l = 0;
  const T* lse = nullptr;  // [N, H, L], contiguous
  T* dq = nullptr;
  int64_t dq_stride_n = 0, dq_stride_h = 0, dq_stride_l = 0;
  T* dk = nullptr;
  int64_t dk_stride_n = 0, dk_stride_h = 0, dk_stride_s = 0;
  T* dv = nullptr;
  int64_t dv_stride_n = 0, dv_stride_h = 0, dv_stride_s = 0;
};

namespace attention_backward_detail {

// Tile sizes: Br query rows × Bc keys. The tile P [Br, Bc] and dP [Br, Bc] (2 × 32 KiB in float)
// stay in L2 next to the blocks of Q, K, V, dO they are made from.
// Measured single-threaded (CPU time, fp32, (N, H, L, D) = (2, 12, 256, 64), causal; "Intel Xeon
// Processor" under KVM with AVX-512, OpenBLAS 0.3.21 SkylakeX kernels), Br × Bc:
//     32 × 64: 14.4 ms   64 × 64: 11.6 ms   128 × 64: 14.8 ms   64 × 128: 14.8 ms   128 × 128: 14.3 ms
// (larger tiles waste more of the causal diagonal; smaller ones pay more per GEMM call).
constexpr int64_t kBlockRows = 64;  // Br
constexpr int64_t kBlockKeys = 64;  // Bc
// The one-pass schedule needs this many (n, kv head) tasks to keep the threads busy.
constexpr int64_t kOnePassMinTasks = 12;


// |lse| from which a row's statistics are recomputed (see the header): its rounding stays below
// 2^-18 (float) or 2^-37 (double) under it.
template <class T>
inline constexpr T kExactRowStats = T(64);
template <>
inline constexpr double kExactRowStats<double> = 65536.0;

// The softmax statistics of every row: P = exp((X - m) - c)   m, c: [N, H, L]
template <class T>
struct RowStats {
  const T* m;  // the row max (or lse)
  const T* c;  // log of the row's sum of exp(X - m) (or 0)
};

// True if query row l can see some key of [s0, s0 + cols) under the causal mask (or no causal mask).
template <class T>
inline bool causal_block_visible(const AttentionArgs<T>& a, int64_t l_last, int64_t s0) {
  return !a.is_causal || s0 <= l_last + a.causal_offset;
}

// Δ[n, h, l] = Σ_d dO[n, h, l, d] · O[n, h, l, d]   (in double)      delta: [N, H, L]
template <class T>
void compute_delta(const AttentionBackwardArgs<T>& b, T* delta) {
  const AttentionArgs<T>& a = b.fwd;
  const int64_t H = a.num_heads, L = a.q_len, Dv = a.v_head_dim;
  const int64_t rows = a.batch * H * L;
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Dv)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / (H * L), h = (r / L) % H, l = r % L;
      const T* o = a.out + n * a.o_stride_n + h * a.o_stride_h + l * a.o_stride_l;
      const T* d = b.dout + n * b.do_stride_n + h * b.do_stride_h + l * b.do_stride_l;
      double s = 0;
      for (int64_t j = 0; j < Dv; ++j) s += static_cast<double>(o[j]) * d[j];
      delta[r] = static_cast<T>(s);
    }
  });
}

// The row statistics (see RowStats): m = lse, c = 0, except for the rows with |lse| ≥ kExactRowStats,
// whose max and log-sum are recomputed here over all their keys, from scores made by the same
// products as tile_p_ds's (whole query blocks), so that m is exactly one of the row's scores.
// x: kBlockRows · kBlockKeys per thread, for num_threads threads.       m, c: [N, H, L]
template <class T>
void compute_row_stats(const AttentionBackwardArgs<T>& b, T* m, T* c, T* x_per_thread, int num_threads) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const AttentionArgs<T>& a = b.fwd;
  const int64_t H = a.num_heads, L = a.q_len, S = a.kv_len, D = a.head_dim;
  const int64_t q_blocks = (L + kBlockRows - 1) / kBlockRows, group = H / a.num_kv_heads;
  parallel_tasks(a.batch * H * q_blocks, [&](int64_t task, int tid) {
    const int64_t n = task / (H * q_blocks), h = (task / q_blocks) % H, qb = task % q_blocks;
    const int64_t l0 = qb * kBlockRows, br = std::min(kBlockRows, L - l0), row0 = (n * H + h) * L + l0;
    bool any = false;
    bool exact[kBlockRows];
    for (int64_t i = 0; i < br; ++i) {
      const T lse = b.lse[row0 + i];
      m[row0 + i] = lse;
      c[row0 + i] = T(0);
      exact[i] = std::fabs(lse) >= kExactRowStats<T> && std::fabs(lse) < std::numeric_limits<T>::infinity();
      any = any || exact[i];
    }
    if (!any) return;
    T row_max[kBlockRows];
    double row_sum[kBlockRows];  // of exp(x - row_max)
    std::fill(row_max, row_max + br, neg_inf);
    std::fill(row_sum, row_sum + br, 0.0);
    const T* q = a.q + n * a.q_stride_n + h * a.q_stride_h + l0 * a.q_stride_l;  // [br, D]
    const T* k = a.k + n * a.k_stride_n + (h / group) * a.k_stride_h;          // [S, D]
    T* x = x_per_thread + int64_t(tid) * kBlockRows * kBlockKeys;
    for (int64_t s0 = 0; s0 < S && causal_block_visible(a, l0 + br - 1, s0); s0 += kBlockKeys) {
      const int64_t cols = std::min(kBlockKeys, S - s0);
      attention_scores(br, cols, D, a.scale, q, ld_for(a.q_stride_l, br, D), k + s0 * a.k_stride_s, a.k_stride_s,
                       x, kBlockKeys);
      for (int64_t i = 0; i < br; ++i) {
        if (!exact[i]) continue;
        T* row = x + i * kBlockKeys;
        if (a.has_any_mask()) apply_masks_row(a, n, h, l0 + i, s0, cols, row);
        T new_max = row_max[i];
        for (int64_t j = 0; j < cols; ++j) new_max = std::max(new_max, row[j]);
        if (new_max == neg_inf) continue;  // nothing seen yet
        double sum = row_max[i] == neg_inf ? 0.0 : row_sum[i] * std::exp(double(row_max[i] - new_max));
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(double(row[j] - new_max));
        row_max[i] = new_max;
        row_sum[i] = sum;
      }
    }
    for (int64_t i = 0; i < br; ++i) {
      if (!exact[i]) continue;
      m[row0 + i] = row_max[i];  // -inf: the row sees no key after all
      c[row0 + i] = row_max[i] == neg_inf ? T(0) : static_cast<T>(std::log(row_sum[i]));
    }
  }, num_threads);
}

// The tile's probabilities and the softmax gradient, for query rows [l0, l0 + br) of head (n, h)
// and keys [s0, s0 + cols):
//   p[br, cols]  = exp((scale · q kᵀ + mask - m) - c)   (row stride Bc; m, c: RowStats)
//   ds[br, cols] = scale · p ∘ (dO vᵀ - Δ)               (row stride Bc; the scale of dK and dQ)
// With dropout (Z = keep / (1 - p), attention.hpp): ds = scale · p ∘ ((dO vᵀ) ∘ Z - Δ), and p is
// returned as p ∘ Z, the probabilities the forward multiplied v by (dV's factor).
// Returns false (and leaves p, ds unset) when every p_ij is 0: the tile contributes nothing.
template <class T>
bool tile_p_ds(const AttentionBackwardArgs<T>& b, const RowStats<T>& stats, const T* delta, int64_t n, int64_t h,
               int64_t l0, int64_t br, int64_t s0, int64_t cols, T* p, T* ds) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const AttentionArgs<T>& a = b.fwd;
  const int64_t D = a.head_dim, Dv = a.v_head_dim, L = a.q_len;
  const int64_t hk = h / (a.num_heads / a.num_kv_heads);
  const T* q = a.q + n * a.q_stride_n + h * a.q_stride_h + l0 * a.q_stride_l;   // [br, D]
  const T* k = a.k + n * a.k_stride_n + hk * a.k_stride_h + s0 * a.k_stride_s;  // [cols, D]
  const T* v = a.v + n * a.v_stride_n + hk * a.v_stride_h + s0 * a.v_stride_s;  // [cols, Dv]
  const T* dout = b.dout + n * b.do_stride_n + h * b.do_stride_h + l0 * b.do_stride_l;  // [br, Dv]
  const T* row_m = stats.m + (n * a.num_heads + h) * L + l0;                           // [br]
  const T* row_c = stats.c + (n * a.num_heads + h) * L + l0;                           // [br]
  const T* dlt = delta + (n * a.num_heads + h) * L + l0;                                // [br]
  const int64_t ld = kBlockKeys;

  // x[br, cols] = scale · q[br, D] · k[cols, D]ᵀ   (the forward's scores, attention.hpp)
  attention_scores(br, cols, D, a.scale, q, ld_for(a.q_stride_l, br, D), k, a.k_stride_s, p, ld);
  // masks, then p = exp((x - m) - c); a row with m = -inf sees nothing: p = 0
  bool any = false;
  for (int64_t i = 0; i < br; ++i) {
    T* row = p + i * ld;
    const T m = row_m[i], c = row_c[i];
    if (m == neg_inf) {
      std::fill(row, row + cols, T(0));
      continue;
    }
    if (a.has_any_mask()) apply_masks_row(a, n, h, l0 + i, s0, cols, row);
    for (int64_t j = 0; j < cols; ++j) {
      // <= 0 up to rounding; -inf where masked; NaN stays NaN (c = 0: the loop is unswitched)
      const T e = c == T(0) ? row[j] - m : (row[j] - m) - c;
      row[j] = fast_math::exp_nonpos(e > T(0) ? T(0) : e);
    }
    any = true;
  }
  if (!any) return false;
  // ds[br, cols] = dO[br, Dv] · v[cols, Dv]ᵀ, then ds = scale · p ∘ (ds - Δ)  (the scale of dK and dQ,
  // taken here once, so that their products need none)
  if (Dv == 0) {
    for (int64_t i = 0; i < br; ++i) std::fill(ds + i * ld, ds + i * ld + cols, T(0));
  } else {
    gemm_on_thread(false, true, br, cols, Dv, dout, ld_for(b.do_stride_l, br, Dv), v, ld_for(a.v_stride_s, cols, Dv),
                   ds, ld, false);
  }
  const T scale = a.scale;
  for (int64_t i = 0; i < br; ++i) {
    T* dsr = ds + i * ld;
    T* pr = p + i * ld;
    const T di = dlt[i];
    if (!a.has_dropout()) {
      for (int64_t j = 0; j < cols; ++j) dsr[j] = scale * (pr[j] * (dsr[j] - di));
      continue;
    }
    // dropout: the forward's o = (P ∘ Z) V with Z = keep / (1 - p), so the softmax's gradient takes
    // dP ∘ Z and dV takes P ∘ Z (Δ = Σ_d dO O is unchanged: the forward's o held Z already); the
    // row's mask drawn once for both
    const T z = a.dropout_scale;
    const uint64_t threshold = a.dropout_threshold;
    dropout_runs(uint64_t(probability_index(a, n, h, l0 + i, s0)), cols, a.dropout_seed,
                 [&](int64_t j0, int64_t m, const uint32_t* bits) {
                   for (int64_t t = 0; t < m; ++t) {
                     const int64_t j = j0 + t;
                     const bool keep = bits[t] >= threshold;
                     dsr[j] = scale * (pr[j] * ((keep ? dsr[j] * z : T(0)) - di));
                     pr[j] = keep ? pr[j] * z : T(0);
                   }
                 });
  }
  return true;
}

}  // namespace attention_backward_detail

template <class T>
void attention_backward(const AttentionBackwardArgs<T>& b) {
  using namespace attention_backward_detail;
  const AttentionArgs<T>& a = b.fwd;
  const int64_t N = a.batch, H = a.num_heads, Hkv = a.num_kv_heads, L = a.q_len, S = a.kv_len;
  const int64_t D = a.head_dim, Dv = a.v_head_dim, group = H / Hkv;
  if (N == 0) return;
  const int64_t q_blocks = (L + kBlockRows - 1) / kBlockRows;
  const int64_t k_blocks = (S + kBlockKeys - 1) / kBlockKeys;

  std::vector<T> delta(static_cast<size_t>(N * H * L));
  if (L > 0) compute_delta(b, delta.data());

  const int num_threads = std::max(1, get_num_threads());
  const int64_t tile = kBlockRows * kBlockKeys;
  std::vector<T> scratch(static_cast<size_t>(2 * tile * num_threads));  // p | ds per thread

  std::vector<T> row_m(delta.size()), row_c(delta.size());
  if (L > 0) compute_row_stats(b, row_m.data(), row_c.data(), scratch.data(), num_threads);
  const RowStats<T> stats{row_m.data(), row_c.data()};

  // dK, dV of key block kb of kv head (n, hk), summed over the group's heads and all query rows;
  // with `with_dq`, also dQ += this key block's part, for every query block of the group's heads.
  auto key_block = [&](int64_t n, int64_t hk, int64_t kb, bool with_dq, int tid) {
    const int64_t s0 = kb * kBlockKeys, cols = std::min(kBlockKeys, S - s0);
    T* dk = b.dk + n * b.dk_stride_n + hk * b.dk_stride_h + s0 * b.dk_stride_s;  // [cols, D]
    T* dv = b.dv + n * b.dv_stride_n + hk * b.dv_stride_h + s0 * b.dv_stride_s;  // [cols, Dv]
    for (int64_t j = 0; j < cols; ++j) {
      std::fill(dk + j * b.dk_stride_s, dk + j * b.dk_stride_s + D, T(0));
      std::fill(dv + j * b.dv_stride_s, dv + j * b.dv_stride_s + Dv, T(0));
    }
    const T* k = a.k + n * a.k_stride_n + hk * a.k_stride_h + s0 * a.k_stride_s;  // [cols, D]
    T* p = scratch.data() + int64_t(tid) * 2 * tile;
    T* ds = p + tile;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const T* q = a.q + n * a.q_stride_n + h * a.q_stride_h;          // [L, D]
      const T* dout = b.dout + n * b.do_stride_n + h * b.do_stride_h;  // [L, Dv]
      T* dq = b.dq + n * b.dq_stride_n + h * b.dq_stride_h;            // [L, D]
      for (int64_t qb = 0; qb < q_blocks; ++qb) {
        const int64_t l0 = qb * kBlockRows, br = std::min(kBlockRows, L - l0);
        if (!causal_block_visible(a, l0 + br - 1, s0)) continue;
        if (!tile_p_ds(b, stats, delta.data(), n, h, l0, br, s0, cols, p, ds)) continue;
        // dv[cols, Dv] += p[br, cols]ᵀ · dO[l0 : l0+br, Dv]
        if (Dv > 0)
          gemm_on_thread(true, false, cols, Dv, br, p, kBlockKeys, dout + l0 * b.do_stride_l,
                         ld_for(b.do_stride_l, br, Dv), dv, ld_for(b.dv_stride_s, cols, Dv), true);
        if (D == 0) continue;
        // dk[cols, D] += ds[br, cols]ᵀ · q[l0 : l0+br, D]   (ds holds the scale)
        gemm_on_thread(true, false, cols, D, br, ds, kBlockKeys, q + l0 * a.q_stride_l, ld_for(a.q_stride_l, br, D),
                       dk, ld_for(b.dk_stride_s, cols, D), true);
        // dq[l0 : l0+br, D] += ds[br, cols] · k[cols, D]
        if (with_dq)
          gemm_on_thread(false, false, br, D, cols, ds, kBlockKeys, k, ld_for(a.k_stride_s, cols, D),
                         dq + l0 * b.dq_stride_l, ld_for(b.dq_stride_l, br, D), true);
      }
    }
  };
  // dQ = 0 for the query heads of kv head (n, hk)
  auto zero_dq = [&](int64_t n, int64_t hk) {
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      T* dq = b.dq + n * b.dq_stride_n + h * b.dq_stride_h;
      for (int64_t l = 0; l < L; ++l) std::fill(dq + l * b.dq_stride_l, dq + l * b.dq_stride_l + D, T(0));
    }
  };

  if (N * Hkv >= kOnePassMinTasks) {
    parallel_tasks(N * Hkv, [&](int64_t task, int tid) {
      const int64_t n = task / Hkv, hk = task % Hkv;
      zero_dq(n, hk);
      for (int64_t kb = 0; kb < k_blocks; ++kb) key_block(n, hk, kb, true, tid);
    }, num_threads);
    return;
  }

  // Pass 1: dK, dV of key block kb of kv head (n, hk).
  parallel_tasks(N * Hkv * k_blocks, [&](int64_t task, int tid) {
    key_block(task / (Hkv * k_blocks), (task / k_blocks) % Hkv, task % k_blocks, false, tid);
  }, num_threads);

  // Pass 2: dQ of query block qb of head (n, h), summed over the key blocks in order.
  if (D == 0) return;
  parallel_tasks(N * H * q_blocks, [&](int64_t task, int tid) {
    const int64_t n = task / (H * q_blocks), h = (task / q_blocks) % H, qb = task % q_blocks;
    const int64_t l0 = qb * kBlockRows, br = std::min(kBlockRows, L - l0);
    const int64_t hk = h / group;
    T* dq = b.dq + n * b.dq_stride_n + h * b.dq_stride_h + l0 * b.dq_stride_l;  // [br, D]
    for (int64_t i = 0; i < br; ++i) std::fill(dq + i * b.dq_stride_l, dq + i * b.dq_stride_l + D, T(0));
    const T* k = a.k + n * a.k_stride_n + hk * a.k_stride_h;  // [S, D]
    T* p = scratch.data() + int64_t(tid) * 2 * tile;
    T* ds = p + tile;
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t s0 = kb * kBlockKeys, cols = std::min(kBlockKeys, S - s0);
      if (!causal_block_visible(a, l0 + br - 1, s0)) break;  // later blocks are hidden too
      if (!tile_p_ds(b, stats, delta.data(), n, h, l0, br, s0, cols, p, ds)) continue;
      // dq[br, D] += ds[br, cols] · k[s0 : s0+cols, D]   (ds holds the scale)
      gemm_on_thread(false, false, br, D, cols, ds, kBlockKeys, k + s0 * a.k_stride_s, ld_for(a.k_stride_s, cols, D),
                     dq, ld_for(b.dq_stride_l, br, D), true);
    }
  }, num_threads);
}

}  // namespace transformer_core::kernels
