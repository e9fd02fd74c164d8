// Our own fp32 matrix product, for the linear layers' many-row case (encoding a batch, prefill,
// training). GotoBLAS's design (Goto & van de Geijn, "Anatomy of High-Performance Matrix
// Multiplication", ACM TOMS 2008), cut down to what a linear layer needs:
//
//   1. pack B once per call into column panels of kPanel = 32 columns:
//        panel q holds B[p, 32q + t] at packed[q·32·k + 32p + t]      (zero beyond the last column)
//      so the micro-kernel reads one panel row (32 floats) per step of p, from consecutive addresses
//      (AVX2 packs 16-column panels into the same space, column j still at packed + j·k for j a
//      multiple of 16: its kernel covers 16 columns; sgemm_avx2.cpp);
//   2. a micro-kernel keeps an MR × 32 block of C in registers (AVX-512: 12 rows × 2 zmm = 24
//      accumulators; AVX2: 6 rows × 2 ymm of a 16-column panel = 12), and for each p broadcasts
//      A[i, p] of its MR rows and adds A[i, p] · B[p, panel's columns] with one FMA per register.
//
// Why not BLAS here: BLAS packs B on every call, and our calls are fixed tiles of the output (so
// that results do not depend on the thread count): the weights were packed again for every
// 64-row tile. Packing B once per call and sharing it between the tiles removes that, and the
// tiles can take any shape.
//
// Every C[i, j] of one call is one FMA chain in the order p = 0, 1, …, k − 1 starting from 0:
//   acc = fma(A[i, p], B[p, j], acc)
// whatever the ISA, the tile or the thread, so the AVX2 and AVX-512 kernels give the same bits,
// and so does any split of the work. (BLAS gives other bits: its order is its own.) The linear
// layer calls it per depth block of k and adds the blocks' sums in order (linear.hpp).
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
  // The same product with B as it lies, unpacked, its rows contiguous: B[p, j] = b[p · ldb + j]
  // (j < cols). The kernel reads the panels' rows from B itself, so the same operations in the same
  // order as multiply on pack_b's panels: the same bits. For a B that is read by one row block only
  // (attention's values: P · V), where packing would copy it for one use.
  void (*multiply_rows)(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* b,
                        int64_t ldb, float* c, int64_t ldc, bool accumulate);
};

// The kernels of the active ISA (quant/isa.hpp: set_isa / TC_ISA choose it; "scalar" takes the
// AVX2 kernels, which give the same bits), or nullptr on a CPU without AVX2 and FMA (then the
// callers use BLAS).
const Kernels* active();

// Each ISA's table (cpp/src/kernels/sgemm_<isa>.cpp, compiled with that ISA's flags).
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();

// fp32 products on AMX tiles (sgemm_amx.cpp), for the linear layer's many-row case on the "amx"
// ISA. tdpbf16ps multiplies bfloat16 tiles (16 × 32 by 32 × 16, 8,192 multiply-adds) and adds the
// products into fp32. To keep fp32's accuracy each fp32 value is split into three bf16 values, each
// rounded to nearest-even from what the previous ones left:
//
//   a = a0 + a1 + a2   exactly,   |a1| <= 2^-8 |a|,   |a2| <= 2^-16 |a|
//   a·b ≈ a0·b0 + (a0·b1 + a1·b0) + (a0·b2 + a1·b1 + a2·b0)
//
// Six bf16 products, each exact in fp32. The three left out (a1·b2, a2·b1, a2·b2) are below
// 2^-23 |a·b|, the size of fp32's own rounding ("bf16x6": Henry, Tang & Heinecke, "Leveraging the
// bfloat16 Artificial Intelligence Datatype For Higher-Precision Computations", ARITH 2019).
// The sums run in another order than the FMA chain of the kernels above, so the bits differ from
// the avx2/avx512 kernels' (tests/test_gemm.py bounds the error against fp64 the same way); they do
// not depend on the thread count or the tiling.
// tdpbf16ps treats inputs below fp32's normal range (2^-126) as zero and flushes such products
// and results to zero: an absolute error floor of about 6 · k · 2^-126 (1e-34 at k = 1536), seen only
// where an output's terms are all that small.
// Inf and NaN cannot be split (an Inf's zero parts would give Inf · 0 = NaN), so split_a and pack_b
// report them, and the caller computes those rows or columns with the FMA kernels instead.
namespace split {

constexpr int64_t kRows = 32;   // rows of A per kernel step: two tiles of 16
constexpr int64_t kCols = 32;   // columns of B per kernel step: two tiles of 16
constexpr int64_t kDepth = 32;  // values of the inner dimension per tile (16 pairs)

inline int64_t padded_k(int64_t k) { return (k + kDepth - 1) / kDepth * kDepth; }
inline int64_t padded_rows(int64_t m) { return (m + kRows - 1) / kRows * kRows; }
// bf16 values (uint16_t) that pack_b's tiles of `cols` columns take.
inline int64_t packed_b_size(int64_t k, int64_t cols) { return (cols + kCols - 1) / kCols * kCols * padded_k(k) * 3; }

struct Kernels {
  const char* isa;
  // Rows 0 … m − 1 of A (A[i, p] = a[i · lda + p]) into tiles of three bf16 parts: for each group of
  // 16 rows, for each 32 values of k, the parts' 16 × 32 tiles (1,024 bytes each, row-major):
  //   part s of A[i, p] at out[((i / 16 · steps + p / 32) · 3 + s) · 512 + (i % 16) · 32 + p % 32]
  // with steps = padded_k(k) / 32; zero for p >= k and m <= i < rows (rows: a multiple of 16). So
  // row r (a multiple of 16) starts at out + 3 · r · padded_k(k). finite[i] = 1, or 0 where row i
  // holds an Inf or NaN (then its parts are not to be used).
  void (*split_a)(int64_t m, int64_t rows, int64_t k, const float* a, int64_t lda, uint16_t* out, uint8_t* finite);
  // The columns of B = wᵀ, w [cols, k] with row stride ldw, into tiles: for each 16 columns, for each
  // 32 values of k, the three parts' 16 × 32 tiles in tdpbf16ps's pair layout (zero beyond k and
  // beyond the last column, up to a multiple of kCols). Returns false if w holds an Inf or NaN.
  bool (*pack_b)(int64_t k, int64_t cols, const float* w, int64_t ldw, uint16_t* packed);
  // c[i, j] = bias[j] + Σ_p A[i, p] · B[p, j] for i < m, j < cols (bias may be nullptr: 0), from
  // split_a's tiles (row 0 at a; rows up to padded_rows(m) readable) and pack_b's tiles; c has row
  // stride ldc. The bias starts the sum.
  void (*multiply)(int64_t m, int64_t cols, int64_t k, const uint16_t* a, const uint16_t* packed, const float* bias,
                   float* c, int64_t ldc);
};

// The AMX kernels while the "amx" ISA is active (quant/isa.hpp), else nullptr.
const Kernels* active();
const Kernels& amx_kernels();

}  // namespace split

}  // namespace transformer_core::kernels::sgemm
