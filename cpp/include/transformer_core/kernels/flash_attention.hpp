// Tiled scaled dot-product attention with an online softmax (FlashAttention-2: Dao 2023, alg. 1;
// Milakov & Gimelshein 2018 for the online softmax). Same result as attention_reference, in
// O(tile) extra memory instead of the [L, S] score matrix:
//
//   Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V
//
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out: [N, H, L, D_v]
//
// The [L, S] product is cut into tiles of Br query rows × Bc keys. For one query block, the key
// blocks are visited in order, keeping per row i a running max m_i, a running sum l_i and an
// unnormalised accumulator o_i = Σ_s exp(x_is - m_i) v_s; each new block rescales what came before
// by exp(m_old - m_new), and the row is divided by l_i once at the end. Both tile products are GEMMs
// (OpenBLAS, single-threaded inside our parallel region).
//
// Parallel over (n, h, query block) tasks; when they are too few to keep the threads busy (decoding:
// L = 1), the keys are also split into chunks whose partial (m, l, o) triples are merged exactly.
//
// Masks, GQA, fully masked rows (zeros), NaN (propagates to the row), S = 0 (zeros): as in
// attention.hpp. `a.weights` is never written: callers who want the weights use the reference path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "transformer_core/kernels/attention.hpp"
#include "transformer_core/kernels/fast_math.hpp"
#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

namespace flash_detail {

using fast_math::exp_nonpos;

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
//   * Blocks on the causal diagonal are cut into kDiagRows-row GEMMs (see flash_block), so a tall
//     Br costs little extra work on causal masks.
constexpr int64_t kBlockRows = 128;  // Br
constexpr int64_t kBlockKeys = 256;  // Bc
// One query row (decoding): the tile is [1, Bc], so a long key block costs nothing and saves calls.
constexpr int64_t kBlockKeysOneRow = 2048;
// Rows per GEMM on a block that straddles the causal diagonal (see flash_block).
constexpr int64_t kDiagRows = 32;
// Below this many flops (≈ 10 µs of work) the whole call runs on the calling thread, from a stack
// buffer of kStackElems elements when one tile fits in it: no heap, no parallel region, no BLAS.
constexpr double kSerialFlops = double(1 << 18);
constexpr int64_t kStackElems = 4096;
// Key splitting (decoding): aim for at least max(kMinTasks, 2 · threads) tasks, each chunk of keys
// at least kMinChunk long. Up to 8 threads the split depends on the shape only, so the result is
// the same bit for bit whatever the thread count.
constexpr int64_t kMinTasks = 16;
constexpr int64_t kMinChunk = 512;

// exp_nonpos: kernels/fast_math.hpp

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

// x[j] = exp(x[j] - m) in place, returns Σ_j x[j]. 16 partial sums so the loop vectorises (and
// the order of the sum does not depend on anything but n).
template <class T>
inline T exp_row_sum(T* x, int64_t n, T m) {
  constexpr int64_t W = 16;
  T lane[W] = {};
  int64_t j = 0;
  for (; j + W <= n; j += W)
    for (int64_t t = 0; t < W; ++t) {
      const T e = exp_nonpos(x[j + t] - m);
      x[j + t] = e;
      lane[t] += e;
    }
  T sum = 0;
  for (; j < n; ++j) {
    const T e = exp_nonpos(x[j] - m);
    x[j] = e;
    sum += e;
  }
  for (int64_t t = 0; t < W; ++t) sum += lane[t];
  return sum;
}

// cblas wants ld ≥ the row length even when there is a single row, where ld is never used.
inline int64_t ld_for(int64_t ld, int64_t rows, int64_t cols) {
  return rows <= 1 ? std::max<int64_t>({ld, cols, 1}) : ld;
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

// One thread's tile buffers.
template <class T>
struct Tile {
  T* s = nullptr;            // [Br, Bc]  scores, then probabilities
  uint8_t* valid = nullptr;  // [Bc]      key_mask of the current key block, made contiguous
};

// The online softmax of one query block against one range of keys.
//   rows l0 .. l0+br-1 of head (n, h), keys [s_begin, s_end)
//   o: [br, Dv] (row stride Dv)  m, l: [br]   the unnormalised result:
//      m_i = max_s x_is,   l_i = Σ_s exp(x_is - m_i),   o_i = Σ_s exp(x_is - m_i) v_s
//   (m_i = -inf, l_i = 0, o_i = 0 when row i sees no key of the range)
template <class T>
void flash_block(const AttentionArgs<T>& a, int64_t n, int64_t h, int64_t l0, int64_t br,
                 int64_t s_begin, int64_t s_end, int64_t bc, const Tile<T>& tile, T* o, T* m, T* l,
                 bool use_blas = true) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t D = a.head_dim, Dv = a.v_head_dim;
  const int64_t hk = h / (a.num_heads / a.num_kv_heads);  // GQA: the key/value head of query head h
  const T* q = a.q + n * a.q_stride_n + h * a.q_stride_h + l0 * a.q_stride_l;  // [br, D]
  const T* k = a.k + n * a.k_stride_n + hk * a.k_stride_h;                     // [S, D]
  const T* v = a.v + n * a.v_stride_n + hk * a.v_stride_h;                     // [S, Dv]
  const bool generic_masks = a.bool_mask != nullptr || a.float_mask != nullptr;
  const bool key_mask_only = a.key_mask != nullptr && !generic_masks;

  // Causal: row l sees keys s ≤ l + causal_offset, so the block's last row sees the most.
  if (a.is_causal) s_end = std::min(s_end, l0 + br + a.causal_offset);

  for (int64_t i = 0; i < br; ++i) {  // m_i = -inf, l_i = 0
    m[i] = neg_inf;
    l[i] = T(0);
  }
  bool first = true;  // o not yet written: the first P·V product overwrites it (beta = 0)
  for (int64_t s0 = s_begin; s0 < s_end; s0 += bc) {
    // Keys [s0, s0 + cols) of this block; with a causal mask, row i sees the first vis_i of them,
    // the last row the most (cols), so columns beyond cols are masked for every row.
    const int64_t cols = std::min(bc, s_end - s0);
    // A block is fully visible when even the first row sees its last key: no causal work.
    const bool causal_here = a.is_causal && s0 + cols - 1 > l0 + a.causal_offset;
    if (key_mask_only) {
      const uint8_t* km = a.key_mask + n * a.key_mask_stride_n + s0 * a.key_mask_stride_s;
      for (int64_t j = 0; j < cols; ++j) tile.valid[j] = km[j * a.key_mask_stride_s] != 0;
    }
    // A block on the causal diagonal is done in groups of kDiagRows rows, each group's products
    // cut at its own last visible key: about half the diagonal tile's work instead of all of it.
    const int64_t group_rows = causal_here ? kDiagRows : br;
    for (int64_t i0 = 0; i0 < br; i0 += group_rows) {
      const int64_t rows = std::min(group_rows, br - i0);
      const int64_t g_cols =
          causal_here ? std::clamp<int64_t>(l0 + i0 + rows + a.causal_offset - s0, 0, cols) : cols;
      T* o_g = o + i0 * Dv;  // [rows, Dv]
      if (g_cols == 0) {     // the group sees no key of this block: it keeps its m, l, o
        if (first) std::fill(o_g, o_g + rows * Dv, T(0));
        continue;
      }
      T* x_g = tile.s + i0 * bc;  // [rows, g_cols] of the score tile (row stride Bc)
      const T* q_g = q + i0 * a.q_stride_l;
      const T* k_b = k + s0 * a.k_stride_s;  // [g_cols, D]
      const T* v_b = v + s0 * a.v_stride_s;  // [g_cols, Dv]

      // x[rows, g_cols] = scale · q[rows, D] · k[s0 : s0+g_cols, D]ᵀ    (one row: gemm runs a gemv)
      if (D == 0) {
        for (int64_t i = 0; i < rows; ++i) std::fill(x_g + i * bc, x_g + i * bc + g_cols, T(0));
      } else if (!use_blas) {
        small_qk(rows, g_cols, D, a.scale, q_g, a.q_stride_l, k_b, a.k_stride_s, x_g, bc);
      } else {
        gemm(false, true, rows, g_cols, D, a.scale, q_g, a.q_stride_l, k_b,
             ld_for(a.k_stride_s, g_cols, D), T(0), x_g, bc);
      }

      for (int64_t i = i0; i < i0 + rows; ++i) {
        T* x = tile.s + i * bc;  // x_i[g_cols]
        const int64_t vis =
            causal_here ? std::clamp<int64_t>(l0 + i + a.causal_offset + 1 - s0, 0, g_cols) : g_cols;
        // Masks, then the block's row max  m̃ = max_j x_ij  (fused for the key-padding mask)
        T m_blk;
        if (generic_masks) {
          apply_masks_row(a, n, h, l0 + i, s0, vis, x);
          m_blk = row_max(x, vis);
        } else if (key_mask_only) {
          m_blk = mask_row_max(x, tile.valid, vis);
        } else {
          m_blk = row_max(x, vis);
        }
        // m_new = max(m_old, m̃); all -inf so far (nothing visible yet): exponents relative to 0,
        // so every -inf gives exp = 0 and a NaN still gives NaN.
        const T m_old = m[i];
        const T m_new = m_blk > m_old ? m_blk : m_old;
        const T m_use = m_new == neg_inf ? T(0) : m_new;
        // p_ij = exp(x_ij - m_new)  (causally masked columns past vis: 0),   l̃ = Σ_j p_ij
        const T l_blk = exp_row_sum(x, vis, m_use);
        std::fill(x + vis, x + g_cols, T(0));
        // α = exp(m_old - m_new):   l_i ← α l_i + l̃,   o_i ← α o_i   (o_i gets + p_i · v next)
        if (!first) {
          const T alpha = m_old == m_use ? T(1) : std::exp(m_old - m_use);
          if (alpha != T(1)) {
            T* oi = o + i * Dv;
            for (int64_t j = 0; j < Dv; ++j) oi[j] *= alpha;
          }
          l[i] = alpha * l[i] + l_blk;
        } else {
          l[i] = l_blk;
        }
        m[i] = m_new;
      }

      // o[rows, Dv] (+)= p[rows, g_cols] · v[s0 : s0+g_cols, Dv]      (one row: o (+)= vᵀ p)
      if (!use_blas) {
        small_pv(rows, g_cols, Dv, x_g, bc, v_b, a.v_stride_s, !first, o_g);
      } else {
        gemm(false, false, rows, Dv, g_cols, T(1), x_g, bc, v_b, ld_for(a.v_stride_s, g_cols, Dv),
             first ? T(0) : T(1), o_g, Dv);
      }
    }
    first = false;
  }
  if (first)  // no key in range
    for (int64_t j = 0; j < br * Dv; ++j) o[j] = T(0);
}

// out_i = o_i / l_i  (zeros where l_i = 0: the row saw no key)
//   o: [br, Dv]   l: [br]   out: rows l0 .. l0+br-1 of head (n, h)
template <class T>
void flash_store(const AttentionArgs<T>& a, int64_t n, int64_t h, int64_t l0, int64_t br, const T* o,
                 const T* l) {
  const int64_t Dv = a.v_head_dim;
  T* out = a.out + n * a.o_stride_n + h * a.o_stride_h + l0 * a.o_stride_l;
  for (int64_t i = 0; i < br; ++i) {
    T* dst = out + i * a.o_stride_l;
    const T* src = o + i * Dv;
    if (l[i] == T(0)) {
      for (int64_t j = 0; j < Dv; ++j) dst[j] = T(0);
    } else {
      const T inv = T(1) / l[i];
      for (int64_t j = 0; j < Dv; ++j) dst[j] = src[j] * inv;
    }
  }
}

// Runs every (n, h, query block) on the calling thread, with the tile in `buf` (stack), and the
// products as plain loops.
template <class T>
void flash_serial(const AttentionArgs<T>& a, int64_t br_max, int64_t bc, T* buf, uint8_t* valid) {
  const int64_t L = a.q_len, S = a.kv_len, Dv = a.v_head_dim;
  const int64_t q_blocks = (L + br_max - 1) / br_max;
  Tile<T> tile{buf, valid};
  T* o = buf + br_max * bc;   // [Br, Dv]
  T* m = o + br_max * Dv;     // [Br]
  T* l = m + br_max;          // [Br]
  for (int64_t task = 0; task < a.batch * a.num_heads * q_blocks; ++task) {
    const int64_t nh = task / q_blocks, qb = task % q_blocks;
    const int64_t n = nh / a.num_heads, h = nh % a.num_heads, l0 = qb * br_max;
    const int64_t br = std::min(br_max, L - l0);
    flash_block(a, n, h, l0, br, 0, S, bc, tile, o, m, l, /*use_blas=*/false);
    flash_store(a, n, h, l0, br, o, l);
  }
}

}  // namespace flash_detail

// attention_flash: the tiled kernel. Computes what attention_reference computes, except
// `a.weights`, which it never writes.
template <class T>
void attention_flash(const AttentionArgs<T>& a) {
  using namespace flash_detail;
  const int64_t N = a.batch, H = a.num_heads, L = a.q_len, S = a.kv_len;
  const int64_t D = a.head_dim, Dv = a.v_head_dim;
  if (N == 0 || H == 0 || L == 0 || Dv == 0) return;  // nothing to write
  if (S == 0) {  // nothing to attend to: zeros
    parallel_for(0, N * H, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, L * Dv)), [&](int64_t b, int64_t e) {
      for (int64_t nh = b; nh < e; ++nh) {
        T* out = a.out + (nh / H) * a.o_stride_n + (nh % H) * a.o_stride_h;
        for (int64_t i = 0; i < L; ++i) std::fill(out + i * a.o_stride_l, out + i * a.o_stride_l + Dv, T(0));
      }
    });
    return;
  }

  const int64_t br_max = std::min(kBlockRows, L);
  const int64_t bc = std::min(L == 1 ? kBlockKeysOneRow : kBlockKeys, S);
  const double flops = 2.0 * double(N * H) * double(L) * double(S) * double(D + Dv);

  // Tiny problems: one thread, the tile on the stack.
  if (flops < kSerialFlops && br_max * bc + br_max * Dv + 2 * br_max <= kStackElems) {
    alignas(64) T buf[kStackElems];
    alignas(64) uint8_t valid[kStackElems];
    flash_serial(a, br_max, bc, buf, valid);
    return;
  }

  const int num_threads = std::max(1, get_num_threads());
  const int64_t q_blocks = (L + br_max - 1) / br_max;
  const int64_t base_tasks = N * H * q_blocks;  // (n, h, query block)

  // Split the keys when there are too few tasks: chunks of ≥ kMinChunk keys (a multiple of 64).
  const int64_t min_tasks = std::max<int64_t>(kMinTasks, 2 * int64_t(num_threads));
  int64_t chunks = 1, chunk_len = S;
  if (base_tasks < min_tasks && S >= 2 * kMinChunk) {
    const int64_t want = (min_tasks + base_tasks - 1) / base_tasks;
    chunks = std::min(want, S / kMinChunk);
    chunk_len = ((S + chunks - 1) / chunks + 63) / 64 * 64;
    chunks = (S + chunk_len - 1) / chunk_len;
  }

  // Per-thread tile, allocated once: s [Br, Bc] | o [Br, Dv] | m [Br] | l [Br]  (+ padding to 64 B)
  const int64_t pad = 64 / int64_t(sizeof(T));
  const int64_t per_thread = (br_max * bc + br_max * Dv + 2 * br_max + pad - 1) / pad * pad;
  std::vector<T> scratch(size_t(per_thread * num_threads + pad));
  std::vector<uint8_t> valid_buf(size_t(bc * num_threads));
  T* base = scratch.data();
  while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
  auto tile_of = [&](int tid) {
    T* s = base + int64_t(tid) * per_thread;
    return Tile<T>{s, valid_buf.data() + int64_t(tid) * bc};
  };

  if (chunks == 1) {
    // One task = one query block of one head, against all its keys; dynamic scheduling balances
    // the causal triangle (later blocks see more keys).
    parallel_tasks(base_tasks, [&](int64_t task, int tid) {
      const int64_t nh = task / q_blocks, qb = task % q_blocks;
      const int64_t n = nh / H, h = nh % H, l0 = qb * br_max;
      const int64_t br = std::min(br_max, L - l0);
      const Tile<T> tile = tile_of(tid);
      T* o = tile.s + br_max * bc;
      T* m = o + br_max * Dv;
      T* l = m + br_max;
      flash_block(a, n, h, l0, br, 0, S, bc, tile, o, m, l);
      flash_store(a, n, h, l0, br, o, l);
    });
    return;
  }

  // Split keys: task = (base task, chunk c) writes its partial triple (m_c, l_c, o_c) of keys
  // [c · chunk_len, (c+1) · chunk_len) to `partial`: [base_tasks, chunks, Br · (Dv + 2)].
  const int64_t part_size = br_max * (Dv + 2);
  std::vector<T> partial(size_t(base_tasks * chunks * part_size));
  parallel_tasks(base_tasks * chunks, [&](int64_t task, int tid) {
    const int64_t bt = task / chunks, c = task % chunks;
    const int64_t nh = bt / q_blocks, qb = bt % q_blocks;
    const int64_t n = nh / H, h = nh % H, l0 = qb * br_max;
    const int64_t br = std::min(br_max, L - l0);
    T* o = partial.data() + task * part_size;  // [br, Dv]
    T* m = o + br_max * Dv;                     // [br]
    T* l = m + br_max;                          // [br]
    flash_block(a, n, h, l0, br, c * chunk_len, std::min(S, (c + 1) * chunk_len), bc, tile_of(tid), o, m, l);
  });
  // Merge, per row:  M = max_c m_c,  w_c = exp(m_c - M),  l = Σ_c w_c l_c,  out = Σ_c w_c o_c / l
  // (M = -inf: no chunk saw a key; exponents relative to 0 so that w_c = 0 and NaN survives).
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, chunks * part_size));
  parallel_for(0, base_tasks, grain, [&](int64_t b, int64_t e) {
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    for (int64_t bt = b; bt < e; ++bt) {
      const int64_t nh = bt / q_blocks, qb = bt % q_blocks;
      const int64_t n = nh / H, h = nh % H, l0 = qb * br_max;
      const int64_t br = std::min(br_max, L - l0);
      T* p0 = partial.data() + bt * chunks * part_size;  // chunk 0 accumulates the merge
      T* o0 = p0;
      T* m0 = o0 + br_max * Dv;
      T* l0s = m0 + br_max;
      for (int64_t i = 0; i < br; ++i) {
        T M = neg_inf;
        for (int64_t c = 0; c < chunks; ++c) {
          const T mc = p0[c * part_size + br_max * Dv + i];
          M = mc > M ? mc : M;
        }
        const T M_use = M == neg_inf ? T(0) : M;
        T* oi = o0 + i * Dv;
        const T w0 = std::exp(m0[i] - M_use);
        T lsum = w0 * l0s[i];
        for (int64_t j = 0; j < Dv; ++j) oi[j] *= w0;
        for (int64_t c = 1; c < chunks; ++c) {
          const T* pc = p0 + c * part_size;
          const T wc = std::exp(pc[br_max * Dv + i] - M_use);
          lsum += wc * pc[br_max * Dv + br_max + i];
          const T* oc = pc + i * Dv;
          for (int64_t j = 0; j < Dv; ++j) oi[j] += wc * oc[j];
        }
        l0s[i] = lsum;
      }
      flash_store(a, n, h, l0, br, o0, l0s);
    }
  });
}

}  // namespace transformer_core::kernels
