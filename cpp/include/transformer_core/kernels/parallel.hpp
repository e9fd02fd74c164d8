// One way to go parallel (after ATen's / CTranslate2's parallel.h): every parallel loop in the
// library goes through parallel_for, which wraps a single OpenMP region. Work smaller than
// `grain` runs serially on the calling thread, regions are never nested, and BLAS called from
// inside a region runs single-threaded (OpenBLAS's OpenMP build checks omp_in_parallel()).
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace transformer_core {

// Threads the library uses: one process-wide count (runtime.cpp). set_num_threads() changes it for
// every thread, OMP_NUM_THREADS sets the default, and an OpenMP limit set in the calling thread
// (threadpoolctl) can lower it there. n outside [1, kMaxThreads]: std::invalid_argument.
constexpr int kMaxThreads = 1024;
int get_num_threads();
void set_num_threads(int64_t n);

// Every parallel region runs on a team of all get_num_threads() threads, also when it has fewer
// tasks or chunks than threads: the threads left without work wait at the region's end. A team
// sized to each region's task count would change size from region to region, and libgomp ends the
// threads a smaller team leaves out and starts new ones when a team grows again. Measured on 16
// vCPUs of a KVM guest (Emerald Rapids, 16 threads, bench/threads.py): one sentence of MiniLM,
// whose regions have 4, 12 and 16 tasks, took 5.3 ms on teams sized to the tasks and 1.2 ms on
// fixed teams (1.4 ms on 4 threads); decoding a SmolLM2-shaped model ran 44 tokens/s against 393.
// fixed_teams(false) sizes teams to the tasks again, for that comparison only (bench/threads.py);
// the teams never change a result (each caller's tasks are fixed by the sizes).
bool fixed_teams();
bool set_fixed_teams(bool fixed);  // returns the previous setting

// Set before the first parallel region of more than one thread. libgomp keeps that region's threads
// for the next ones, and a child process forked after it (multiprocessing's default start method on
// Linux) inherits the team without its threads: its next region would wait for them forever. So
// the child computes on one thread, and set_num_threads refuses more there (runtime.cpp).
inline std::atomic<bool> g_threads_started{false};
// How many forks led to this process (0 in the first one): state a thread of the parent held at
// the fork (a KVCache in use) is stale in the child, whose count is higher (runtime.cpp).
uint64_t fork_generation();

namespace kernels {

// The team for a region with `wanted` chunks or tasks (> 1) and max_threads threads.
inline int team_size(int64_t wanted, int max_threads) {
  max_threads = std::max(max_threads, 1);
  return fixed_teams() ? max_threads : static_cast<int>(std::min<int64_t>(max_threads, wanted));
}

// fn(begin, end) is called on disjoint chunks that cover [begin, end), one per thread of the team
// (a thread past the end gets none).
// grain: the smallest number of iterations worth a parallel region: fewer than 2 · grain run on
// the calling thread.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t by_grain = n / std::max<int64_t>(grain, 1);
  const int num_threads = by_grain <= 1 ? 1 : team_size(by_grain, get_num_threads());
  if (num_threads <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
  g_threads_started.store(true, std::memory_order_relaxed);
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

// Like parallel_for, but for tasks of uneven cost (causal attention blocks, the tiles of a product
// with a ragged edge): fn(task, thread_id) for every task in [0, num_tasks), each exactly once.
//
// Each thread starts on its own contiguous share of the tasks and runs it in order, so consecutive
// tasks of one thread share their data (the rows of x of a GEMM's row of tiles stay in that core's
// L2). A thread that finishes its share takes the next tasks of the others' shares, so a slow
// thread or costly tasks do not hold the region up. Handing out single tasks from one counter
// instead interleaves the threads and doubles what each core's cache must hold: measured on a
// Xeon with 2 threads, a 900 × 384 → 384 linear layer took 750 µs that way, 630 µs this way.
// Which thread runs a task never changes its result (the callers' tasks are fixed tiles).
//
// thread_id < max_threads always. A caller with per-thread scratch reads get_num_threads() once,
// sizes the scratch by it and passes the same count here: another Python thread may call
// set_num_threads in between, and a second read could then hand out ids past the scratch.
template <class F>
void parallel_tasks(int64_t num_tasks, const F& fn, int max_threads = get_num_threads()) {
  if (num_tasks <= 0) return;
  const int num_threads = num_tasks == 1 ? 1 : team_size(num_tasks, max_threads);
  if (num_threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i, 0);
    return;
  }
  struct alignas(64) Share {  // tasks [next, end) not yet taken (one cache line per share)
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  constexpr int kLocalShares = 16;
  Share local[kLocalShares];
  std::unique_ptr<Share[]> heap;
  Share* shares = local;
  if (num_threads > kLocalShares) {
    heap.reset(new Share[num_threads]);
    shares = heap.get();
  }
  for (int t = 0; t < num_threads; ++t) {
    shares[t].next.store(num_tasks * t / num_threads, std::memory_order_relaxed);
    shares[t].end = num_tasks * (t + 1) / num_threads;
  }
  g_threads_started.store(true, std::memory_order_relaxed);
#pragma omp parallel num_threads(num_threads)
  {
    const int t = omp_get_thread_num();
    // own share first, then the others' (a team smaller than asked for still covers every share)
    for (int v = 0; v < num_threads; ++v) {
      Share& share = shares[(t + v) % num_threads];
      if (share.next.load(std::memory_order_relaxed) >= share.end) continue;  // taken: no atomic add
      for (int64_t i; (i = share.next.fetch_add(1, std::memory_order_relaxed)) < share.end;) fn(i, t);
    }
  }
}

// parallel_tasks, or every task on the calling thread (thread id 0) when serial: for problems too
// small to be worth a parallel region. The tasks and so the results are the same either way.
template <class F>
void run_tasks(bool serial, int64_t num_tasks, const F& fn, int max_threads = get_num_threads()) {
  if (serial) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t, 0);
  } else {
    parallel_tasks(num_tasks, fn, max_threads);
  }
}

}  // namespace kernels
}  // namespace transformer_core
