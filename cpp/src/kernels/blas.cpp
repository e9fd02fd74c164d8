// The BLAS table (kernels/blas.hpp): OpenBLAS linked, MKL loaded at run time with dlopen.
#include "transformer_core/kernels/blas.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>

namespace transformer_core::kernels::blas {

namespace {
// CBLAS enums are ints with the same values in every implementation (101 = row-major, ...).
void openblas_sgemm(int o, int ta, int tb, int m, int n, int k, float al, const float* a, int lda, const float* b,
                    int ldb, float be, float* c, int ldc) {
  cblas_sgemm(static_cast<CBLAS_ORDER>(o), static_cast<CBLAS_TRANSPOSE>(ta), static_cast<CBLAS_TRANSPOSE>(tb), m, n, k,
              al, a, lda, b, ldb, be, c, ldc);
}
void openblas_dgemm(int o, int ta, int tb, int m, int n, int k, double al, const double* a, int lda, const double* b,
                    int ldb, double be, double* c, int ldc) {
  cblas_dgemm(static_cast<CBLAS_ORDER>(o), static_cast<CBLAS_TRANSPOSE>(ta), static_cast<CBLAS_TRANSPOSE>(tb), m, n, k,
              al, a, lda, b, ldb, be, c, ldc);
}
void openblas_sgemv(int o, int t, int m, int n, float al, const float* a, int lda, const float* x, int incx, float be,
                    float* y, int incy) {
  cblas_sgemv(static_cast<CBLAS_ORDER>(o), static_cast<CBLAS_TRANSPOSE>(t), m, n, al, a, lda, x, incx, be, y, incy);
}
void openblas_dgemv(int o, int t, int m, int n, double al, const double* a, int lda, const double* x, int incx,
                    double be, double* y, int incy) {
  cblas_dgemv(static_cast<CBLAS_ORDER>(o), static_cast<CBLAS_TRANSPOSE>(t), m, n, al, a, lda, x, incx, be, y, incy);
}

const Table kOpenBlas{openblas_sgemm, openblas_dgemm, openblas_sgemv, openblas_dgemv, true};
Table mkl_table{};
std::string mkl_info;
std::string mkl_path;  // the library behind mkl_table, once loaded
std::atomic<const Table*> current{&kOpenBlas};

// MKL's service functions (mkl_service.h), by value.
constexpr int kMklThreadingSequential = 1;  // MKL_THREADING_SEQUENTIAL
constexpr int kMklInterfaceLp64 = 0;        // MKL_INTERFACE_LP64
constexpr int kMklCbwrAuto = 2;             // MKL_CBWR_AUTO
constexpr int kMklCbwrStrict = 0x10000;     // MKL_CBWR_STRICT
constexpr int kMklCbwrSuccess = 0;
}  // namespace

const Table& table() { return *current.load(std::memory_order_acquire); }

std::string use_mkl(const std::string& path) {
  if (mkl_table.sgemm != nullptr) {  // loaded once per process: the same library only
    if (path != mkl_path) return "MKL is already loaded from " + mkl_path + ", not " + path;
    current.store(&mkl_table, std::memory_order_release);
    return "";
  }
  // RTLD_LOCAL keeps libmkl_rt's own cblas_* from taking the place of OpenBLAS's, but libmkl_rt
  // loads its layers (libmkl_sequential, libmkl_core) globally: a torch imported later binds its
  // undefined MKL service symbols (mkl_serv_get_max_threads, ...) to our sequential layer and drops to
  // one thread (bench/README.md, "torch in the same process"). dlmopen(LM_ID_NEWLM) would isolate
  // them but crashes in glibc 2.36 (libmkl_rt dlopens its layers RTLD_GLOBAL inside the namespace).
  // Hence MKL is opt-in (TC_BLAS=mkl), never the default.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return std::string("dlopen failed: ") + dlerror();
  auto sym = [&](const char* name) { return dlsym(h, name); };
  auto set_threading = reinterpret_cast<int (*)(int)>(sym("MKL_Set_Threading_Layer"));
  auto set_interface = reinterpret_cast<int (*)(int)>(sym("MKL_Set_Interface_Layer"));
  auto cbwr_set = reinterpret_cast<int (*)(int)>(sym("MKL_CBWR_Set"));
  auto version = reinterpret_cast<void (*)(char*, int)>(sym("MKL_Get_Version_String"));
  Table t{reinterpret_cast<SgemmFn>(sym("cblas_sgemm")), reinterpret_cast<DgemmFn>(sym("cblas_dgemm")),
          reinterpret_cast<SgemvFn>(sym("cblas_sgemv")), reinterpret_cast<DgemvFn>(sym("cblas_dgemv")), false};
  if (!set_threading || !set_interface || !cbwr_set || !version || !t.sgemm || !t.dgemm || !t.sgemv || !t.dgemv) {
    dlclose(h);
    return "not MKL's single dynamic library (a symbol is missing): " + path;
  }
  // Before any other MKL call: the layers are fixed at the first call.
  set_interface(kMklInterfaceLp64);
  if (set_threading(kMklThreadingSequential) != kMklThreadingSequential) {
    dlclose(h);
    return "MKL refused its sequential threading layer";
  }
  if (cbwr_set(kMklCbwrAuto | kMklCbwrStrict) != kMklCbwrSuccess) {
    dlclose(h);
    return "MKL refused conditional numerical reproducibility (AUTO,STRICT)";
  }
  char buf[256] = {};
  version(buf, sizeof buf - 1);
  mkl_info = std::string("mkl: ") + buf + " (sequential, CNR AUTO,STRICT)";
  mkl_path = path;
  mkl_table = t;  // the handle stays open for the life of the process
  current.store(&mkl_table, std::memory_order_release);
  return "";
}

void use_openblas() { current.store(&kOpenBlas, std::memory_order_release); }

std::string info() {
  if (current.load() != &kOpenBlas) return mkl_info;
  return std::string("openblas: ") + openblas_get_config() + " (core " + openblas_get_corename() + ")";
}

}  // namespace transformer_core::kernels::blas
