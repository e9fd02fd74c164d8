#include "transformer_core/layers/quantized_matrix.hpp"

#include <algorithm>
#include <stdexcept>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

namespace q = kernels::quant;
using ops::to_string;

std::unique_ptr<QuantizedMatrix> QuantizedMatrix::int8(const float* w, int64_t out, int64_t in) {
  if (in > q::kInt8MaxK)
    throw std::invalid_argument("in_features: expected <= " + to_string(q::kInt8MaxK) +
                                " for int8 weights (the int32 accumulator's exact range), got " + to_string(in));
  std::unique_ptr<QuantizedMatrix> m(new QuantizedMatrix(Format::kInt8, out, in));
  m->qweight_ = allocate<int8_t, 2>({out, in}, "int8 weight (out_features, in_features)");
  m->scales_ = allocate<float, 1>({out}, "int8 scales (out_features)");
  ops::quantize_int8(w, out, in, m->qweight_.data(), m->scales_.data());
  return m;
}

std::unique_ptr<QuantizedMatrix> QuantizedMatrix::gguf(int64_t out, int64_t in, std::vector<GgufRun> runs) {
  ops::require_positive(out, "out_features");
  ops::require_positive(in, "in_features");
  if (in % q::kBlockSize != 0)
    throw std::invalid_argument("in_features: expected a multiple of 32 (the GGUF block size), got " + to_string(in));
  std::sort(runs.begin(), runs.end(), [](const GgufRun& a, const GgufRun& b) { return a.row0 < b.row0; });
  int64_t next = 0;  // the first row not covered yet
  for (const GgufRun& r : runs) {
    const std::string where = "rows [" + to_string(r.row0) + ", " + to_string(r.row0 + r.rows) + ")";
    if (r.rows < 1 || r.row0 < 0 || r.row0 + r.rows > out)
      throw std::invalid_argument("blocks: " + where + " outside the weight's " + to_string(out) + " rows");
    if (r.row0 < next) throw std::invalid_argument("blocks: " + where + " overlap rows given before");
    if (r.row0 > next)
      throw std::invalid_argument("blocks: rows [" + to_string(next) + ", " + to_string(r.row0) + ") have no blocks");
    const int64_t expected = r.rows * (in / q::kBlockSize) * q::type_size(r.type);
    if (r.blocks == nullptr || static_cast<int64_t>(r.num_bytes) != expected)
      throw std::invalid_argument("blocks: " + where + ": expected " + to_string(expected) + " bytes (" +
                                  to_string(r.rows) + " rows of " + to_string(in / q::kBlockSize) + " " +
                                  q::ggml_type_name(r.type) + " blocks), got " + to_string(static_cast<int64_t>(r.num_bytes)));
    next = r.row0 + r.rows;
  }
  if (next != out)
    throw std::invalid_argument("blocks: rows [" + to_string(next) + ", " + to_string(out) + ") have no blocks");
  std::unique_ptr<QuantizedMatrix> m(new QuantizedMatrix(Format::kGguf, out, in));
  m->runs_ = std::move(runs);
  return m;
}

std::vector<ops::GgufRows> QuantizedMatrix::runs_in(int64_t out_begin, int64_t out_count) const {
  std::vector<ops::GgufRows> parts;
  const int64_t end = out_begin + out_count;
  const int64_t row_bytes_per_block = in_ / q::kBlockSize;
  for (const GgufRun& r : runs_) {
    const int64_t b = std::max(out_begin, r.row0), e = std::min(end, r.row0 + r.rows);
    if (b >= e) continue;
    const int64_t row_bytes = row_bytes_per_block * q::type_size(r.type);
    parts.push_back({r.blocks + (b - r.row0) * row_bytes, static_cast<size_t>((e - b) * row_bytes), e - b, r.type});
  }
  return parts;
}

void QuantizedMatrix::forward(const float* x, int64_t rows, float* y, const float* bias, int64_t out_begin,
                              int64_t out_count) const {
  if (out_begin < 0 || out_count < 1 || out_begin + out_count > out_)
    throw std::invalid_argument("QuantizedMatrix: output rows [" + to_string(out_begin) + ", " +
                                to_string(out_begin + out_count) + ") outside [0, " + to_string(out_) + ")");
  const float* b = bias != nullptr ? bias + out_begin : nullptr;
  if (format_ == Format::kInt8) {
    ops::linear_int8(x, rows, in_, qweight_.data() + out_begin * in_, scales_.data() + out_begin, b, out_count, y,
                     residual_activations_);
    return;
  }
  const std::vector<ops::GgufRows> parts = runs_in(out_begin, out_count);
  ops::linear_gguf_parts(x, rows, in_, parts.data(), static_cast<int64_t>(parts.size()), b, y, quantize_activations_);
}

void QuantizedMatrix::dequantize_rows(int64_t row0, int64_t rows, float* out) const {
  if (row0 < 0 || rows < 1 || row0 + rows > out_)
    throw std::invalid_argument("QuantizedMatrix: rows [" + to_string(row0) + ", " + to_string(row0 + rows) +
                                ") outside [0, " + to_string(out_) + ")");
  if (format_ == Format::kInt8) {
    ops::dequantize_int8(qweight_.data() + row0 * in_, scales_.data() + row0, rows, in_, out);
    return;
  }
  for (const ops::GgufRows& p : runs_in(row0, rows)) {
    ops::dequantize_gguf(p.blocks, p.num_bytes, p.type, p.rows, in_, out);
    out += p.rows * in_;
  }
}

void QuantizedMatrix::gather_rows(const int64_t* ids, int64_t count, float* out) const {
  if (format_ == Format::kInt8) {
    for (int64_t r = 0; r < count; ++r) ops::dequantize_int8(qweight_.data() + ids[r] * in_, scales_.data() + ids[r], 1, in_, out + r * in_);
    return;
  }
  const std::vector<ops::GgufRows> parts = runs_in(0, out_);
  ops::embedding_gguf(parts.data(), static_cast<int64_t>(parts.size()), in_, ids, count, out);
}

std::string QuantizedMatrix::format_name(int64_t row0, int64_t rows) const {
  if (format_ == Format::kInt8) return "int8";
  const int64_t end = rows < 0 ? out_ : row0 + rows;
  std::vector<std::string> names;
  for (const GgufRun& r : runs_) {
    if (r.row0 >= end || r.row0 + r.rows <= row0) continue;
    const std::string n = q::ggml_type_name(r.type);
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : "+") + n;
  return out;
}

size_t QuantizedMatrix::bytes() const {
  if (format_ == Format::kInt8) return qweight_.size() + scales_.size() * sizeof(float);
  size_t n = 0;
  for (const GgufRun& r : runs_) n += r.num_bytes;
  return n;
}

}  // namespace transformer_core::layers
