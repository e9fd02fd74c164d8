// Tiled scaled dot-product attention with an online softmax (FlashAttention-2: Dao 2023, alg. 1;
// Milakov & Gimelshein 2018 for the online softmax). Same result as attention_reference, in
// O(tile) extra memory instead of the [L, S] score matrix:
//
//   Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V
//
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out: [N, H, L, D_v]   lse: [N, H, L]
//
// The [L, S] product is cut into tiles of Br query rows × Bc keys. For one query block, the key
// blocks are visited in order, keeping per row i a running max m_i, a running sum l_i and an
// unnormalised accumulator o_i; one key block (scores x_ij, j in the block) updates them as
//
//   m̃   = max_j x_ij                       the block's row max
//   m_new = max(m_old, m̃)
//   p_ij = exp(x_ij − m_new)
//   α    = exp(m_old − m_new)               rescales what the earlier blocks summed
//   l    ← α·l + Σ_j p_ij
//   o    ← α·o + P·V
//
// and after the last block  out_i = o_i / l_i,  lse_i = m_i + log l_i. Both tile products are GEMMs
// on the calling thread (gemm_on_thread: our fp32 kernels; BLAS for fp64 and rows < 4).
//
// The exponentials are taken in base 2, as FlashAttention does: the state keeps m in units of log₂
// (m_i = max_j x_ij · log₂e) and p_ij = 2^(x_ij · log₂e − m_i), the same numbers. Unless a float mask
// must be added to the scaled scores, the tile holds the unscaled products s = q·kᵀ and the scale
// joins log₂e in the exponent's factor c = scale · log₂e:  p_ij = 2^(s_ij · c − m_i), one FMA per
// score, and no pass over the tile to scale it.
//
// Parallel over (n, h, query block) tasks — in fp32, groups of up to kSharedQueryBlocks query
// blocks of a head, which pack each key block once for the group; when they are too few to keep
// threads busy (decoding: L = 1), the keys are also split into chunks whose partial (m, l, o)
// triples are merged exactly. One query row with grouped keys and values (GQA decoding) takes the
// query heads of a key/value head as the rows of one block (fold_grouped_heads).
//
// Determinism: the plan (tile sizes, key split, task list; flash_plan) is a function of the sizes
// N, H, L, S, D, D_v alone, never of the thread count; a task computes the same operations in the
// same order on whichever thread runs it (single-threaded BLAS, buffers equally aligned), and the
// split-KV partials are merged in chunk order. So for a given input the output and lse are the
// same bit for bit whatever the number of threads (set_num_threads / OMP_NUM_THREADS), on one
// machine with one OpenBLAS build (other CPUs may take other SIMD kernels, so other roundings).
//
// Masks, GQA, fully masked rows (zeros; lse = -inf), NaN (propagates to the row), S = 0 (zeros):
// as in attention.hpp. `a.weights` is never written: callers who want the weights use the
// reference path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "transformer_core/kernels/attention.hpp"
#include "transformer_core/kernels/fast_math.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::kernels {

namespace flash_detail {

using fast_math::exp2_nonpos;

// Tile sizes. This machine: AMD EPYC (Zen 5), L1d 48 KiB and L2 1 MiB per core, L3 32 MiB shared;
// OpenBLAS 0.3.21 runs its Haswell (AVX2) kernels. Measured single-threaded (thread CPU time, best
// of 3; fp32, D = Dv = 64) over Br ∈ {32, 64, 128, 256} × Bc ∈ {128, 256, 512}, in ms:
//                      (1,12,512) (1,2,4096) causal (1,1,16384)
//     Br  64, Bc 256      9.8          52.7            961
//     Br  64, Bc 512      9.1          55.2            956
//     Br 128, Bc 128      9.2          51.5            865
//     Br 128, Bc 256      8.5          46.7            779     <- chosen
//     Br 128, Bc 512      8.8          52.3            843
//     Br 256, Bc 256      9.4          50.9            782
//   * Br = 128 query rows: k and v are streamed once per query block, so long S wants a tall block
//     (64 rows: -20% at S = 16384); the q block [128, D] (32 KiB) is packed once per key block.
//   * Bc = 256 keys: the score tile [128, 256] (128 KiB) and the k, v blocks [256, D] (64 KiB each
//     at D = 64) stay in L2 between the two GEMMs and the softmax pass; smaller Bc pays OpenBLAS's
//     per-call packing more often, larger Bc spills L2.
//   * Blocks on the causal diagonal are cut into kDiagRows-row GEMMs (see flash_tile), so a tall
//     Br costs little extra work on causal masks.
constexpr int64_t kBlockRows = 128;  // Br
constexpr int64_t kBlockKeys = 256;  // Bc
// One query row (decoding): the tile is [1, Bc], so a long key block costs nothing and saves calls.
constexpr int64_t kBlockKeysOneRow = 2048;
// Rows per GEMM on a block that straddles the causal diagonal (see flash_tile).
constexpr int64_t kDiagRows = 32;
// Rows per group on a block off the diagonal, when our GEMM runs the products on a packed key block
// (flash_blocks_shared): each group's scores [24, Bc] (24 KiB) stay in L1 from its Q·Kᵀ through
// the softmax to its P·V, where the whole block's [128, Bc] (128 KiB) went through L2 twice. Two
// tiles of the AVX-512 kernel's 12 rows, four of AVX2's 6. Emerald Rapids, SDPA (8, 12, 512, 64),
// one thread, 6 alternating pairs: 1-2 % faster (12 rows the same, 48 rows none). The same
// products in the same order: the same bits.
constexpr int64_t kGroupRows = 24;
// Rows whose maxes flash_tile takes before their exponentials (a stack array of them).
constexpr int64_t kMaxRows = 64;
// Below this many flops a call whose tile fits in kStackElems elements is small: each task's tile on
// its thread's stack, no heap, no BLAS. Below kInlineFlops (or with one task) it runs on the calling
// thread, without a parallel region; above, its tasks are shared out (one sentence of MiniLM,
// 12 heads × 9 tokens, through the Python call, Zen 5: 21 µs on 1 thread, 17 µs on 2).
constexpr double kSmallFlops = double(1 << 18);
constexpr double kInlineFlops = double(1 << 15);
constexpr int64_t kStackElems = 4096;
// Key splitting (decoding): when there are fewer than kSplitTasks (n, h, query block) tasks, the
// keys are cut into chunks of at least kMinChunk keys (a multiple of 64) until there are about
// kSplitTasks tasks. A constant, not a multiple of the thread count, so that the split (and with it
// the rounding of the result) depends on the shape only; 32 tasks keep 16 threads busy twice over.
constexpr int64_t kSplitTasks = 32;
constexpr int64_t kMinChunk = 512;

}  // namespace flash_detail

// How attention_flash cuts one call into work: a function of the sizes alone (see "Determinism").
struct FlashPlan {
  bool small = false;        // tiny problem: each task's tile on its thread's stack, no BLAS
  bool serial = false;       // small, and every task on the calling thread
  int64_t block_rows = 0;    // Br: query rows per block (min(128, L))
  int64_t block_keys = 0;    // Bc: keys per block (min(256, S); min(2048, S) when L = 1)
  int64_t query_blocks = 0;  // ⌈L / Br⌉
  int64_t kv_chunks = 1;     // key ranges per query block; > 1: split-KV, partial results merged
  int64_t kv_chunk_len = 0;  // keys per range (the last one may be shorter)
  int64_t tasks = 0;         // N · H · query_blocks · kv_chunks  (0 when N, H, L or S is 0)
};

inline FlashPlan flash_plan(int64_t N, int64_t H, int64_t L, int64_t S, int64_t D, int64_t Dv) {
  using namespace flash_detail;
  FlashPlan p;
  if (N == 0 || H == 0 || L == 0 || S == 0) return p;
  p.block_rows = std::min(kBlockRows, L);
  p.block_keys = std::min(L == 1 ? kBlockKeysOneRow : kBlockKeys, S);
  p.query_blocks = (L + p.block_rows - 1) / p.block_rows;
  p.kv_chunk_len = S;
  const int64_t base_tasks = N * H * p.query_blocks;  // (n, h, query block)
  p.tasks = base_tasks;
  // Tiny problems: the tile s [Br, Bc] | o [Br, Dv] | m [Br] | l [Br] | m_lo [Br] on the stack.
  const double flops = 2.0 * double(N * H) * double(L) * double(S) * double(D + Dv);
  const int64_t tile_elems = p.block_rows * (p.block_keys + Dv + 3);
  if (flops < kSmallFlops && tile_elems <= kStackElems) {
    p.small = true;
    p.serial = flops < kInlineFlops || p.tasks == 1;
    return p;
  }
  // Too few tasks: split the keys into chunks of ≥ kMinChunk keys, a multiple of 64.
  if (base_tasks < kSplitTasks && S >= 2 * kMinChunk) {
    const int64_t want = (kSplitTasks + base_tasks - 1) / base_tasks;
    const int64_t chunks = std::min(want, S / kMinChunk);
    p.kv_chunk_len = ((S + chunks - 1) / chunks + 63) / 64 * 64;
    p.kv_chunks = (S + p.kv_chunk_len - 1) / p.kv_chunk_len;
    p.tasks = base_tasks * p.kv_chunks;
  }
  return p;
}

namespace flash_detail {

// exp2_nonpos: kernels/fast_math.hpp

// ---- row max, vectorisable -------------------------------------------------------------------
// A float compare-select reduction does not vectorise without -ffast-math (NaN), an integer max
// does: map each value to an integer key in the same order (flip the magnitude bits of negatives).
// A positive NaN keys above +inf and a negative one below -inf; either way exp(NaN - m) is NaN and
// the row ends NaN, as in the reference.
inline int32_t order_key(float x) {
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i ^ ((i >> 31) & 0x7fffffff);
}
inline int64_t order_key(double x) {
  int64_t i;
  std::memcpy(&i, &x, sizeof i);
  return i ^ ((i >> 63) & 0x7fffffffffffffffLL);
}
template <class T>
inline T from_order_key(decltype(order_key(T())) k) {
  using I = decltype(order_key(T()));
  const I i = k ^ ((k >> (8 * sizeof(I) - 1)) & std::numeric_limits<I>::max());
  T x;
  std::memcpy(&x, &i, sizeof x);
  return x;
}

// max_j x[j], j < n  (-inf when n = 0)
template <class T>
inline T row_max(const T* x, int64_t n) {
  using I = decltype(order_key(T()));
  I m = order_key(-std::numeric_limits<T>::infinity());
  for (int64_t j = 0; j < n; ++j) {
    const I kj = order_key(x[j]);
    m = kj > m ? kj : m;
  }
  return from_order_key<T>(m);
}

// The row max of a score tile's row, for the online softmax: max_j x[j] (-inf when n = 0), except
// that with a NaN among the x[j] the result may be NaN or the max of the others: either way that
// score's exponential is NaN and so is the row's sum, as in the reference. float: vmaxps registers
// (one instruction per 16 scores, against four for row_max's integer keys; Zen 5: 0.7 cycles a
// register instead of 2).
template <class T>
inline T score_row_max(const T* x, int64_t n) {
  return row_max(x, n);
}
template <>
inline float score_row_max<float>(const float* x, int64_t n) {
  using B = xsimd::batch<float>;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  B m0(neg_inf), m1(neg_inf);  // two chains: the max's latency is hidden behind the loads
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    m0 = xsimd::max(m0, B::load_unaligned(x + j));
    m1 = xsimd::max(m1, B::load_unaligned(x + j + W));
  }
  float m = simd::reduce_max(xsimd::max(m0, m1));
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] = valid[j] ? x[j] : -inf, and returns max_j x[j]   (the key-padding mask fused with the max)
template <class T>
inline T mask_row_max(T* x, const uint8_t* valid, int64_t n) {
  using I = decltype(order_key(T()));
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  I m = order_key(neg_inf);
  for (int64_t j = 0; j < n; ++j) {
    const T v = valid[j] ? x[j] : neg_inf;
    x[j] = v;
    const I kj = order_key(v);
    m = kj > m ? kj : m;
  }
  return from_order_key<T>(m);
}

// x[j] = 2^(x[j] · c − m) in place, returns Σ_j x[j]: 16 partial sums (lane t takes j ≡ t mod 16),
// the 16 lanes summed pairwise (lane_sum), plus the last n mod 16 values summed in order; the order
// depends on nothing but n. The exponent x · c − m is one FMA: rounded once, so its error is
// relative to the exponent, not to x · c (which may be large where the exponent is near 0).
// double: plain loops for GCC to vectorise.
template <class T>
inline T lane_sum(const T* lane) {  // lane[16]: t + 8, then t + 4, t + 2, t + 1: a latency of 4 additions
  T s8[8], s4[4];
  for (int t = 0; t < 8; ++t) s8[t] = lane[t] + lane[t + 8];
  for (int t = 0; t < 4; ++t) s4[t] = s8[t] + s8[t + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
template <class T>
inline T exp2_row_sum(T* x, int64_t n, T c, T m) {
  constexpr int64_t W = 16;
  T lane[W] = {};
  int64_t j = 0;
  for (; j + W <= n; j += W)
    for (int64_t t = 0; t < W; ++t) {
      const T e = exp2_nonpos(std::fma(x[j + t], c, -m));
      x[j + t] = e;
      lane[t] += e;
    }
  T sum = 0;
  for (; j < n; ++j) {
    const T e = exp2_nonpos(std::fma(x[j], c, -m));
    x[j] = e;
    sum += e;
  }
  return lane_sum(lane) + sum;
}

// exp2_row_sum for a wide row (Accumulator): x[j] = 2^((x[j] · c − m) − m_lo), the exponent's
// first part one FMA as there, then the low part subtracted, so that the row max gets 2^0 = 1 and
// every other score a non-positive exponent. Rare (masks of -1e10, huge scales): plain loops.
template <class T>
inline T exp2_row_sum_wide(T* x, int64_t n, T c, T m, T m_lo) {
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const T e = static_cast<T>(exp2_nonpos(static_cast<double>(std::fma(x[j], c, -m) - m_lo)));
    x[j] = e;
    sum += e;
  }
  return sum;
}

// float: xsimd registers, written out. GCC left the loop above scalar for float when tuning for
// AMD (-march=znver3, znver4, znver5) and for AVX2-only Intel CPUs (it vectorised it only with
// AVX-512 on Intel's tuning): on Zen 3, SDPA (8, 12, 512, 64) spent half its time in scalar exps.
// The 16 lanes are two AVX2 registers or one AVX-512 register; each lane runs one FMA for the
// exponent and exp2_nonpos's polynomial with its FMAs, the same on every ISA, and so do the last
// n mod 16 values (through a buffer), so the bits do not depend on the ISA either.
template <>
inline float exp2_row_sum<float>(float* x, int64_t n, float c, float m) {
  using B = xsimd::batch<float>;
  constexpr int64_t W = 16, R = W / static_cast<int64_t>(B::size);
  static_assert(R * static_cast<int64_t>(B::size) == W, "16 lanes: a whole number of registers");
  const B cb(c), mb(-m);
  B lane[R];
  for (int64_t r = 0; r < R; ++r) lane[r] = B(0.0f);
  int64_t j = 0;
  for (; j + W <= n; j += W)
    for (int64_t r = 0; r < R; ++r) {
      float* xr = x + j + r * static_cast<int64_t>(B::size);
      const B e = exp2_nonpos(simd::fma(B::load_unaligned(xr), cb, mb));
      e.store_unaligned(xr);
      lane[r] += e;
    }
  float sum = 0.0f;
  if (j < n) {  // the tail: padded to 16 values, only the first n - j kept
    alignas(64) float tail[W] = {};
    std::copy(x + j, x + n, tail);
    for (int64_t r = 0; r < R; ++r) {
      float* tr = tail + r * static_cast<int64_t>(B::size);
      exp2_nonpos(simd::fma(B::load_aligned(tr), cb, mb)).store_aligned(tr);
    }
    for (int64_t t = 0; t < n - j; ++t) {
      x[j + t] = tail[t];
      sum += tail[t];
    }
  }
  alignas(64) float lanes[W];
  for (int64_t r = 0; r < R; ++r) lane[r].store_aligned(lanes + r * static_cast<int64_t>(B::size));
  return lane_sum(lanes) + sum;
}

// The same two products as plain loops, for tiny problems: no BLAS call (which, outside a
// parallel region, may start threads of its own for a few hundred flops).
//   x[rows, cols] (row stride ldx) = scale · q[rows, D] (ldq) · k[cols, D]ᵀ (ldk)
template <class T>
void small_qk(int64_t rows, int64_t cols, int64_t D, T scale, const T* q, int64_t ldq, const T* k,
              int64_t ldk, T* x, int64_t ldx) {
  constexpr int64_t W = 8;  // partial sums, so that the dot product vectorises
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const T* qi = q + i * ldq;
      const T* kj = k + j * ldk;
      T lane[W] = {};
      int64_t d = 0;
      for (; d + W <= D; d += W)
        for (int64_t t = 0; t < W; ++t) lane[t] += qi[d + t] * kj[d + t];
      T dot = 0;
      for (; d < D; ++d) dot += qi[d] * kj[d];
      for (int64_t t = 0; t < W; ++t) dot += lane[t];
      x[i * ldx + j] = scale * dot;
    }
}
//   o[rows, Dv] = beta · o + p[rows, cols] (ldp) · v[cols, Dv] (ldv)      (beta 0 or 1)
template <class T>
void small_pv(int64_t rows, int64_t cols, int64_t Dv, const T* p, int64_t ldp, const T* v, int64_t ldv,
              bool accumulate, T* o) {
  for (int64_t i = 0; i < rows; ++i) {
    T* oi = o + i * Dv;
    if (!accumulate) std::fill(oi, oi + Dv, T(0));
    for (int64_t j = 0; j < cols; ++j) {
      const T pij = p[i * ldp + j];
      for (int64_t d = 0; d < Dv; ++d) oi[d] += pij * v[j * ldv + d];
    }
  }
}

// ---- the pieces of one task ------------------------------------------------------------------

// One query block: rows l0 .. l0+rows-1 of head (n, h); `index` counts (n, h, query block).
struct QueryBlock {
  int64_t n, h, l0, rows;
};
inline QueryBlock query_block(const FlashPlan& p, int64_t H, int64_t L, int64_t index) {
  const int64_t nh = index / p.query_blocks, l0 = (index % p.query_blocks) * p.block_rows;
  return {nh / H, nh % H, l0, std::min(p.block_rows, L - l0)};
}

// One thread's tile buffers.
template <class T>
struct Tile {
  T* s = nullptr;            // [Br, Bc]  scores, then probabilities (row stride Bc)
  uint8_t* valid = nullptr;  // [Bc]      key_mask of the current key block, made contiguous
};

// The online-softmax state of one query block, in a buffer of Br · (Dv + 3): o | m | l | m_lo, with
// m in units of log₂ (x_is: the scaled, masked scores).
//
// m_i is the row max times log₂e rounded to T, and the exponents are taken relative to it; the
// rounding error shifts every exponent of the row alike, which the normalisation cancels. That
// holds while the error is small: beyond |m| = 2^digits (2^24 in float: masks of -1e10 added to the
// scores, or a huge scale) it exceeds 1 and grows with |m|, and the row max's own exponent, which
// should be 0, could overflow (NaN) or underflow (zeros). There the exact product is kept as
// m_i + m_lo_i (m_lo: its rounding error, exact by an FMA), and the exponents are taken relative to
// the sum (wide_row). Below 2^digits m_lo is 0 and nothing changes.
template <class T>
struct Accumulator {
  T* o;     // [Br, Dv]  o_i = Σ_s 2^(x_is·log₂e − m_i) v_s   (unnormalised; row stride Dv)
  T* m;     // [Br]      m_i = max_s x_is · log₂e             (-inf: no key seen)
  T* l;     // [Br]      l_i = Σ_s 2^(x_is·log₂e − m_i)       (0: no key seen)
  T* m_lo;  // [Br]      the low part of m_i (0 unless |m_i| ≥ 2^digits)
};
template <class T>
Accumulator<T> accumulator_at(T* buf, int64_t br_max, int64_t Dv) {
  return {buf, buf + br_max * Dv, buf + br_max * Dv + br_max, buf + br_max * Dv + 2 * br_max};
}

// Whether a row max m (units of log₂) needs its low part: |m| ≥ kWideRow = 2^digits and finite.
template <class T>
constexpr T kWideRow = T(uint64_t(1) << std::numeric_limits<T>::digits);
template <class T>
inline bool wide_row(T m) {
  return std::fabs(m) >= kWideRow<T> && std::fabs(m) < std::numeric_limits<T>::infinity();
}

// The row max x_max in units of log₂ as m + m_lo (Accumulator): m = fl(x_max · c), and m_lo =
// x_max · c − m, exact (the error of a product is a T, and an FMA computes it without rounding), or
// 0 where m does not need it. A finite x_max whose product overflows (every score near -FLT_MAX,
// as a mask of finfo.min gives) keeps m = ∓max() and the rest in m_lo, rounded: its scores' other
// exponents are at least that far below 0, so they still come out 0.
template <class T>
inline void split_row_max(T x_max, T c, T& m, T& m_lo) {
  m = x_max * c;
  if (std::isinf(m) && std::isfinite(x_max)) m = std::copysign(std::numeric_limits<T>::max(), m);
  m_lo = wide_row(m) ? std::fma(x_max, c, -m) : T(0);
}

// One key block for all the query blocks of a task (flash_blocks_shared): k holds kᵀ for keys
// [s0, s0 + cols), packed once into our fp32 GEMM's panels (key j's column at k + j · D); v points
// at v[s0, :] in place, rows ldv apart (multiply_rows reads it unpacked: a copy of it cost 1.3 % of
// SDPA (8, 12, 512, 64) on Zen 5). The scores may use any first keys of k; P·V uses all `cols` keys
// of v. Each product runs the same operations in the same order as gemm_on_thread's: the same bits.
struct PackedBlock {
  const sgemm::Kernels* kern;
  const float* k;
  const float* v;
  int64_t ldv;
  int64_t cols;
};

// Tile step 1, the scores:  x[rows, cols] (row stride ldx) = scale · q_rows · k[s0 : s0+cols]ᵀ
// (one row: gemm runs a gemv; scale 1: the products alone, the scale folded into the exponent)
template <class T>
void tile_scores(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t i0, int64_t rows, int64_t s0,
                 int64_t cols, T scale, T* x, int64_t ldx, bool use_blas, const PackedBlock* packed) {
  const int64_t hk = qb.h / (a.num_heads / a.num_kv_heads);  // GQA: the key/value head of head h
  const T* q = a.q + qb.n * a.q_stride_n + qb.h * a.q_stride_h + (qb.l0 + i0) * a.q_stride_l;  // [rows, D]
  const T* k = a.k + qb.n * a.k_stride_n + hk * a.k_stride_h + s0 * a.k_stride_s;            // [cols, D]
  if constexpr (std::is_same_v<T, float>) {
    if (packed != nullptr && rows >= kGemmOnThreadMinRows) {  // as attention_scores, on the packed kᵀ
      for (int64_t j = 0; j < cols; j += kGemmOnThreadCols)
        packed->kern->multiply(rows, std::min(kGemmOnThreadCols, cols - j), a.head_dim, q, a.q_stride_l, 1,
                               packed->k + j * a.head_dim, x + j, ldx, false);
      scale_scores(rows, cols, scale, x, ldx);
      return;
    }
  }
  if (use_blas || a.head_dim == 0) {
    attention_scores(rows, cols, a.head_dim, scale, q, a.q_stride_l, k, a.k_stride_s, x, ldx);
  } else {
    small_qk(rows, cols, a.head_dim, scale, q, a.q_stride_l, k, a.k_stride_s, x, ldx);
  }
}

// Tile step 2, masks and the block's row max of query row l (keys s0 .. s0+vis-1 visible to the
// causal mask; the rest of the row is handled by the caller):  m̃ = max_j x_j
template <class T>
T tile_mask_row_max(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t l, int64_t s0, int64_t vis,
                    const uint8_t* valid, T* x) {
  if (a.bool_mask != nullptr || a.float_mask != nullptr) {
    apply_masks_row(a, qb.n, qb.h, l, s0, vis, x);
    return score_row_max(x, vis);
  }
  if (a.key_mask != nullptr) return mask_row_max(x, valid, vis);  // the padding mask fused with the max
  return score_row_max(x, vis);
}

// Tile steps 3 and 4, the online-softmax update of row i: x [cols] holds its scores, the first vis
// of them visible; x_j · c is score j in units of log₂, and m_blk = m̃ · c the block's row max in
// them (m̃ = x_max; m_blk_lo its low part, split_row_max). `first`: the first key block of the range
// (m, l, o not yet set).
template <class T>
void tile_softmax_row(T* x, int64_t vis, int64_t cols, T c, T m_blk, T m_blk_lo, const Accumulator<T>& acc,
                      int64_t i, int64_t Dv, bool first) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  // m_new = max(m_old, m̃), the pairs (m, m_lo) compared as the sums they stand for. All -inf so
  // far (no visible key yet): exponents taken relative to 0, so that every -inf gives 2^-inf = 0
  // and a NaN still gives NaN.
  const T m_old = acc.m[i], lo_old = acc.m_lo[i];  // both set by flash_block_start
  const bool take = m_blk > m_old || (m_blk == m_old && m_blk_lo > lo_old);
  const T m_new = take ? m_blk : m_old, lo_new = take ? m_blk_lo : lo_old;
  const T m_use = m_new == neg_inf ? T(0) : m_new;
  // p_j = 2^(x_j · c − m_new) in place, and Σ_j p_j   (causally masked columns vis .. cols-1: p = 0)
  const T p_sum = lo_new == T(0) ? exp2_row_sum(x, vis, c, m_use) : exp2_row_sum_wide(x, vis, c, m_use, lo_new);
  std::fill(x + vis, x + cols, T(0));
  acc.m[i] = m_new;
  acc.m_lo[i] = lo_new;
  if (first) {  // l = Σ p   (o is written by the P·V product, with beta = 0)
    acc.l[i] = p_sum;
    return;
  }
  // α = 2^(m_old − m_new);   l ← α·l + Σ p;   o ← α·o   (P·V is added next). With low parts, the
  // high parts' difference first (exact where they are close: Sterbenz), then the low parts'.
  const T alpha = lo_old == T(0) && lo_new == T(0) ? (m_old == m_use ? T(1) : std::exp2(m_old - m_use))
                                                   : std::exp2((m_old - m_use) + (lo_old - lo_new));
  if (alpha != T(1)) {
    T* oi = acc.o + i * Dv;
    for (int64_t j = 0; j < Dv; ++j) oi[j] *= alpha;
  }
  acc.l[i] = alpha * acc.l[i] + p_sum;
}

// Tile step 5:  o[rows, Dv] (+)= p[rows, cols] (row stride ldp) · v[s0 : s0+cols, Dv]
// (overwrites o on the first key block; one row: o (+)= vᵀ p, a gemv)
template <class T>
void tile_pv(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t rows, int64_t s0, int64_t cols,
             const T* p, int64_t ldp, T* o, bool first, bool use_blas, const PackedBlock* packed) {
  const int64_t Dv = a.v_head_dim;
  if (Dv == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (packed != nullptr && rows >= kGemmOnThreadMinRows && cols == packed->cols) {  // as gemm_on_thread
      packed->kern->multiply_rows(rows, Dv, cols, p, ldp, 1, packed->v, packed->ldv, o, Dv, !first);
      return;
    }
  }
  const int64_t hk = qb.h / (a.num_heads / a.num_kv_heads);
  const T* v = a.v + qb.n * a.v_stride_n + hk * a.v_stride_h + s0 * a.v_stride_s;  // [cols, Dv]
  if (use_blas) {
    gemm_on_thread(false, false, rows, Dv, cols, p, ldp, v, ld_for(a.v_stride_s, cols, Dv), o, Dv, !first);
  } else {
    small_pv(rows, cols, Dv, p, ldp, v, a.v_stride_s, !first, o);
  }
}

// Rows of the data a task reads next (flash_blocks_shared), asked into L2 a few rows at a time
// while the current tiles run, so that their first read does not wait on DRAM. SDPA (8, 12, 512,
// 64) on Zen 5: 5 % faster (the 50 MB of q, k, v and out pass through DRAM once); S = 4096: 1-2 %.
// All of them at once, before the tiles, gained nothing measurable: spread, they stay in flight.
struct Prefetcher {
  struct Range {
    const float* x;
    int64_t rows, stride, len;  // rows of `len` floats, `stride` apart
  };
  Range ranges[3];
  int count = 0, current = 0;
  int64_t row = 0, per_step = 1;
  void add(const float* x, int64_t rows, int64_t stride, int64_t len) {
    if (rows > 0 && len > 0) ranges[count++] = {x, rows, stride, len};
  }
  // spread over `steps` calls of step()
  void spread(int64_t steps) {
    int64_t rows = 0;
    for (int i = 0; i < count; ++i) rows += ranges[i].rows;
    per_step = std::max<int64_t>(1, (rows + steps - 1) / std::max<int64_t>(1, steps));
  }
  void step() {
    for (int64_t done = 0; done < per_step && current < count; ++done) {
      const Range& r = ranges[current];
      for (int64_t e = 0; e < r.len; e += 16) __builtin_prefetch(r.x + row * r.stride + e, 0, 2);
      if (++row == r.rows) row = 0, ++current;
    }
  }
};

// One query block × one key block (keys s0 .. s0+cols-1): the five steps above on every row.
// A block on the causal diagonal is done in groups of kDiagRows rows, each group's products cut at
// its own last visible key: about half the diagonal tile's work instead of all of it. On a packed
// key block the other blocks go in groups of kGroupRows rows (their scores stay in L1).
template <class T>
void flash_tile(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t s0, int64_t cols, int64_t bc,
                const Tile<T>& tile, const Accumulator<T>& acc, bool first, bool use_blas,
                const PackedBlock* packed = nullptr, Prefetcher* prefetch = nullptr) {
  const int64_t Dv = a.v_head_dim;
  // Causal: row l sees keys s ≤ l + causal_offset. The block is on the diagonal unless even its
  // first row sees its last key.
  const bool diagonal = a.is_causal && s0 + cols - 1 > qb.l0 + a.causal_offset;
  const bool key_mask_only = a.key_mask != nullptr && a.bool_mask == nullptr && a.float_mask == nullptr;
  // The scale joins log₂e in the exponent's factor c, unless a float mask is to be added to the
  // scaled scores or the scale is not a positive number (its max would not be the scaled max; 0
  // and NaN keep torch's rules, 0 · inf = NaN, by scaling first), or so large that scale · log₂e
  // would overflow.
  constexpr T log2e = T(1.44269504088896340736);
  const bool fold = a.float_mask == nullptr && a.scale > T(0) && a.scale < std::numeric_limits<T>::max() / log2e;
  const T c = fold ? a.scale * log2e : log2e, scale = fold ? T(1) : a.scale;
  if (key_mask_only) {  // valid[cols]: the key-padding mask of this block, contiguous
    const uint8_t* km = a.key_mask + qb.n * a.key_mask_stride_n + s0 * a.key_mask_stride_s;
    for (int64_t j = 0; j < cols; ++j) tile.valid[j] = km[j * a.key_mask_stride_s] != 0;
  }
  const int64_t group_rows = diagonal ? kDiagRows : (packed != nullptr ? kGroupRows : qb.rows);
  for (int64_t i0 = 0, rows = 0; i0 < qb.rows; i0 += rows) {
    rows = std::min(group_rows, qb.rows - i0);
    // a last group too short for our GEMM's kernels (tile_scores, tile_pv) joins this one
    if (qb.rows - i0 - rows < kGemmOnThreadMinRows) rows = qb.rows - i0;
    // the group's keys: those its last row sees (on the diagonal), else the whole block
    const int64_t g_cols =
        diagonal ? std::clamp<int64_t>(qb.l0 + i0 + rows + a.causal_offset - s0, 0, cols) : cols;
    T* o_g = acc.o + i0 * Dv;  // [rows, Dv]
    if (g_cols == 0) {         // the group sees no key of this block: it keeps its m, l, o
      if (first) std::fill(o_g, o_g + rows * Dv, T(0));
      continue;
    }
    T* x_g = tile.s + i0 * bc;  // [rows, g_cols] of the score tile (row stride Bc)
    tile_scores(a, qb, i0, rows, s0, g_cols, scale, x_g, bc, use_blas, packed);
    // Rows of the group kMaxRows at a time: first every row's max, then every row's exponentials.
    // Taken row by row, each row's exponentials waited on its max (a reduction) and the next row's
    // max on the exponentials' loop draining: 10.6 cycles a register of 16 scores on Zen 5, 8.3 so.
    for (int64_t i1 = i0; i1 < i0 + rows; i1 += kMaxRows) {
      const int64_t i_end = std::min(i0 + rows, i1 + kMaxRows);
      T m_blk[kMaxRows], m_lo[kMaxRows];
      int64_t vis[kMaxRows];
      for (int64_t i = i1; i < i_end; ++i) {  // x_i [g_cols]; visible (causal): the first vis
        const int64_t l = qb.l0 + i;
        vis[i - i1] = diagonal ? std::clamp<int64_t>(l + a.causal_offset + 1 - s0, 0, g_cols) : g_cols;
        const T x_max = tile_mask_row_max(a, qb, l, s0, vis[i - i1], tile.valid, tile.s + i * bc);
        split_row_max(x_max, c, m_blk[i - i1], m_lo[i - i1]);  // c > 0
      }
      for (int64_t i = i1; i < i_end; ++i) {
        tile_softmax_row(tile.s + i * bc, vis[i - i1], g_cols, c, m_blk[i - i1], m_lo[i - i1], acc, i, Dv, first);
        if (a.has_dropout()) dropout_probabilities_row(a, qb.n, qb.h, qb.l0 + i, s0, vis[i - i1], tile.s + i * bc);
        if (prefetch != nullptr) prefetch->step();
      }
    }
    tile_pv(a, qb, rows, s0, g_cols, x_g, bc, o_g, first, use_blas, packed);
  }
}

// The start of a query block's online softmax over keys [s_begin, s_end): m = -inf, l = 0 (and
// o = 0 when the block sees no key of the range). Returns the end of the keys it sees (≤ s_begin:
// none). Causal: the block's last row sees the most keys; nothing past them is read.
template <class T>
int64_t flash_block_start(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t s_begin, int64_t s_end,
                          const Accumulator<T>& acc) {
  if (a.is_causal) s_end = std::min(s_end, qb.l0 + qb.rows + a.causal_offset);
  std::fill(acc.m, acc.m + qb.rows, -std::numeric_limits<T>::infinity());  // m_i = -inf
  std::fill(acc.l, acc.l + qb.rows, T(0));                                  // l_i = 0
  std::fill(acc.m_lo, acc.m_lo + qb.rows, T(0));
  if (s_end <= s_begin) std::fill(acc.o, acc.o + qb.rows * a.v_head_dim, T(0));  // o_i = 0: no key in range
  return s_end;
}

// The online softmax of one query block against keys [s_begin, s_end), tile after tile. Leaves in
// `acc` the unnormalised state of the range (Accumulator, m in units of log₂):  m_i = max_s x_is·log₂e,
// l_i = Σ_s 2^(x_is·log₂e − m_i),  o_i = Σ_s 2^(x_is·log₂e − m_i) v_s   (m_i = -inf, l_i = 0, o_i = 0
// when row i sees no key of it).
template <class T>
void flash_block(const AttentionArgs<T>& a, const QueryBlock& qb, int64_t s_begin, int64_t s_end, int64_t bc,
                 const Tile<T>& tile, const Accumulator<T>& acc, bool use_blas) {
  s_end = flash_block_start(a, qb, s_begin, s_end, acc);
  for (int64_t s0 = s_begin; s0 < s_end; s0 += bc)
    flash_tile(a, qb, s0, std::min(bc, s_end - s0), bc, tile, acc, /*first=*/s0 == s_begin, use_blas);
}

// out_i = o_i / l_i   (zeros where l_i = 0: the row saw no key)
// lse_i = m_i · ln 2 + log l_i   (m_i in units of log₂; -inf where l_i = 0; NaN stays NaN; a wide
// row adds m_lo_i · ln 2: mostly below the precision of m_i · ln 2, but where x_max · c overflowed,
// m_i = ∓max() and m_lo_i holds a third of the row max)
template <class T>
void flash_store(const AttentionArgs<T>& a, const QueryBlock& qb, const Accumulator<T>& acc) {
  const int64_t Dv = a.v_head_dim;
  T* out = a.out + qb.n * a.o_stride_n + qb.h * a.o_stride_h + qb.l0 * a.o_stride_l;  // [rows, Dv]
  for (int64_t i = 0; i < qb.rows; ++i) {
    T* dst = out + i * a.o_stride_l;
    const T* src = acc.o + i * Dv;
    if (acc.l[i] == T(0)) {
      std::fill(dst, dst + Dv, T(0));
    } else {
      const T inv = T(1) / acc.l[i];
      for (int64_t j = 0; j < Dv; ++j) dst[j] = src[j] * inv;
    }
  }
  if (a.lse == nullptr) return;
  T* lse = a.lse + (qb.n * a.num_heads + qb.h) * a.q_len + qb.l0;  // [rows]
  for (int64_t i = 0; i < qb.rows; ++i) {
    constexpr T ln2 = T(0.69314718055994530942);
    if (acc.l[i] == T(0))
      lse[i] = -std::numeric_limits<T>::infinity();
    else if (wide_row(acc.m[i]))
      lse[i] = acc.m[i] * ln2 + (acc.m_lo[i] * ln2 + std::log(acc.l[i]));
    else
      lse[i] = acc.m[i] * ln2 + std::log(acc.l[i]);
  }
}

// Split-KV merge of one query block: the chunks' partial states, acc_c for keys chunk c, combine
// exactly into chunk 0's, per row i:
//   M = max_c m_c;   w_c = 2^(m_c − M);   l = Σ_c w_c·l_c;   o = Σ_c w_c·o_c;   m = M   (units of log₂)
// (M = -inf: no chunk saw a key; exponents relative to 0, so that w_c = 0 and NaN survives. Wide
// rows: each m_c with its low part, as tile_softmax_row.)
//   parts: [chunks, part_size], each an Accumulator buffer (o [Br, Dv] | m [Br] | l [Br] | m_lo [Br])
template <class T>
Accumulator<T> flash_merge(T* parts, int64_t chunks, int64_t part_size, int64_t br_max, int64_t rows,
                           int64_t Dv) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const Accumulator<T> acc = accumulator_at(parts, br_max, Dv);
  for (int64_t i = 0; i < rows; ++i) {
    T M = neg_inf, M_lo = 0;
    bool wide = false;
    for (int64_t c = 0; c < chunks; ++c) {
      const Accumulator<T> part = accumulator_at(parts + c * part_size, br_max, Dv);
      const T mc = part.m[i], lo = part.m_lo[i];
      if (mc > M || (mc == M && lo > M_lo)) {
        M = mc;
        M_lo = lo;
      }
      wide = wide || lo != T(0);
    }
    const T M_use = M == neg_inf ? T(0) : M;
    const auto weight = [&](T mc, T lo) { return wide ? std::exp2((mc - M_use) + (lo - M_lo)) : std::exp2(mc - M_use); };
    T* oi = acc.o + i * Dv;
    const T w0 = weight(acc.m[i], acc.m_lo[i]);
    T l = w0 * acc.l[i];
    for (int64_t j = 0; j < Dv; ++j) oi[j] *= w0;
    for (int64_t c = 1; c < chunks; ++c) {
      const Accumulator<T> part = accumulator_at(parts + c * part_size, br_max, Dv);
      const T wc = weight(part.m[i], part.m_lo[i]);
      l += wc * part.l[i];
      const T* oc = part.o + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) oi[j] += wc * oc[j];
    }
    acc.m[i] = M;
    acc.m_lo[i] = M_lo;
    acc.l[i] = l;
  }
  return acc;
}

// ---- the three ways to run the plan ----------------------------------------------------------

// S = 0: nothing to attend to. out = 0, lse = -inf.
template <class T>
void flash_no_keys(const AttentionArgs<T>& a) {
  const int64_t H = a.num_heads, L = a.q_len, Dv = a.v_head_dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, L * Dv));
  parallel_for(0, a.batch * H, grain, [&](int64_t b, int64_t e) {
    for (int64_t nh = b; nh < e; ++nh) {
      T* out = a.out + (nh / H) * a.o_stride_n + (nh % H) * a.o_stride_h;
      for (int64_t i = 0; i < L; ++i) std::fill(out + i * a.o_stride_l, out + i * a.o_stride_l + Dv, T(0));
      if (a.lse != nullptr) std::fill(a.lse + nh * L, a.lse + (nh + 1) * L, -std::numeric_limits<T>::infinity());
    }
  });
}

// plan.small: each query block's tile and state in a stack buffer of kStackElems (s [Br, Bc] |
// o [Br, Dv] | m [Br] | l [Br] | m_lo [Br]), the products as plain loops; the blocks on the calling thread when
// plan.serial, otherwise shared out by parallel_tasks.
template <class T>
void flash_small(const AttentionArgs<T>& a, const FlashPlan& p) {
  auto task = [&](int64_t b, int) {
    alignas(64) T buf[kStackElems];
    alignas(64) uint8_t valid[kStackElems];
    const Tile<T> tile{buf, valid};
    const Accumulator<T> acc = accumulator_at(buf + p.block_rows * p.block_keys, p.block_rows, a.v_head_dim);
    const QueryBlock qb = query_block(p, a.num_heads, a.q_len, b);
    flash_block(a, qb, 0, a.kv_len, p.block_keys, tile, acc, /*use_blas=*/false);
    flash_store(a, qb, acc);
  };
  run_tasks(p.serial, p.tasks, task);
}

// Buffers are AlignedVectors (they start on a 64-byte boundary) and every per-thread / per-task part
// of them is padded to 64 bytes, so that no part's alignment (and with it no SIMD path inside BLAS)
// depends on which thread runs it.
template <class T>
constexpr int64_t kPad = 64 / int64_t(sizeof(T));  // elements per 64 bytes
template <class T>
int64_t pad64(int64_t elems) {
  return (elems + kPad<T> - 1) / kPad<T> * kPad<T>;
}

// Per-thread tiles, allocated once per call: s [Br, Bc] | o [Br, Dv] | m, l, m_lo [Br] for each
// thread, and valid [Bc] for each thread.
template <class T>
class ThreadTiles {
 public:
  ThreadTiles(const FlashPlan& p, int64_t Dv, int num_threads)
      : bc_(p.block_keys), br_(p.block_rows), dv_(Dv), per_thread_(pad64<T>(br_ * (bc_ + Dv + 3))),
        scratch_(size_t(per_thread_ * num_threads)), valid_(size_t(bc_ * num_threads)) {}
  Tile<T> tile(int tid) { return {scratch_.data() + tid * per_thread_, valid_.data() + tid * bc_}; }
  Accumulator<T> accumulator(int tid) {
    return accumulator_at(scratch_.data() + tid * per_thread_ + br_ * bc_, br_, dv_);
  }

 private:
  int64_t bc_, br_, dv_, per_thread_;
  AlignedVector<T> scratch_;
  std::vector<uint8_t> valid_;
};

// fp32 with our GEMM, several query blocks per head: a task takes up to kSharedQueryBlocks query
// blocks of one head and packs each key block once for all of them (PackedBlock), instead of once
// per query block inside every product (SDPA (1, 12, 4096, 64): the packing went from 8 % of the
// time to 1 %). Each query block runs the same tiles in the same order as flash_block: the same bits.
constexpr int64_t kSharedQueryBlocks = 4;

inline bool can_share_key_blocks(const AttentionArgs<float>& a, const FlashPlan& p) {
  return p.query_blocks > 1 && a.head_dim >= 1 && a.v_head_dim >= 1 && a.head_dim <= kGemmOnThreadDepth &&
         p.block_keys <= kGemmOnThreadDepth && a.v_head_dim <= kGemmOnThreadCols;
}

inline void flash_blocks_shared(const AttentionArgs<float>& a, const FlashPlan& p, const sgemm::Kernels& kern) {
  const int64_t G = std::min(kSharedQueryBlocks, p.query_blocks);
  const int64_t groups = (p.query_blocks + G - 1) / G, heads = p.tasks / p.query_blocks;  // heads: N · H
  const int64_t D = a.head_dim, Dv = a.v_head_dim, bc = p.block_keys;
  const int threads = std::max(1, get_num_threads());
  ThreadTiles<float> tiles(p, Dv, threads);  // the score tiles
  // per thread: G accumulators | packed kᵀ
  const int64_t acc_size = pad64<float>(p.block_rows * (Dv + 3));
  const int64_t k_size = pad64<float>(sgemm::packed_floats(D, bc));
  const int64_t per_thread = G * acc_size + k_size;
  AlignedVector<float> buf(size_t(per_thread * threads));
  float* base = buf.data();
  parallel_tasks(heads * groups, [&](int64_t t, int tid) {
    const int64_t nh = t / groups, b0 = (t % groups) * G, count = std::min(G, p.query_blocks - b0);
    float* mine = base + tid * per_thread;
    float* packed_k = mine + G * acc_size;
    QueryBlock qbs[kSharedQueryBlocks];
    Accumulator<float> accs[kSharedQueryBlocks];
    int64_t ends[kSharedQueryBlocks];
    int64_t s_max = 0;
    for (int64_t c = 0; c < count; ++c) {
      qbs[c] = query_block(p, a.num_heads, a.q_len, nh * p.query_blocks + b0 + c);
      accs[c] = accumulator_at(mine + c * acc_size, p.block_rows, Dv);
      ends[c] = flash_block_start(a, qbs[c], 0, a.kv_len, accs[c]);
      s_max = std::max(s_max, ends[c]);
    }
    const int64_t hk = qbs[0].h / (a.num_heads / a.num_kv_heads);
    const float* k = a.k + qbs[0].n * a.k_stride_n + hk * a.k_stride_h;
    const float* v = a.v + qbs[0].n * a.v_stride_n + hk * a.v_stride_h;
    for (int64_t s0 = 0; s0 < s_max; s0 += bc) {
      const int64_t cols = std::min(bc, s_max - s0);
      kern.pack_b(D, cols, k + s0 * a.k_stride_s, 1, ld_for(a.k_stride_s, cols, D), packed_k);
      const PackedBlock packed{&kern, packed_k, v + s0 * a.v_stride_s, ld_for(a.v_stride_s, cols, Dv), cols};
      // while this key block runs: the next one's keys and values, or after the last one, the
      // next task's queries and first key block (a thread's next task is most often t + 1)
      Prefetcher pf;
      if (s0 + bc < s_max) {
        const int64_t next = std::min(bc, s_max - s0 - bc);
        pf.add(k + (s0 + bc) * a.k_stride_s, next, a.k_stride_s, D);
        pf.add(v + (s0 + bc) * a.v_stride_s, next, a.v_stride_s, Dv);
      } else if (t + 1 < heads * groups) {
        const int64_t nh1 = (t + 1) / groups, n1 = nh1 / a.num_heads, h1 = nh1 % a.num_heads;
        const int64_t l1 = ((t + 1) % groups) * G * p.block_rows, rows1 = std::min(G * p.block_rows, a.q_len - l1);
        const int64_t hk1 = h1 / (a.num_heads / a.num_kv_heads), keys1 = std::min(bc, a.kv_len);
        pf.add(a.q + n1 * a.q_stride_n + h1 * a.q_stride_h + l1 * a.q_stride_l, rows1, a.q_stride_l, D);
        pf.add(a.k + n1 * a.k_stride_n + hk1 * a.k_stride_h, keys1, a.k_stride_s, D);
        pf.add(a.v + n1 * a.v_stride_n + hk1 * a.v_stride_h, keys1, a.v_stride_s, Dv);
      }
      pf.spread(count * p.block_rows);  // a share after each row's softmax
      for (int64_t c = 0; c < count; ++c)
        if (s0 < ends[c])
          flash_tile(a, qbs[c], s0, std::min(bc, ends[c] - s0), bc, tiles.tile(tid), accs[c], /*first=*/s0 == 0,
                     /*use_blas=*/true, &packed, &pf);
    }
    for (int64_t c = 0; c < count; ++c) flash_store(a, qbs[c], accs[c]);
  }, threads);
}

// plan.kv_chunks = 1: one task = one query block against all its keys (or, fp32, up to
// kSharedQueryBlocks of them: flash_blocks_shared); parallel_tasks balances the causal triangle (later
// blocks see more keys): a thread that finishes its own share takes tasks from the others'.
template <class T>
void flash_blocks(const AttentionArgs<T>& a, const FlashPlan& p) {
  if constexpr (std::is_same_v<T, float>) {
    if (const sgemm::Kernels* kern = sgemm::active(); kern != nullptr && can_share_key_blocks(a, p))
      return flash_blocks_shared(a, p, *kern);
  }
  const int threads = std::max(1, get_num_threads());
  ThreadTiles<T> tiles(p, a.v_head_dim, threads);
  parallel_tasks(p.tasks, [&](int64_t b, int tid) {
    const QueryBlock qb = query_block(p, a.num_heads, a.q_len, b);
    const Accumulator<T> acc = tiles.accumulator(tid);
    flash_block(a, qb, 0, a.kv_len, p.block_keys, tiles.tile(tid), acc, /*use_blas=*/true);
    flash_store(a, qb, acc);
  }, threads);
}

// plan.kv_chunks > 1 (split-KV): task (query block b, chunk c) leaves the partial state of keys
// [c · chunk_len, (c+1) · chunk_len) in `partial` [blocks, chunks, part_size] (part_size: Br · (Dv + 3)
// padded to 64 bytes); then each query block merges its chunks (in chunk order) and stores.
template <class T>
void flash_split_kv(const AttentionArgs<T>& a, const FlashPlan& p) {
  const int64_t chunks = p.kv_chunks, blocks = p.tasks / chunks;
  const int64_t part_size = pad64<T>(p.block_rows * (a.v_head_dim + 3));
  const int threads = std::max(1, get_num_threads());
  ThreadTiles<T> tiles(p, a.v_head_dim, threads);
  AlignedVector<T> partial_buf(size_t(p.tasks * part_size));
  T* partial = partial_buf.data();
  parallel_tasks(p.tasks, [&](int64_t task, int tid) {
    const int64_t b = task / chunks, c = task % chunks;
    const QueryBlock qb = query_block(p, a.num_heads, a.q_len, b);
    const int64_t s_begin = c * p.kv_chunk_len, s_end = std::min(a.kv_len, s_begin + p.kv_chunk_len);
    const Accumulator<T> acc = accumulator_at(partial + task * part_size, p.block_rows, a.v_head_dim);
    flash_block(a, qb, s_begin, s_end, p.block_keys, tiles.tile(tid), acc, /*use_blas=*/true);
  }, threads);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, chunks * part_size));
  parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const QueryBlock qb = query_block(p, a.num_heads, a.q_len, b);
      T* parts = partial + b * chunks * part_size;
      flash_store(a, qb, flash_merge(parts, chunks, part_size, p.block_rows, qb.rows, a.v_head_dim));
    }
  });
}

// Decoding with grouped keys and values (GQA, MQA: g = num_heads / num_kv_heads > 1, one query
// row): the g query heads that share a key/value head become the g rows of one query block, so that
// each key and value is read once for all of them instead of once per head. Row r of head hk is
// head hk · g + r; with one query row every mask reads row 0, so a mask's head stride becomes its
// row stride. Under is_causal that row sees keys s ≤ causal_offset: the keys after it are cut
// instead (the rows of a block would otherwise get shifted causal limits). Returns false, leaving
// `a` as it was, where nothing is to be gained or no key is visible.
template <class T>
bool fold_grouped_heads(AttentionArgs<T>& a) {
  const int64_t g = a.num_heads / a.num_kv_heads;
  // (not with dropout: its mask is indexed by the unfolded (n, h, l, s))
  if (a.q_len != 1 || g == 1 || (a.is_causal && a.causal_offset < 0) || a.has_dropout()) return false;
  if (a.is_causal) {
    a.kv_len = std::min(a.kv_len, a.causal_offset + 1);
    a.is_causal = false;
  }
  a.q_stride_l = a.q_stride_h;
  a.q_stride_h *= g;
  a.o_stride_l = a.o_stride_h;
  a.o_stride_h *= g;
  a.bool_mask_strides[2] = a.bool_mask_strides[1];
  a.bool_mask_strides[1] *= g;
  a.float_mask_strides[2] = a.float_mask_strides[1];
  a.float_mask_strides[1] *= g;
  a.num_heads = a.num_kv_heads;
  a.q_len = g;  // lse [N, H, 1] is [N, H_kv, g]: the same memory
  return true;
}

}  // namespace flash_detail

// attention_flash: the tiled kernel. Computes what attention_reference computes (out, and lse when
// a.lse is set), except `a.weights`, which it never writes.
template <class T>
void attention_flash(const AttentionArgs<T>& a) {
  using namespace flash_detail;
  if (a.batch == 0 || a.num_heads == 0 || a.q_len == 0) return;  // nothing to write
  if (a.v_head_dim == 0 && a.lse == nullptr) return;
  if (a.kv_len == 0) return flash_no_keys(a);
  AttentionArgs<T> folded = a;
  const AttentionArgs<T>& b = fold_grouped_heads(folded) ? folded : a;
  const FlashPlan p = flash_plan(b.batch, b.num_heads, b.q_len, b.kv_len, b.head_dim, b.v_head_dim);
  if (p.small) return flash_small(b, p);
  if (p.kv_chunks == 1) return flash_blocks(b, p);
  flash_split_kv(b, p);
}

// Sequences of different lengths packed end to end, without padding (FlashAttention's
// variable-length form, its cu_seqlens): sequence n is rows [starts[n], starts[n + 1]) of q, k, v
// and out (row strides q_stride_l, k_stride_s, v_stride_s, o_stride_l; the _stride_n members are
// not read), and its queries attend to its own keys only (with is_causal: key s ≤ query l, counted
// from the sequence's first row). a.batch sequences; q_len and kv_len are not read; no other mask,
// no weights, no lse. A batch of sentences so skips the padding's rows, their copies and their
// masked scores.
// Tasks are (sequence, head, query block), with the tiles of the longest sequence: Br = min(128,
// longest) and Bc = min(256, longest) cut each sequence as they would cut it alone (blocks of 128
// rows and 256 keys), so a sequence's output does not depend on the rest of the batch, bit for bit.
//
// varlen_sequence: the arguments of sequence n alone (batch 1, its length), for either path.
template <class T>
AttentionArgs<T> varlen_sequence(const AttentionArgs<T>& a, const int64_t* starts, int64_t n) {
  AttentionArgs<T> s = a;
  const int64_t row0 = starts[n];
  s.q += row0 * a.q_stride_l, s.k += row0 * a.k_stride_s, s.v += row0 * a.v_stride_s, s.out += row0 * a.o_stride_l;
  s.batch = 1, s.q_len = s.kv_len = starts[n + 1] - row0, s.causal_offset = 0;
  return s;
}

namespace flash_detail {

// ---- short sequences: one tile, no online softmax ----------------------------------------------
// A sentence of a few dozen tokens is one query block against one key block. The online softmax's
// bookkeeping (running max, rescaling, the accumulator) and its row passes then cost more than the
// two products: MiniLM, 28 tokens, head_dim 32, flash_tile's row passes took half the attention's
// time, each row's max and sum a reduction across SIMD lanes. A head of a sequence of
// len ≤ kShortLen tokens (fp32, our GEMM) instead computes its scores transposed, one column per
// query, so that the softmax runs down the columns, a query per SIMD lane, with no reduction
// across lanes:
//   1. qᵀ packed into panels;   xᵀ = k · qᵀ                    [len keys, Lp queries] (Lp: len
//      rounded up to kShortLanes; the padding queries are zeros, their columns unused)
//   2. down each column i:      (is_causal: x_ji ← -inf for keys j > i)
//                               m_i = max_j x_ji · c,  p_ji = 2^(x_ji · c − m_i),  p_ji ← p_ji / Σ_j p_ji
//                               (c = scale · log₂e; the scores scaled first when scale ≤ 0, c = log₂e)
//   3. v packed into panels;    out = p · v       (A = pᵀ read with strides: no transpose back)
// The same exponent and exp2 polynomial as flash_tile, the sum in key order; out = (p / l) · v
// rather than (p · v) / l. One thread, 32 sequences × 12 heads, head_dim 32 (Zen 5), µs a head:
//   28 tokens 1.75 → 0.81,   64 tokens 4.90 → 3.40,   100 tokens 14.3 → 12.1,   128 tokens 18.5 → 16.3
// kShortLen = Br: every short sequence is one query block of the tiled kernel too.
constexpr int64_t kShortLen = 128;
constexpr int64_t kShortLanes = 16;  // Lp: a multiple of every ISA's register of floats

inline int64_t short_padded(int64_t len) { return (len + kShortLanes - 1) / kShortLanes * kShortLanes; }

// Per-thread buffers of the short path: packed qᵀ | packed v | scores [kShortLen, kShortLen].
inline int64_t short_scratch_floats(int64_t D, int64_t Dv) {
  return pad64<float>(sgemm::packed_floats(D, kShortLen)) + pad64<float>(sgemm::packed_floats(kShortLen, Dv)) +
         kShortLen * kShortLen;
}

// Step 2 on xᵀ [len, Lp] (row stride Lp): column i becomes query i's probabilities, a register of
// queries at a time. A query that sees no finite score (every one -inf) gets zeros; a NaN score
// makes its column NaN.
inline void short_softmax_columns(float* x, int64_t len, int64_t Lp, float scale, bool causal) {
  using B = xsimd::batch<float>;
  constexpr int64_t W = B::size;
  static_assert(kShortLanes % W == 0, "Lp must hold whole registers");
  alignas(64) float lanes[W];
  for (int64_t t = 0; t < W; ++t) lanes[t] = static_cast<float>(t);
  const B lane = B::load_aligned(lanes), neg_inf(-std::numeric_limits<float>::infinity()), zero(0.0f);
  // as flash_tile: the scale folded into the exponent's factor c when it is a positive number
  // (and scale · log₂e finite)
  const bool fold = scale > 0.0f && scale < std::numeric_limits<float>::max() / 1.44269504088896341f;
  const B c(fold ? scale * 1.44269504088896341f : 1.44269504088896341f);
  for (int64_t c0 = 0; c0 < Lp; c0 += W) {
    float* xc = x + c0;  // queries c0 .. c0 + W - 1
    B m = neg_inf;
    for (int64_t j = 0; j < len; ++j) {
      B v = B::load_unaligned(xc + j * Lp);
      if (!fold) v = v * B(scale);
      if (causal) v = xsimd::select(lane < B(static_cast<float>(j - c0)), neg_inf, v);  // query c0 + t < key j
      if (!fold || causal) v.store_unaligned(xc + j * Lp);
      m = xsimd::max(m, v);
    }
    // m · c, as split_row_max: a finite m whose product overflows keeps ∓max() and the rest in lo
    const B inf(std::numeric_limits<float>::infinity());
    B mc = m * c;
    mc = xsimd::select(xsimd::abs(mc) == inf && xsimd::abs(m) < inf, xsimd::copysign(B(std::numeric_limits<float>::max()), mc), mc);
    const B neg_m = -xsimd::select(m == neg_inf, zero, mc);  // units of log₂; no key: every p is 0
    // wide rows (Accumulator): the exponents relative to m · c exactly, its low part subtracted
    const auto wide = xsimd::abs(mc) >= B(kWideRow<float>) && xsimd::abs(mc) < inf;
    const bool any_wide = xsimd::any(wide);
    const B lo = any_wide ? xsimd::select(wide, simd::fma(m, c, -mc), zero) : zero;
    B l = zero;
    for (int64_t j = 0; j < len; ++j) {
      B t = simd::fma(B::load_unaligned(xc + j * Lp), c, neg_m);
      if (any_wide) t = t - lo;  // 0 in the other lanes: their exponents unchanged
      const B e = exp2_nonpos(t);
      e.store_unaligned(xc + j * Lp);
      l += e;
    }
    const B inv = xsimd::select(l == zero, zero, B(1.0f) / l);  // l = 0: every p is 0
    for (int64_t j = 0; j < len; ++j) (B::load_unaligned(xc + j * Lp) * inv).store_unaligned(xc + j * Lp);
  }
}

// Head h of sequence s (varlen_sequence's arguments: batch 1, q_len = kv_len = len ≤ kShortLen).
inline void short_head(const AttentionArgs<float>& s, int64_t h, const sgemm::Kernels& kern, float* scratch) {
  const int64_t len = s.q_len, D = s.head_dim, Dv = s.v_head_dim, Lp = short_padded(len);
  const int64_t hk = h / (s.num_heads / s.num_kv_heads);
  const float* q = s.q + h * s.q_stride_h;
  const float* k = s.k + hk * s.k_stride_h;
  const float* v = s.v + hk * s.v_stride_h;
  float* packed_q = scratch;
  float* packed_v = packed_q + pad64<float>(sgemm::packed_floats(D, kShortLen));
  float* x = packed_v + pad64<float>(sgemm::packed_floats(kShortLen, Dv));  // xᵀ [len, Lp]
  kern.pack_b(D, len, q, 1, s.q_stride_l, packed_q);
  kern.multiply(len, Lp, D, k, s.k_stride_s, 1, packed_q, x, Lp, false);
  short_softmax_columns(x, len, Lp, s.scale, s.is_causal);
  kern.pack_b(len, Dv, v, s.v_stride_s, 1, packed_v);
  kern.multiply(len, Dv, len, x, 1, Lp, packed_v, s.out + h * s.o_stride_h, s.o_stride_l, false);
}

}  // namespace flash_detail

template <class T>
void attention_flash_varlen(const AttentionArgs<T>& a, const int64_t* starts) {
  using namespace flash_detail;
  const int64_t N = a.batch, H = a.num_heads;
  int64_t longest = 0;
  for (int64_t n = 0; n < N; ++n) longest = std::max(longest, starts[n + 1] - starts[n]);
  if (longest == 0 || a.v_head_dim == 0) return;
  const FlashPlan p = flash_plan(1, H, longest, longest, a.head_dim, a.v_head_dim);
  // fp32 sequences of at most kShortLen tokens take the short path (a choice made by the length
  // alone, so a sequence's bits still do not depend on the others)
  const sgemm::Kernels* kern = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (a.head_dim >= 1 && a.head_dim <= kGemmOnThreadDepth && a.v_head_dim <= kGemmOnThreadDepth)
      kern = sgemm::active();
  }
  // first_task[n]: the tasks of the sequences before n (each: H · ⌈len / Br⌉ query blocks)
  std::vector<int64_t> first_task(static_cast<size_t>(N + 1), 0);
  double flops = 0;
  bool any_short = false;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t len = starts[n + 1] - starts[n];
    first_task[n + 1] = first_task[n] + H * ((len + p.block_rows - 1) / p.block_rows);
    flops += 2.0 * double(H) * double(len) * double(len) * double(a.head_dim + a.v_head_dim);
    any_short = any_short || (len > 0 && len <= kShortLen);
  }
  const int threads = std::max(1, get_num_threads());
  const int64_t short_size =
      kern != nullptr && any_short ? pad64<float>(short_scratch_floats(a.head_dim, a.v_head_dim)) : 0;
  AlignedVector<T> short_buf(size_t(short_size * threads));
  ThreadTiles<T> tiles(p, a.v_head_dim, threads);
  run_tasks(flops < kInlineFlops, first_task[N], [&](int64_t t, int tid) {
    const int64_t n = std::upper_bound(first_task.begin(), first_task.end(), t) - first_task.begin() - 1;
    const AttentionArgs<T> s = varlen_sequence(a, starts, n);
    const int64_t len = s.q_len;
    if constexpr (std::is_same_v<T, float>) {
      if (short_size > 0 && len <= kShortLen)
        return short_head(s, t - first_task[n], *kern, short_buf.data() + tid * short_size);
    }
    const int64_t blocks = (len + p.block_rows - 1) / p.block_rows, local = t - first_task[n];
    const int64_t l0 = (local % blocks) * p.block_rows;
    const QueryBlock qb{0, local / blocks, l0, std::min(p.block_rows, len - l0)};
    const Accumulator<T> acc = tiles.accumulator(tid);
    flash_block(s, qb, 0, len, p.block_keys, tiles.tile(tid), acc, /*use_blas=*/true);
    flash_store(s, qb, acc);
  }, threads);
}

}  // namespace transformer_core::kernels
