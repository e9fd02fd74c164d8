// Quantized linear ops (ops/quantized_linear.hpp): size checks, activation quantization, and the
// parallel split of the output into tiles that do not depend on the thread count.
#include "transformer_core/ops/quantized_linear.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/linear.hpp"
#include "transformer_core/kernels/packed_weights.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::ops {

namespace q = kernels::quant;

namespace {

// Up to this many rows of x, the product kernels take every row at once and the weights stream
// once (decoding); above it, tiles of x rows × weight rows.
constexpr int64_t kFewRows = 8;
// Tiles of the many-rows path: x rows × weight rows, and the k-chunk of the fp32 path's decoded tile
// (128 × 512 floats = 256 KiB: stays in L2 while the sgemm reads it).
constexpr int64_t kTileRows = 64, kTileCols = 64;
constexpr int64_t kSgemmRows = 128, kSgemmCols = 128, kSgemmDepth = 512;
// Outside a PackedWeightScope, the rows from which the packed int8 product (kernels.hpp) repays
// packing the weights at every call. Zen 4, 2 threads, against the dot kernel: 64 rows of a
// 1536 → 384 layer took 178 µs against 152, 4096 → 4096 5.8 ms against 4.2; 896 rows took 2.7
// against 3.4 (1536 → 384) and 2.7 against 4.9 ms (384 → 1536).
constexpr int64_t kInt8PackPerCallRows = 256;
// The smallest work (multiply-adds) worth a thread of its own.
constexpr int64_t kGrainMacs = 1 << 16;
// The quantized activations of one pass over x take at most about this many bytes of scratch: x is
// quantized and multiplied a chunk of rows at a time (the rows of one chunk: a multiple of the
// product's tile rows, the last chunk up to kFewRows more). A row of the int8 product is padded to
// whole 64-byte vectors (the AVX-512 and AMX kernels read them), 16 times x's own size for
// in_features = 1: without chunks, 2^22 such rows took 512 MiB of scratch that the thread then kept
// (kernels/workspace.hpp never shrinks). 4 MiB: a chunk of 64-row tiles holds 2,688 rows of 1,536
// features (MiniLM's widest input), so a sentence encoder's batches still run in one chunk.
constexpr int64_t kChunkBytes = int64_t(1) << 22;

// The rows of x per chunk: a multiple of tile_rows, at least one tile, about kChunkBytes / row_bytes.
int64_t chunk_rows(int64_t row_bytes, int64_t tile_rows) {
  return std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, row_bytes) / tile_rows) * tile_rows;
}

// Runs fn(r0, r1) over the chunks of [0, rows): `chunk` rows each, the last one also taking the rest
// when at most kFewRows rows would be left (so that no chunk of a call of more than kFewRows rows
// has kFewRows or fewer: over_outputs' path and the packed kernels' column split stay those of the
// whole call). Scratch for chunk + kFewRows rows holds any chunk.
template <class F>
void over_chunks(int64_t rows, int64_t chunk, const F& fn) {
  for (int64_t r0 = 0; r0 < rows;) {
    const int64_t r1 = rows - r0 <= chunk + kFewRows ? rows : r0 + chunk;
    fn(r0, r1);
    r0 = r1;
  }
}

using kernels::Scratch;

void check_dims(int64_t rows, int64_t in, int64_t out, const char* op) {
  if (rows < 0) throw std::invalid_argument(std::string(op) + ": rows: expected >= 0, got " + std::to_string(rows));
  if (in < 1) throw std::invalid_argument(std::string(op) + ": in_features: expected >= 1, got " + std::to_string(in));
  if (out < 1)
    throw std::invalid_argument(std::string(op) + ": out_features: expected >= 1, got " + std::to_string(out));
}

void check_blocks(size_t num_bytes, GgmlType type, int64_t rows, int64_t cols, const char* op, const char* rows_name,
                  const char* cols_name) {
  const std::string name = q::ggml_type_name(type);
  if (cols % q::kBlockSize != 0)
    throw std::invalid_argument(std::string(op) + ": " + cols_name + ": expected a multiple of 32 (the block size of " +
                                name + "), got " + std::to_string(cols));
  const int64_t expected = rows * (cols / q::kBlockSize) * q::type_size(type);
  if (static_cast<int64_t>(num_bytes) != expected)
    throw std::invalid_argument(std::string(op) + ": blocks: expected " + std::to_string(expected) + " bytes (" +
                                rows_name + " " + std::to_string(rows) + " × " + std::to_string(cols / 32) +
                                " blocks of " + std::to_string(q::type_size(type)) + " bytes, " + name + "), got " +
                                std::to_string(num_bytes));
}

// Rows per task so that a task holds at least kGrainMacs multiply-adds.
int64_t grain_rows(int64_t macs_per_row) {
  return std::max<int64_t>(1, kGrainMacs / std::max<int64_t>(1, macs_per_row));
}

// Runs fn(i0, i1, j0, j1) over y[rows, out]: for a few rows, chunks of weight rows (each thread streams
// its own slice of the weights once); otherwise fixed tiles, handed out dynamically.
template <class F>
void over_outputs(int64_t rows, int64_t in, int64_t out, int64_t tile_rows, int64_t tile_cols, const F& fn) {
  if (rows <= kFewRows) {
    kernels::parallel_for(0, out, grain_rows(rows * in), [&](int64_t j0, int64_t j1) { fn(0, rows, j0, j1); });
    return;
  }
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows, col_tiles = (out + tile_cols - 1) / tile_cols;
  auto tile = [&](int64_t t, int) {
    const int64_t i0 = (t / col_tiles) * tile_rows, j0 = (t % col_tiles) * tile_cols;
    fn(i0, std::min(rows, i0 + tile_rows), j0, std::min(out, j0 + tile_cols));
  };
  if (rows * in * out < kGrainMacs * 4) {
    for (int64_t t = 0; t < row_tiles * col_tiles; ++t) tile(t, 0);
  } else {
    kernels::parallel_tasks(row_tiles * col_tiles, tile);
  }
}

// One row of the int8 residual mode (linear_int8): rq = rint(clamp((x − q · s) · (256 / s), ±127)),
// zero-padded to ldq; returns Σ rq. A row with s = 0 (zero or tiny) or NaN (non-finite) gets zeros.
// Local copies and __restrict let the compiler vectorise it (int8 stores may alias anything).
int32_t residual_row(const float* __restrict x, const int8_t* __restrict q, float s, int64_t in, int64_t ldq,
                     int8_t* __restrict rq) {
  int32_t sum = 0;
  if (s > 0.0f) {
    const float inv = 256.0f / s;
    constexpr float kRoundMagic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
    for (int64_t t = 0; t < in; ++t) {
      float v = std::fma(-static_cast<float>(q[t]), s, x[t]) * inv;
      v = v < -127.0f ? -127.0f : v;
      v = v > 127.0f ? 127.0f : v;
      v = (v + kRoundMagic) - kRoundMagic;  // rint, half to even (|v| < 2^22)
      const auto r = static_cast<int32_t>(v);
      rq[t] = static_cast<int8_t>(r);
      sum += r;
    }
  } else {
    for (int64_t t = 0; t < in; ++t) rq[t] = 0;
  }
  for (int64_t t = in; t < ldq; ++t) rq[t] = 0;
  return sum;
}

// qweight [out, in] in the panels of kt.pack_int8 (kernels.hpp): from the PackedWeightScope's cache
// when this weight was packed earlier in the scope, else packed now (into the cache, or into the
// workspace outside a scope), a few panels per task.
const uint8_t* packed_int8(const q::KernelTable& kt, const int8_t* qweight, int64_t out, int64_t in) {
  const int64_t panel_bytes = (in + 3) / 4 * 4 * q::kInt8PanelFeatures;
  const int64_t panels = (out + q::kInt8PanelFeatures - 1) / q::kInt8PanelFeatures;
  const size_t floats = static_cast<size_t>((panels * panel_bytes + 3) / 4);  // the cache holds floats
  uint8_t* packed = nullptr;
  kernels::PackedWeightCache* cache = kernels::current_packed_weights();
  if (cache != nullptr) {
    if (float* found = cache->find(qweight, out, in, &kt)) return reinterpret_cast<const uint8_t*>(found);
    packed = reinterpret_cast<uint8_t*>(cache->allot(qweight, out, in, &kt, floats));
  }
  if (packed == nullptr) packed = reinterpret_cast<uint8_t*>(kernels::workspace<float>(Scratch::kQuantPackedWeights, floats));
  kernels::parallel_for(0, panels, grain_rows(panel_bytes), [&](int64_t p0, int64_t p1) {
    kt.pack_int8(qweight, in, p0 * q::kInt8PanelFeatures, std::min(out, p1 * q::kInt8PanelFeatures), packed);
  });
  return packed;
}

}  // namespace

void quantize_int8(const float* weight, int64_t out, int64_t in, int8_t* qweight, float* scales) {
  check_dims(0, in, out, "quantize_int8");
  const q::KernelTable& kt = q::active_kernels();
  kernels::parallel_for(0, out, grain_rows(in), [&](int64_t r0, int64_t r1) {
    kt.quantize_rows_int8(weight + r0 * in, r1 - r0, in, qweight + r0 * in, in, scales + r0, nullptr);
  });
}

void linear_int8(const float* x, int64_t rows, int64_t in, const int8_t* qweight, const float* scales,
                 const float* bias, int64_t out, float* y, bool residual_activations) {
  check_dims(rows, in, out, "linear_int8");
  if (in > q::kInt8MaxK)
    throw std::invalid_argument("linear_int8: in_features: expected <= " + std::to_string(q::kInt8MaxK) +
                                " (the int32 accumulator's exact range), got " + std::to_string(in));
  if (rows == 0) return;
  const q::KernelTable& kt = q::active_kernels();
  // Rows zero-padded to whole 64-byte vectors: the AVX-512 and AMX kernels load 64 bytes of a row at
  // a time, and the padding must hold zeros (they multiply it by a zero weight shifted by 128).
  const int64_t ldq = (in + 63) / 64 * 64;
  // Many rows on an ISA with the packed product: the weights in its panels, once per PackedWeightScope
  // (or once per call, where enough rows repay it), then one product over them per pass.
  const bool repaid = kernels::current_packed_weights() != nullptr || rows >= kInt8PackPerCallRows;
  const uint8_t* packed =
      rows > kFewRows && repaid && kt.linear_int8_packed != nullptr ? packed_int8(kt, qweight, out, in) : nullptr;
  const int64_t tile_rows = packed != nullptr ? kt.int8_packed_tile_rows : kt.int8_tile_rows;
  const int64_t tile_cols = packed != nullptr ? kt.int8_packed_tile_cols : kt.int8_tile_cols;

  // x a chunk of rows at a time (over_chunks): the scratch holds one chunk's quantized rows.
  const int64_t chunk = chunk_rows(ldq, tile_rows);
  const auto scratch_rows = static_cast<size_t>(std::min(rows, chunk + kFewRows));
  int8_t* xq = kernels::workspace<int8_t>(Scratch::kQuantActivations, scratch_rows * static_cast<size_t>(ldq));
  float* sx = kernels::workspace<float>(Scratch::kQuantScales, scratch_rows);
  int32_t* xsum = kernels::workspace<int32_t>(Scratch::kQuantSums, scratch_rows);
  int8_t* rq = nullptr;
  float* sr = nullptr;
  int32_t* rsum = nullptr;
  if (residual_activations) {
    rq = kernels::workspace<int8_t>(Scratch::kQuantResidualActivations, scratch_rows * static_cast<size_t>(ldq));
    sr = kernels::workspace<float>(Scratch::kQuantResidualScales, scratch_rows);
    rsum = kernels::workspace<int32_t>(Scratch::kQuantResidualSums, scratch_rows);
  }
  over_chunks(rows, chunk, [&](int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;  // rows c0 .. c1 of x and y are rows 0 .. n of the scratch
    const float* xc = x + c0 * in;
    float* yc = y + c0 * out;
    kernels::parallel_for(0, n, grain_rows(in * 16), [&](int64_t r0, int64_t r1) {
      kt.quantize_rows_int8(xc + r0 * in, r1 - r0, in, xq + r0 * ldq, ldq, sx + r0, xsum + r0);
    });
    const auto product = [&](const int8_t* aq, const float* as, const int32_t* asum, const float* b, bool accumulate) {
      over_outputs(n, in, out, tile_rows, tile_cols, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
        if (packed != nullptr)
          kt.linear_int8_packed(aq, ldq, as, asum, i0, i1, in, packed, scales, b, j0, j1, yc, out, accumulate);
        else
          kt.linear_int8(aq, ldq, as, asum, i0, i1, in, qweight, scales, b, j0, j1, yc, out, accumulate);
      });
    };
    product(xq, sx, xsum, bias, false);
    if (!residual_activations) return;

    // The second pass: each row's rounding residual r = x − q · sx, quantized in units of sr = sx / 256,
    // then its product added to y. fma(−q, sx, x) is r exactly (|r| is about sx / 2 at most and its
    // bits stop at ulp(sx) or ulp(x), whichever is finer: it fits in 24 bits), so the roundings are
    // those of inv = 256 / sx and of r · inv; |r · inv| above 127 (to about 128) is clamped: an error
    // of about one sr = sx / 256 at most there, sr / 2 at most elsewhere.
    kernels::parallel_for(0, n, grain_rows(in * 16), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        sr[i] = sx[i] / 256.0f;  // exact: a power of two (sx >= 2^-100 / 127 keeps it normal)
        rsum[i] = residual_row(xc + i * in, xq + i * ldq, sx[i], in, ldq, rq + i * ldq);
      }
    });
    product(rq, sr, rsum, nullptr, true);
  });
}

void linear_gguf(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, size_t num_bytes, GgmlType type,
                 const float* bias, int64_t out, float* y, bool quantize_activations) {
  check_dims(rows, in, out, "linear_gguf");
  check_blocks(num_bytes, type, out, in, "linear_gguf", "out_features", "in_features");
  const GgufRows part{blocks, num_bytes, out, type};
  linear_gguf_parts(x, rows, in, &part, 1, bias, y, quantize_activations);
}

namespace {

// The runs of a GGUF matrix, checked, with the first output row of each: start[p] = Σ_{q<p} rows_q.
struct Runs {
  std::vector<int64_t> start;
  int64_t out = 0;
};

Runs check_parts(const GgufRows* parts, int64_t num_parts, int64_t cols, const char* op) {
  if (num_parts < 1 || parts == nullptr)
    throw std::invalid_argument(std::string(op) + ": parts: expected at least one run of rows, got " +
                                std::to_string(num_parts));
  Runs r;
  for (int64_t p = 0; p < num_parts; ++p) {
    if (parts[p].rows < 1)
      throw std::invalid_argument(std::string(op) + ": parts[" + std::to_string(p) + "].rows: expected >= 1, got " +
                                  std::to_string(parts[p].rows));
    if (parts[p].blocks == nullptr)
      throw std::invalid_argument(std::string(op) + ": parts[" + std::to_string(p) + "].blocks: expected data, got null");
    check_blocks(parts[p].num_bytes, parts[p].type, parts[p].rows, cols, op, "rows", "in_features");
    r.start.push_back(r.out);
    r.out += parts[p].rows;
  }
  return r;
}

// Runs fn(part, i0, i1, j0, j1) over y[rows, out] where [j0, j1) are rows of run `part` (so the
// outputs are columns start[part] + j): for a few rows, chunks of the output rows of all runs
// together (each thread streams its own slice of the weights once; a chunk may cover the end of
// one run and the start of the next); otherwise fixed tiles inside each run, handed out dynamically.
template <class F>
void over_runs(const Runs& runs, const GgufRows* parts, int64_t rows, int64_t in, int64_t tile_rows,
               int64_t tile_cols, const F& fn) {
  const int64_t num_parts = static_cast<int64_t>(runs.start.size());
  if (rows <= kFewRows) {
    kernels::parallel_for(0, runs.out, grain_rows(rows * in), [&](int64_t c0, int64_t c1) {
      for (int64_t p = 0; p < num_parts; ++p) {
        const int64_t s = runs.start[static_cast<size_t>(p)], e = s + parts[p].rows;
        const int64_t b = std::max(c0, s), f = std::min(c1, e);
        if (b < f) fn(p, int64_t{0}, rows, b - s, f - s);
      }
    });
    return;
  }
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
  std::vector<int64_t> first_task(static_cast<size_t>(num_parts + 1), 0);  // tasks of run p: [first[p], first[p + 1])
  for (int64_t p = 0; p < num_parts; ++p)
    first_task[static_cast<size_t>(p + 1)] =
        first_task[static_cast<size_t>(p)] + row_tiles * ((parts[p].rows + tile_cols - 1) / tile_cols);
  auto tile = [&](int64_t t, int) {
    int64_t p = 0;
    while (t >= first_task[static_cast<size_t>(p + 1)]) ++p;
    const int64_t u = t - first_task[static_cast<size_t>(p)];
    const int64_t col_tiles = (parts[p].rows + tile_cols - 1) / tile_cols;
    const int64_t i0 = (u / col_tiles) * tile_rows, j0 = (u % col_tiles) * tile_cols;
    fn(p, i0, std::min(rows, i0 + tile_rows), j0, std::min(parts[p].rows, j0 + tile_cols));
  };
  const int64_t num_tasks = first_task.back();
  if (rows * in * runs.out < kGrainMacs * 4) {
    for (int64_t t = 0; t < num_tasks; ++t) tile(t, 0);
  } else {
    kernels::parallel_tasks(num_tasks, tile);
  }
}

// The weight of a GGUF matrix for kernels::linear_packed / linear_split (kernels/linear.hpp): rows
// decoded to fp32 (dequantize's values, bit for bit gguf.quants') a tile at a time, into this
// thread's kQuantTile scratch, where the packing reads them right after. A tile may cover the end of
// one run and the start of the next.
struct GgufWeight {
  const q::KernelTable& kt;
  const Runs& runs;
  const GgufRows* parts;
  int64_t k;

  const float* rows(int64_t j, int64_t cols) const {
    const size_t size = static_cast<size_t>(kernels::kPackedTileCols * k);
    float* tile = kernels::workspace<float>(Scratch::kQuantTile, size);
    for (size_t p = 0; p < runs.start.size(); ++p) {
      const int64_t s = runs.start[p], b = std::max(j, s), f = std::min(j + cols, s + parts[p].rows);
      if (b < f)
        kt.dequantize(parts[p].type, parts[p].blocks, k, b - s, f - s, 0, k / q::kBlockSize, tile + (b - j) * k, k);
    }
    return tile;
  }
};

}  // namespace

void linear_gguf_parts(const float* x, int64_t rows, int64_t in, const GgufRows* parts, int64_t num_parts,
                       const float* bias, float* y, bool quantize_activations) {
  check_dims(rows, in, 1, "linear_gguf");
  const Runs runs = check_parts(parts, num_parts, in, "linear_gguf");
  if (rows == 0) return;
  const q::KernelTable& kt = q::active_kernels();
  const int64_t nb = in / q::kBlockSize, out = runs.out;
  // Run p writes the columns start[p] + j of y (and reads bias[start[p] + j]).
  auto y_of = [&](int64_t p) { return y + runs.start[static_cast<size_t>(p)]; };
  auto bias_of = [&](int64_t p) { return bias != nullptr ? bias + runs.start[static_cast<size_t>(p)] : nullptr; };

  if (quantize_activations) {
    // x a chunk of rows at a time (over_chunks): per row, in int8 values, nb fp32 scales and
    // nb · 8 int32 group sums in the scratch.
    const int64_t chunk = chunk_rows(in + nb * 4 + nb * 32, kTileRows);
    const auto scratch_rows = static_cast<size_t>(std::min(rows, chunk + kFewRows));
    int8_t* xq = kernels::workspace<int8_t>(Scratch::kQuantActivations, scratch_rows * static_cast<size_t>(in));
    float* xd = kernels::workspace<float>(Scratch::kQuantScales, scratch_rows * static_cast<size_t>(nb));
    int32_t* xg = kernels::workspace<int32_t>(Scratch::kQuantSums, scratch_rows * static_cast<size_t>(nb * 8));
    over_chunks(rows, chunk, [&](int64_t c0, int64_t c1) {
      const int64_t n = c1 - c0;  // rows c0 .. c1 of x and y are rows 0 .. n of the scratch
      kernels::parallel_for(0, n, grain_rows(in * 16), [&](int64_t r0, int64_t r1) {
        kt.quantize_q8_blocks(x + (c0 + r0) * in, r1 - r0, in, xq + r0 * in, xd + r0 * nb, xg + r0 * nb * 8);
      });
      const auto tile = [&](int64_t p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
        kt.linear_gguf_q8(parts[p].type, xq, xd, xg, i0, i1, in, parts[p].blocks, bias_of(p), j0, j1,
                          y_of(p) + c0 * out, out);
      };
      over_runs(runs, parts, n, in, kTileRows, kTileCols, tile);
    });
    return;
  }

  if (rows <= kFewRows) {  // decoding: blocks decoded in registers, weights streamed once
    over_runs(runs, parts, rows, in, kTileRows, kTileCols, [&](int64_t p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      kt.linear_gguf_f32(parts[p].type, x, in, i0, i1, in, parts[p].blocks, bias_of(p), j0, j1, y_of(p), out);
    });
    return;
  }
  // prefill: the fp32 linear layer's GEMM (kernels/linear.hpp: on AMX tiles or FMA panels), its
  // weight tiles packed from blocks decoded a tile at a time, once per call.
  if (const kernels::sgemm::Kernels* fma = kernels::sgemm::active()) {
    const GgufWeight w{kt, runs, parts, in};
    const bool serial = rows * in * out < kernels::kLinearSerialMacs;
    if (const kernels::sgemm::split::Kernels* amx = kernels::sgemm::split::active())
      return kernels::linear_split(*amx, *fma, x, rows, in, w, bias, out, y, kernels::Activation::kNone, serial);
    return kernels::linear_packed(*fma, x, rows, in, w, bias, out, y, kernels::Activation::kNone, serial);
  }
  // Without our GEMM (no AVX2): per tile of y, decode kSgemmCols weight rows × kSgemmDepth values to
  // fp32 (in L2) and multiply on this thread (gemm_on_thread), accumulating over the chunks of k in order.
  over_runs(runs, parts, rows, in, kSgemmRows, kSgemmCols, [&](int64_t p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    float* wt = kernels::workspace<float>(Scratch::kQuantTile, static_cast<size_t>(kSgemmCols * kSgemmDepth));
    float* yp = y_of(p);
    const float* bp = bias_of(p);
    float* yt = yp + i0 * out + j0;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j) yp[i * out + j] = bp != nullptr ? bp[j] : 0.0f;
    for (int64_t k0 = 0; k0 < in; k0 += kSgemmDepth) {
      const int64_t kc = std::min(kSgemmDepth, in - k0);
      kt.dequantize(parts[p].type, parts[p].blocks, in, j0, j1, k0 / q::kBlockSize, (k0 + kc) / q::kBlockSize, wt, kc);
      kernels::gemm_on_thread(false, true, i1 - i0, j1 - j0, kc, x + i0 * in + k0, in, wt, kc, yt, out, true);
    }
  });
}

void embedding_gguf(const GgufRows* parts, int64_t num_parts, int64_t cols, const int64_t* ids, int64_t count,
                    float* out) {
  check_dims(count, cols, 1, "embedding_gguf");
  const Runs runs = check_parts(parts, num_parts, cols, "embedding_gguf");
  const q::KernelTable& kt = q::active_kernels();
  const int64_t nb = cols / q::kBlockSize;
  kernels::parallel_for(0, count, grain_rows(cols * 8), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t p = 0;
      while (p + 1 < num_parts && ids[r] >= runs.start[static_cast<size_t>(p + 1)]) ++p;
      const int64_t row = ids[r] - runs.start[static_cast<size_t>(p)];
      kt.dequantize(parts[p].type, parts[p].blocks, cols, row, row + 1, 0, nb, out + r * cols, cols);
    }
  });
}

void dequantize_int8(const int8_t* qweight, const float* scales, int64_t rows, int64_t cols, float* out) {
  check_dims(rows, cols, 1, "dequantize_int8");
  kernels::parallel_for(0, rows, grain_rows(cols * 4), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < cols; ++k) out[r * cols + k] = scales[r] * static_cast<float>(qweight[r * cols + k]);
  });
}

void dequantize_gguf(const uint8_t* blocks, size_t num_bytes, GgmlType type, int64_t rows, int64_t cols, float* out) {
  check_dims(rows, cols, 1, "dequantize_gguf");
  check_blocks(num_bytes, type, rows, cols, "dequantize_gguf", "rows", "cols");
  const q::KernelTable& kt = q::active_kernels();
  kernels::parallel_for(0, rows, grain_rows(cols * 4), [&](int64_t r0, int64_t r1) {
    kt.dequantize(type, blocks, cols, r0, r1, 0, cols / q::kBlockSize, out + r0 * cols, cols);
  });
}

void quantize_q8_blocks(const float* x, int64_t rows, int64_t cols, int8_t* xq, float* d) {
  check_dims(rows, cols, 1, "quantize_q8_blocks");
  if (cols % q::kBlockSize != 0)
    throw std::invalid_argument("quantize_q8_blocks: cols: expected a multiple of 32, got " + std::to_string(cols));
  const q::KernelTable& kt = q::active_kernels();
  const int64_t nb = cols / q::kBlockSize;
  kernels::parallel_for(0, rows, grain_rows(cols * 16), [&](int64_t r0, int64_t r1) {
    kt.quantize_q8_blocks(x + r0 * cols, r1 - r0, cols, xq + r0 * cols, d + r0 * nb, nullptr);
  });
}

}  // namespace transformer_core::ops
