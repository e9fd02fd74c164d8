// Quantized weight formats of the kernels floor: what the bytes mean. No code that depends on an ISA
// lives here (this header is included by the generic build and by every per-ISA kernel file).
//
// int8 (per-output-channel, symmetric; torch's quantize_dynamic per-channel / ONNX Runtime's dynamic
// quantization, with the range [-127, 127] and scale = max|w_j| / 127):
//   qweight: [N, K] int8, row-major          scales: [N] fp32
//   w[j, k] ≈ scales[j] · qweight[j, k]
// Activations are quantized per ROW on the fly with the same rule (quantize_rows_int8), the product
// is accumulated exactly in int32, then   y[i, j] = float(Σ_k xq[i, k] · qweight[j, k]) · (sx[i] · sw[j]) + b[j]
//
// The per-row rule (one rule for weights and activations, scalar and SIMD alike):
//   amax  = max_k |v_k|
//   scale = amax / 127                                  (fp32 division)
//   q_k   = rint(clamp(v_k · (127 / amax), -127, 127))  (fp32; rint rounds half to EVEN, as np.rint)
//   rows with amax < 2^-100 quantize to zeros with scale 0 (127 / amax would overflow fp32);
//   rows holding a NaN or ±inf get scale NaN and zeros, so every output of that row is NaN.
//
// GGUF block formats (ggml's ggml-common.h / the GGUF spec; gguf-py's gguf.quants is the numpy
// reference). A row of K values is K / 32 consecutive blocks; every block starts with an IEEE fp16
// scale, little-endian. Element p of a block (0 <= p < 32):
//   Q8_0  (34 bytes): d: fp16, qs: int8[32]      w_p = d · qs[p]
//   Q4_0  (18 bytes): d: fp16, qs: uint8[16]     w_p = d · (nib_p − 8)
//   Q4_1  (20 bytes): d: fp16, m: fp16, qs[16]   w_p = d · nib_p + m        (two fp32 roundings)
//   nib_p = qs[p] & 0x0F for p < 16 (low nibbles: elements 0..15), qs[p − 16] >> 4 for p >= 16.
#pragma once

#include <cstdint>
#include <string>

namespace transformer_core::kernels::quant {

// The values a GGUF block decodes to per element.
constexpr int64_t kBlockSize = 32;

enum class GgmlType : int { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2 };

// Bytes of one block of 32 values.
constexpr int64_t type_size(GgmlType t) {
  return t == GgmlType::kQ8_0 ? 34 : t == GgmlType::kQ4_0 ? 18 : 20;
}

// ggml's GGML_TYPE_* numbers (the tensor type field of a GGUF file).
constexpr int ggml_type_id(GgmlType t) {
  return t == GgmlType::kQ8_0 ? 8 : t == GgmlType::kQ4_0 ? 2 : 3;
}

// "Q8_0", "Q4_0", "Q4_1".
const char* ggml_type_name(GgmlType t);
// Parses "Q8_0" | "Q4_0" | "Q4_1"; throws std::invalid_argument naming the accepted ones otherwise.
GgmlType parse_ggml_type(const std::string& name);

// The int32 accumulator of the int8 product is exact while K · 128 · 127 < 2^31.
constexpr int64_t kInt8MaxK = 131072;

// Rows (or blocks) whose max |v| is below this quantize to zeros (see the rule above).
constexpr float kMinAbsMax = 0x1p-100f;

}  // namespace transformer_core::kernels::quant
