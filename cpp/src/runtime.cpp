// The library's thread count. Defaults to OpenMP's (OMP_NUM_THREADS, else the core count), so that
// threadpoolctl, which limits OpenMP through omp_set_num_threads, limits us too. OpenBLAS itself is
// kept single-threaded (module.cpp): every parallel loop is ours.
#include "transformer_core/kernels/parallel.hpp"

#include <stdexcept>
#include <string>

namespace transformer_core {

int get_num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: n must be >= 1, got " + std::to_string(n));
  omp_set_num_threads(n);
}

}  // namespace transformer_core
