// A weight matrix W [out, in] kept in a quantized format and computed on as it is, never expanded to
// fp32 (the formats and their rule: kernels/quant/formats.hpp; the products: ops/quantized_linear.hpp):
//
//   int8   symmetric per output channel, owned:      W ≈ scales[j] · qweight[j, :]
//          qweight: [out, in] int8   scales: [out] fp32;  activations quantized per row on the fly,
//          int32 accumulation (ops::linear_int8).
//   GGUF   Q8_0 / Q4_0 / Q4_1 blocks, in runs of consecutive rows (ops::GgufRows), each run read in
//          place from memory the caller keeps alive through `owner` (a memory-mapped GGUF file), or
//          from a copy the matrix owns (q/k rows reordered). Activations fp32 (blocks decoded in
//          registers) or, with quantize_activations, Q8 blocks and integer dots (llama.cpp's way).
//
// The layers that hold weights (Linear, Embedding) hold one of these instead of their fp32 tensor
// when quantized: forward products, embedding lookups (rows dequantized), dequantized reads for a
// state_dict. fp32 only: the kernels accumulate in int32 or fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/kernels/quant/formats.hpp"
#include "transformer_core/ops/quantized_linear.hpp"

namespace transformer_core::layers {

using kernels::quant::GgmlType;

// One run of rows given as GGUF blocks: rows [row0, row0 + rows) of the matrix.
struct GgufRun {
  int64_t row0 = 0;
  int64_t rows = 0;
  GgmlType type = GgmlType::kQ8_0;
  const uint8_t* blocks = nullptr;       // rows × in / 32 blocks, C-contiguous
  size_t num_bytes = 0;
  std::shared_ptr<const void> owner;     // keeps `blocks` alive (nullptr: the caller guarantees it)
};

class QuantizedMatrix {
 public:
  enum class Format { kInt8, kGguf };

  // int8 per output channel of w [out, in] (formats.hpp's rule, ops::quantize_int8).
  static std::unique_ptr<QuantizedMatrix> int8(const float* w, int64_t out, int64_t in);
  // GGUF runs that together cover rows [0, out) exactly once, in any order. Throws
  // std::invalid_argument naming what is wrong (a gap, an overlap, a byte count, in not a multiple
  // of 32) before anything is kept.
  static std::unique_ptr<QuantizedMatrix> gguf(int64_t out, int64_t in, std::vector<GgufRun> runs);

  // y [rows, out_count] = x [rows, in] · W[out_begin : out_begin + out_count]ᵀ + bias[out_begin : ...]
  // (bias: [out] or nullptr). y must not alias x.
  void forward(const float* x, int64_t rows, float* y, const float* bias, int64_t out_begin, int64_t out_count) const;
  // out [rows, in] = W[row0 : row0 + rows], dequantized.
  void dequantize_rows(int64_t row0, int64_t rows, float* out) const;
  // out [count, in] = W[ids], dequantized (an embedding lookup); ids in [0, out) (checked by the caller).
  void gather_rows(const int64_t* ids, int64_t count, float* out) const;

  Format format() const { return format_; }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  // "int8", or the GGUF types of the runs in row order, distinct, joined by '+' ("Q4_1", "Q8_0+Q4_1"),
  // of all rows or of rows [row0, row0 + rows) (rows < 0: to the end).
  std::string format_name(int64_t row0 = 0, int64_t rows = -1) const;
  // Bytes of weights a product streams (qweight + scales, or the blocks).
  size_t bytes() const;
  // GGUF only: Q8 activation blocks and integer dots (true) or fp32 activations (false, the default).
  void set_quantize_activations(bool on) { quantize_activations_ = on; }
  bool quantize_activations() const { return quantize_activations_; }
  // int8 only: the activations in two int8 passes, value and rounding residual (ops::linear_int8).
  void set_residual_activations(bool on) { residual_activations_ = on; }
  bool residual_activations() const { return residual_activations_; }

 private:
  QuantizedMatrix(Format format, int64_t out, int64_t in) : format_(format), out_(out), in_(in) {}
  // The GGUF runs covering [out_begin, out_begin + out_count), cut to that range.
  std::vector<ops::GgufRows> runs_in(int64_t out_begin, int64_t out_count) const;

  Format format_;
  int64_t out_, in_;
  bool quantize_activations_ = false;
  bool residual_activations_ = false;
  xt::xtensor<int8_t, 2> qweight_;  // int8: [out, in]
  xt::xtensor<float, 1> scales_;     // int8: [out]
  std::vector<GgufRun> runs_;    // GGUF: sorted by row0, covering [0, out)
};

}  // namespace transformer_core::layers
