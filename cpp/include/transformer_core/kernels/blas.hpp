// The BLAS behind every matrix product of the library, chosen once per process:
//
//   OpenBLAS (linked; Debian's OpenMP build): the default, on every CPU;
//   Intel MKL (libmkl_rt, loaded at run time from pip's `mkl` package, opt-in with TC_BLAS=mkl): its
//     AVX-512 kernels ran our tile shapes 1.2-2.4x faster on an Intel Xeon (bench/README.md), but
//     its layers, loaded globally, also serve a torch imported later (which then runs one thread).
//
// MKL is put in its sequential threading layer before its first call (no second OpenMP runtime:
// every GEMM of ours runs on one thread inside our own parallel region) and in strict conditional
// numerical reproducibility (MKL_CBWR AUTO,STRICT: the same bits for the same inputs whatever their
// alignment), so results stay bitwise the same for any thread count with either library.
#pragma once

#include <string>

namespace transformer_core::kernels::blas {

// Row-major CBLAS entry points, as cblas.h declares them (enums passed as int).
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                         int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                         double*, int);
using SgemvFn = void (*)(int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemvFn = void (*)(int, int, int, int, double, const double*, int, const double*, int, double, double*, int);

struct Table {
  SgemmFn sgemm;
  DgemmFn dgemm;
  SgemvFn sgemv;
  DgemvFn dgemv;
  bool openblas;  // the linked OpenBLAS (OpenMP build): calls need the SingleThreadedBlas guard
};

// The table in use (OpenBLAS's until use_mkl succeeds).
const Table& table();

// Loads MKL's single dynamic library from `path` (libmkl_rt.so.*) and routes every later product to
// it. Returns "" on success, else why not (the OpenBLAS table stays). Call it once, before any
// product (the package does it at import); products in flight on other threads are not allowed.
std::string use_mkl(const std::string& path);

// Goes back to OpenBLAS (tests, benchmarks).
void use_openblas();

// "openblas 0.3.21 (SkylakeX)" or "mkl 2026.2 (sequential, CNR AUTO,STRICT)".
std::string info();

}  // namespace transformer_core::kernels::blas
