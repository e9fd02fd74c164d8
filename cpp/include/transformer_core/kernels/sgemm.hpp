// Our own fp32 matrix product, for the linear layers' many-row case (encoding a batch, prefill,
// training). GotoBLAS's design (Goto & van de Geijn, "Anatomy of High-Performance Matrix
// Multiplication", ACM TOMS 2008), cut down to what a linear layer needs:
//
//   1. pack B once per call into column panels of kPanel = 32 columns:
//        panel q holds B[p, 32q + t] at packed[q·32·k + 32p + t]      (zero beyond the last column)
//      so the micro-kernel reads one panel row (32 floats) per step of p, from consecutive addresses;
//   2. a micro-kernel keeps an MR × 32 block of C in registers (AVX-512: 12 rows × 2 zmm = 24
//      accumulators; AVX2: 6 rows × 2 ymm of a half panel = 12), and for each p broadcasts A[i, p]
//      of its MR rows and adds A[i, p] · B[p, 32q : 32q + 32] with one FMA per register.
//
// Why not BLAS here: BLAS packs B on every call, and our calls are fixed tiles of the output (so
// that results do not depend on the thread count): the weights were packed again for every
// 64-row tile. Packing B once per call and sharing it between the tiles removes that, and the
// tiles can take any shape.
//
// Every C[i, j] is one FMA chain in the order p = 0, 1, …, k − 1 starting from 0:
//   acc = fma(A[i, p], B[p, j], acc)
// whatever the ISA, the tile or the thread, so the AVX2 and AVX-512 kernels give the same bits,
// and so does any split of the work. (BLAS gives other bits: its order is its own.)
#pragma once

#include <cstdint>

namespace transformer_core::kernels::sgemm {

constexpr int64_t kPanel = 32;

// Floats that the panels of a k × n matrix B take.
inline int64_t packed_floats(int64_t k, int64_t n) { return (n + kPanel - 1) / kPanel * kPanel * k; }

// One ISA's kernels: raw pointers, no checks; single-threaded (the caller splits the work).
struct Kernels {
  const char* isa;
  // Packs B[0:k, 0:cols] into panels (layout above); B[p, j] = b[p · rs_b + j · cs_b].
  // A linear layer's weight w [n, k] is B = wᵀ: rs_b = 1, cs_b = k.
  void (*pack_b)(int64_t k, int64_t cols, const float* b, int64_t rs_b, int64_t cs_b, float* packed);
  // c[i, j] = Σ_p A[i, p] · B[p, j]   for i < m, j < cols   (cols ≤ the panels' columns);
  // with accumulate, c[i, j] += that sum instead (the sum first, then one addition).
  // A[i, p] = a[i · rs_a + p · cs_a]; c has row stride ldc; k ≥ 1.
  void (*multiply)(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* packed,
                   float* c, int64_t ldc, bool accumulate);
};

// The kernels of the active ISA (quant/isa.hpp: set_isa / TC_ISA choose it; "scalar" takes the
// AVX2 kernels, which give the same bits), or nullptr on a CPU without AVX2 and FMA (then the
// callers use BLAS).
const Kernels* active();

// Each ISA's table (cpp/src/kernels/sgemm_<isa>.cpp, compiled with that ISA's flags).
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();

}  // namespace transformer_core::kernels::sgemm
