// The quantized kernels in portable C++: the reference every SIMD variant must match bit for bit,
// and the fallback on CPUs without AVX2. Compiled for the baseline ISA (no -march=native, no FMA
// contraction), so the floating-point operations are exactly the ones written: std::fma where the
// kernels.hpp contract says fma, separate multiply and add everywhere else.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant_common.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"

namespace transformer_core::kernels::quant {
namespace {

void quantize_rows_int8(const float* v, int64_t rows, int64_t k, int8_t* q, int64_t ldq, float* scale,
                        int32_t* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* vr = v + r * k;
    int8_t* qr = q + r * ldq;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t t = 0; t < k; ++t) {
      const float a = std::fabs(vr[t]);
      if (!(a <= 3.402823466e38f)) finite = false;  // NaN or ±inf
      amax = a > amax ? a : amax;
    }
    const RowScale rs = row_scale(amax, finite);
    int32_t s = 0;
    if (rs.inv == 0.0f) {
      std::memset(qr, 0, static_cast<size_t>(k));
    } else {
      for (int64_t t = 0; t < k; ++t) {
        qr[t] = quantize_value(vr[t], rs.inv);
        s += qr[t];
      }
    }
    std::memset(qr + k, 0, static_cast<size_t>(ldq - k));
    scale[r] = rs.scale;
    if (sum != nullptr) sum[r] = s;
  }
}

void linear_int8(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* /*xsum*/, int64_t i0, int64_t i1,
                 int64_t k, const int8_t* w, const float* sw, const float* bias, int64_t j0, int64_t j1, float* y,
                 int64_t ldy, bool accumulate) {
  for (int64_t i = i0; i < i1; ++i) {
    const int8_t* xr = xq + i * ldq;
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* wr = w + j * k;
      int32_t acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += static_cast<int32_t>(xr[t]) * static_cast<int32_t>(wr[t]);
      const float s = sx[i] * sw[j];
      float out = static_cast<float>(acc) * s;
      if (bias != nullptr) out = out + bias[j];
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + out : out;
    }
  }
}

// Decodes block `blk` of `type` into v[32] (the values dequantize produces).
void decode_block(GgmlType type, const uint8_t* blk, float* v) {
  const float d = fp16_to_fp32(load_u16(blk));
  switch (type) {
    case GgmlType::kQ8_0:
      for (int p = 0; p < 32; ++p) v[p] = decode_q8_0(blk, p, d);
      break;
    case GgmlType::kQ4_0:
      for (int p = 0; p < 32; ++p) v[p] = decode_q4_0(blk, p, d);
      break;
    case GgmlType::kQ4_1: {
      const float m = fp16_to_fp32(load_u16(blk + 2));
      for (int p = 0; p < 32; ++p) v[p] = decode_q4_1(blk, p, d, m);
      break;
    }
  }
}

void dequantize(GgmlType type, const uint8_t* w, int64_t k, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                float* out, int64_t ldo) {
  const int64_t ts = type_size(type), row_bytes = (k / kBlockSize) * ts;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t b = b0; b < b1; ++b)
      decode_block(type, w + r * row_bytes + b * ts, out + (r - r0) * ldo + (b - b0) * kBlockSize);
}

void linear_gguf_f32(GgmlType type, const float* x, int64_t ldx, int64_t i0, int64_t i1, int64_t k,
                     const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const int64_t ts = type_size(type), nb = k / kBlockSize, row_bytes = nb * ts;
  float wv[32], acc[32];
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* xr = x + i * ldx;
      for (float& a : acc) a = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        decode_block(type, w + j * row_bytes + b * ts, wv);
        for (int p = 0; p < 32; ++p) acc[p] = std::fma(wv[p], xr[b * 32 + p], acc[p]);
      }
      float out = reduce_tree(acc, 32);
      if (bias != nullptr) out = out + bias[j];
      y[i * ldy + j] = out;
    }
  }
}

void linear_gguf_q8(GgmlType type, const int8_t* xq, const float* xd, const int32_t* xg, int64_t i0, int64_t i1,
                    int64_t k, const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const int64_t ts = type_size(type), nb = k / kBlockSize, row_bytes = nb * ts;
  int32_t wq[32];
  float acc[8];
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t i = i0; i < i1; ++i) {
      for (float& a : acc) a = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + j * row_bytes + b * ts;
        const float d = fp16_to_fp32(load_u16(blk));
        float m = 0.0f;
        switch (type) {
          case GgmlType::kQ8_0:
            for (int p = 0; p < 32; ++p) wq[p] = static_cast<int8_t>(blk[2 + p]);
            break;
          case GgmlType::kQ4_0:
            for (int p = 0; p < 32; ++p) wq[p] = nibble(blk + 2, p) - 8;
            break;
          case GgmlType::kQ4_1:
            m = fp16_to_fp32(load_u16(blk + 2));
            for (int p = 0; p < 32; ++p) wq[p] = nibble(blk + 4, p);
            break;
        }
        const int8_t* xb = xq + i * k + b * 32;
        const float dd = d * xd[i * nb + b];
        const float md = m * xd[i * nb + b];
        for (int g = 0; g < 8; ++g) {
          int32_t s = 0;
          for (int u = 0; u < 4; ++u) s += wq[4 * g + u] * static_cast<int32_t>(xb[4 * g + u]);
          acc[g] = std::fma(static_cast<float>(s), dd, acc[g]);
          if (type == GgmlType::kQ4_1)
            acc[g] = std::fma(static_cast<float>(xg[(i * nb + b) * 8 + g]), md, acc[g]);
        }
      }
      float out = reduce_tree(acc, 8);
      if (bias != nullptr) out = out + bias[j];
      y[i * ldy + j] = out;
    }
  }
}

void quantize_q8_blocks(const float* v, int64_t rows, int64_t k, int8_t* q, float* d, int32_t* g) {
  const int64_t nb = k / kBlockSize;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* vb = v + r * k + b * 32;
      int8_t* qb = q + r * k + b * 32;
      quantize_rows_int8(vb, 1, 32, qb, 32, d + r * nb + b, nullptr);
      if (g != nullptr)
        for (int t = 0; t < 8; ++t) g[(r * nb + b) * 8 + t] = qb[4 * t] + qb[4 * t + 1] + qb[4 * t + 2] + qb[4 * t + 3];
    }
  }
}

constexpr KernelTable kTable{Isa::kScalar,  quantize_rows_int8, linear_int8,       dequantize,
                             linear_gguf_f32, linear_gguf_q8,    quantize_q8_blocks, 64, 64,
                             nullptr,         nullptr,           0,  0};

}  // namespace

const KernelTable& scalar_kernels() { return kTable; }

}  // namespace transformer_core::kernels::quant
