// One way to go parallel (after ATen's / CTranslate2's parallel.h): every parallel loop in the
// library goes through parallel_for, which wraps a single OpenMP region. Work smaller than
// `grain` runs serially on the calling thread, regions are never nested, and BLAS called from
// inside a region runs single-threaded (OpenBLAS's OpenMP build checks omp_in_parallel()).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace transformer_core {

// Threads the library uses: one process-wide count (runtime.cpp). set_num_threads() changes it for
// every thread, OMP_NUM_THREADS sets the default, and an OpenMP limit set in the calling thread
// (threadpoolctl) can lower it there. n outside [1, kMaxThreads]: std::invalid_argument.
constexpr int kMaxThreads = 1024;
int get_num_threads();
void set_num_threads(int64_t n);

namespace kernels {

// fn(begin, end) is called on disjoint chunks that cover [begin, end).
// grain: the smallest number of iterations worth a thread of its own.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int max_threads = get_num_threads();
  const int64_t by_grain = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int num_threads = static_cast<int>(std::min<int64_t>(max_threads, by_grain));
  if (num_threads <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
#pragma omp parallel num_threads(num_threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = begin + t * chunk;
    const int64_t e = std::min(end, b + chunk);
    if (b < e) fn(b, e);
  }
}

// Like parallel_for, but iterations are handed out dynamically one task at a time:
// for work items of uneven cost (causal attention blocks). fn(task, thread_id).
template <class F>
void parallel_tasks(int64_t num_tasks, const F& fn) {
  if (num_tasks <= 0) return;
  const int num_threads = static_cast<int>(std::min<int64_t>(get_num_threads(), num_tasks));
  if (num_threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i, 0);
    return;
  }
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < num_tasks; ++i) fn(i, omp_get_thread_num());
}

}  // namespace kernels
}  // namespace transformer_core
