// Quantized linear layers: check the sizes, quantize what must be quantized, then run the active
// ISA's kernels (kernels/quant/) in parallel over fixed tiles of the output. fp32 only: quantized
// weights exist to save memory traffic, and every kernel accumulates in int32 or fp32.
// Formats, the quantization rule and the sources: kernels/quant/formats.hpp.
// Errors: std::invalid_argument naming the argument, expected vs got (ValueError in Python).
#pragma once

#include <cstddef>
#include <cstdint>

#include "transformer_core/kernels/quant/formats.hpp"

namespace transformer_core::ops {

using kernels::quant::GgmlType;

// Per-output-channel symmetric int8 quantization (formats.hpp's rule), in parallel over rows:
//   weight: [out, in] fp32 → qweight: [out, in] int8, scales: [out] fp32
void quantize_int8(const float* weight, int64_t out, int64_t in, int8_t* qweight, float* scales);

// y[rows, out] = dequant(quantize_rows(x) · qweightᵀ) + bias      (formats.hpp: the int8 product)
//   x: [rows, in] fp32   qweight: [out, in] int8   scales: [out]   bias: [out] or nullptr
//   in <= kInt8MaxK (131072): the int32 accumulator stays exact.
// residual_activations: the activations in two int8 passes. x ≈ sx · q (the per-row rule), then the
//   rounding residual x − sx · q (about sx / 2 at most, computed exactly) in units of sr = sx / 256:
//   rq = rint(clamp((x − sx · q) · (256 / sx), ±127)) in fp32. Then
//     y = (float(acc_q) · (sx · sw) + bias) + float(acc_r) · (sr · sw)      acc_* exact int32
//   Twice the integer products; the activations' error drops from sx / 2 to sx / 512 a value, about
//   sx / 256 at most where |r| > 127.5 sr (the clamp: a residual within 0.4 % of half a step), which leaves
//   the weights' rounding as the error that remains.
// x is quantized and multiplied a chunk of rows at a time: the scratch (a thread's workspace, kept
// for the next call) takes about 4 MiB per pass whatever the rows, and no result depends on it.
void linear_int8(const float* x, int64_t rows, int64_t in, const int8_t* qweight, const float* scales,
                 const float* bias, int64_t out, float* y, bool residual_activations = false);

// y[rows, out] = x · Ŵᵀ + bias, Ŵ the GGUF blocks' values (formats.hpp), read in place:
//   x: [rows, in] fp32   blocks: out rows of in / 32 blocks, `num_bytes` bytes in all   bias: [out] or nullptr
// quantize_activations = false (default): fp32 activations; each block is decoded in registers and
//   multiplied with x in fp32 (up to 8 rows), or decoded a 128-row tile at a time and packed for
//   the fp32 linear layer's GEMM (kernels/linear.hpp, once per call; more rows): the result is the
//   dequantize-then-fp32 product up to fp32 rounding (with more than 8 rows, that GEMM's bits
//   exactly: kernels::linear's on the decoded weights from 33 rows on, where it stops taking its
//   small-rows kernel, on a CPU with AVX2).
// quantize_activations = true: x is quantized to Q8 blocks (quantize_q8_blocks) and each block
//   product is an exact integer dot, as llama.cpp computes: faster, and as accurate as 8-bit x.
//   x is quantized a chunk of rows at a time (about 4 MiB of scratch, as linear_int8).
// in must be a multiple of 32; num_bytes must be out · in / 32 · type_size.
void linear_gguf(const float* x, int64_t rows, int64_t in, const uint8_t* blocks, size_t num_bytes, GgmlType type,
                 const float* bias, int64_t out, float* y, bool quantize_activations);

// One run of consecutive output rows of a weight matrix, stored as GGUF blocks: `rows` rows of
// in / 32 blocks of `type`, `num_bytes` bytes in all, read in place. A matrix may be several runs
// stored apart (the q, k and v projections of a packed attention matrix, each its own tensor in a
// GGUF file): W = [W_0; W_1; ...], the runs' rows stacked in order, each run in its own format.
struct GgufRows {
  const uint8_t* blocks = nullptr;
  size_t num_bytes = 0;
  int64_t rows = 0;
  GgmlType type = GgmlType::kQ8_0;
};

// y[rows, out] = x · Wᵀ + bias with W = [W_0; W_1; ...] the runs of `parts` (out = Σ their rows):
// linear_gguf over several runs of rows at once, in one parallel region (and, with
// quantize_activations, x quantized once). Each output is computed exactly as linear_gguf computes
// it (the same kernels, tiles that never straddle two runs), so the bits are those of one
// linear_gguf per run.
//   x: [rows, in] fp32   parts: num_parts >= 1 runs   bias: [out] or nullptr   y: [rows, out]
void linear_gguf_parts(const float* x, int64_t rows, int64_t in, const GgufRows* parts, int64_t num_parts,
                       const float* bias, float* y, bool quantize_activations);

// out[r, :] = row ids[r] of W = [W_0; W_1; ...] (the runs of `parts`), dequantized (bit for bit
// dequantize_gguf's values): the lookup of an embedding table stored as GGUF blocks. ids must lie in
// [0, Σ rows) (the caller checks them).   ids: [count]   out: [count, cols]
void embedding_gguf(const GgufRows* parts, int64_t num_parts, int64_t cols, const int64_t* ids, int64_t count,
                    float* out);

// out[r, k] = scales[r] · qweight[r, k] (fp32 product), in parallel over rows: the values an int8
// per-channel weight stands for.   qweight: [rows, cols] int8   scales: [rows]   out: [rows, cols]
void dequantize_int8(const int8_t* qweight, const float* scales, int64_t rows, int64_t cols, float* out);

// out[rows, cols] = the blocks' values (bit for bit gguf.quants.dequantize), in parallel over rows.
void dequantize_gguf(const uint8_t* blocks, size_t num_bytes, GgmlType type, int64_t rows, int64_t cols, float* out);

// x: [rows, cols] → q: [rows, cols] int8, d: [rows, cols / 32] fp32: each block of 32 by the
// per-row rule (formats.hpp). The activations of linear_gguf(..., quantize_activations = true).
void quantize_q8_blocks(const float* x, int64_t rows, int64_t cols, int8_t* q, float* d);

}  // namespace transformer_core::ops
