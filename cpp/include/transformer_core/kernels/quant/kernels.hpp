// The quantized kernels: raw pointers, no checks, one table of functions per ISA (isa.hpp).
// Formats and the quantization rule: formats.hpp. The ops (ops/quantized_linear.hpp) check sizes,
// quantize activations, split the work into fixed tiles and run them in parallel.
//
// Every kernel computes a rectangle  y[i0:i1, j0:j1]  (x rows i, output features j); the value of
// one output never depends on the rectangle it was computed in, so the thread count and the tiling
// never change a result. The floating-point operations are fixed per output (below) and each ISA
// performs them in that order, so every ISA gives the same bits as the scalar reference.
//
// Lanes. The fp32-activation GGUF product keeps 32 partial sums per output, one per position p of
// the block (lane p accumulates  fma(w[32b + p], x[32b + p], acc_p)  over the blocks b in order);
// the Q8-activation product keeps 8, one per group of 4 consecutive values. They are added by a
// fixed halving tree:  reduce(acc[0:2n]) = reduce(acc[0:n] + acc[n:2n])  down to one value — the
// order in which 512/256/128-bit registers fold. This is what makes SIMD and scalar agree bitwise.
#pragma once

#include <cstdint>

#include "transformer_core/kernels/quant/formats.hpp"
#include "transformer_core/kernels/quant/isa.hpp"

namespace transformer_core::kernels::quant {

struct KernelTable {
  Isa isa;

  // Per-row symmetric int8 quantization (formats.hpp's rule), rows of v: [rows, k] →
  //   q: [rows, ldq] int8 (columns k..ldq-1 set to 0)   scale: [rows] fp32
  //   sum: [rows] int32, Σ_k q[r, k] (or nullptr)
  void (*quantize_rows_int8)(const float* v, int64_t rows, int64_t k, int8_t* q, int64_t ldq, float* scale,
                             int32_t* sum);

  // y[i, j] = float(acc) · (sx[i] · sw[j]) + bias[j]      acc = Σ_k xq[i, k] · w[j, k]   (exact int32)
  //   with accumulate:  y[i, j] = y[i, j] + (float(acc) · (sx[i] · sw[j]) + bias[j])
  //   xq: [*, ldq] int8, zero beyond k, ldq a multiple of 64   sx: [*]   xsum: [*] Σ_k xq[i, k]
  //   w: [*, k] int8 (any value in [-128, 127])   sw: [*]   bias: [*] or nullptr (then no addition)
  //   y: [*, ldy]; rows i0..i1 of x, features j0..j1 of w.   k <= kInt8MaxK.
  void (*linear_int8)(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* xsum, int64_t i0, int64_t i1,
                      int64_t k, const int8_t* w, const float* sw, const float* bias, int64_t j0, int64_t j1, float* y,
                      int64_t ldy, bool accumulate);

  // out[r − r0, 32(b − b0) + p] = w_p of block b of row r (formats.hpp), bit for bit gguf.quants'.
  //   w: [rows, k / 32 blocks] bytes (row r at w + r · (k / 32) · type_size)   out: [r1 − r0, ldo]
  void (*dequantize)(GgmlType type, const uint8_t* w, int64_t k, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                     float* out, int64_t ldo);

  // Weights decoded in registers, fp32 activations:
  //   y[i, j] = reduce_32(acc) + bias[j],  acc_p = Σ_b fma(ŵ[j, 32b + p], x[i, 32b + p], ·)  in block order
  //   (ŵ = dequantize's values, up to the sign of a zero, which no such sum can see)
  //   x: [*, ldx]   w: GGUF rows of k values   bias: [*] or nullptr   y: [*, ldy]
  void (*linear_gguf_f32)(GgmlType type, const float* x, int64_t ldx, int64_t i0, int64_t i1, int64_t k,
                          const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y, int64_t ldy);

  // Q8 activation blocks (quantize_q8_blocks) × GGUF blocks, integer dots per group of 4:
  //   s_g   = Σ_{t<4} wq[32b + 4g + t] · xq[i, 32b + 4g + t]   exact int32; wq = qs (Q8_0), nib − 8 (Q4_0),
  //           nib (Q4_1)
  //   acc_g = fma(float(s_g), d_w · xd[i, b], acc_g)
  //   and, for Q4_1,  acc_g = fma(float(xg[i, b, g]), m · xd[i, b], acc_g)
  //   y[i, j] = reduce_8(acc) + bias[j]
  //   xq: [*, k] int8   xd: [*, k / 32]   xg: [*, k / 32, 8] int32 group sums of xq
  void (*linear_gguf_q8)(GgmlType type, const int8_t* xq, const float* xd, const int32_t* xg, int64_t i0, int64_t i1,
                         int64_t k, const uint8_t* w, const float* bias, int64_t j0, int64_t j1, float* y,
                         int64_t ldy);

  // Activations to Q8 blocks: each block of 32 values of each row by the per-row rule (formats.hpp).
  //   v: [rows, k], k a multiple of 32   q: [rows, k] int8   d: [rows, k / 32] fp32
  //   g: [rows, k / 32, 8] int32, g[r, b, t] = Σ_{u<4} q[r, 32b + 4t + u] (or nullptr)
  void (*quantize_q8_blocks)(const float* v, int64_t rows, int64_t k, int8_t* q, float* d, int32_t* g);

  // The rectangle of y (x rows × output features) that the op hands linear_int8 at once, when x has
  // more rows than a few: 64 × 64 for the SIMD dots; AMX wants wide ones (its x rows are repacked
  // once per rectangle and reused for every feature: 32 × 768 measured fastest).
  int64_t int8_tile_rows;
  int64_t int8_tile_cols;

  // The int8 product for many rows of x, from weights packed once per call (or once per
  // PackedWeightScope); nullptr where the ISA has none (the op then runs linear_int8). Same contract
  // and bits as linear_int8, with the weights in panels of kInt8PanelFeatures output features:
  //   panel P (features 16P .. 16P + 15) at packed + P · 64 · ⌈k / 4⌉ bytes; in it, the k values in
  //   groups of 4 (the last one zero-padded), group g of feature 16P + c at byte 64g + 4c + t, holding
  //   w[16P + c, 4g + t] + 128 as an unsigned byte (features past n hold 128: weight 0).
  // pack_int8 fills the panels of features [j0, j1) (j0 a multiple of 16) from w: [n, k];
  // linear_int8_packed computes y[i0:i1, j0:j1] (j0 a multiple of 16) from them; the op hands it
  // rectangles of int8_packed_tile_rows × int8_packed_tile_cols (a multiple of 16).
  void (*pack_int8)(const int8_t* w, int64_t k, int64_t j0, int64_t j1, uint8_t* packed);
  void (*linear_int8_packed)(const int8_t* xq, int64_t ldq, const float* sx, const int32_t* xsum, int64_t i0,
                             int64_t i1, int64_t k, const uint8_t* packed, const float* sw, const float* bias,
                             int64_t j0, int64_t j1, float* y, int64_t ldy, bool accumulate);
  int64_t int8_packed_tile_rows;
  int64_t int8_packed_tile_cols;
};

// Output features per panel of the packed int8 weights (KernelTable::pack_int8).
constexpr int64_t kInt8PanelFeatures = 16;

// The table of an ISA (isa_supported(isa) must hold), and of the active one. (No inline functions in
// this header: it is compiled under every ISA's flags, and the linker keeps one copy of an inline.)
const KernelTable& kernel_table(Isa isa);
const KernelTable& active_kernels();

// One per ISA translation unit (quant_scalar.cpp, quant_avx2.cpp, quant_avx512vnni.cpp, quant_amx.cpp).
const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512vnni_kernels();
const KernelTable& amx_kernels();

}  // namespace transformer_core::kernels::quant
