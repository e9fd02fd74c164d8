// The library's thread count: one process-wide setting.
//
// OpenMP's own count (omp_set_num_threads, the nthreads-var ICV) belongs to the OS thread that set
// it: a Python thread started later sees OpenMP's default again. The library therefore keeps its
// own count, process-wide (an atomic), and launches every parallel region with it
// (kernels::parallel_for's num_threads clause). Its default is OpenMP's initial count
// (OMP_NUM_THREADS, else the core count).
//
// threadpoolctl (and any caller of omp_set_num_threads) can still LOWER the count in the thread
// that set the limit: when the calling thread's OpenMP count differs from the value this library
// last knew for that thread (the initial default, or what set_num_threads put there), it is a
// limit set from outside, and the smaller of the two is used. A limit equal to OpenMP's initial
// default in a thread that never called set_num_threads is indistinguishable from no limit.
// OpenBLAS itself is kept single-threaded inside our regions: every parallel loop is ours.
//
// A forked process computes on one thread: libgomp cannot start again in a child the team a
// region of several threads left in the parent (parallel.hpp), ours or another library's in the
// same libgomp (torch imported first shares it). set_num_threads raises the count again only in
// a child of a parent that ran none of our regions (g_threads_started).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core {

namespace {
// OpenMP's count in a thread nobody has changed it in (read once, when the library loads).
const int g_omp_default = omp_get_max_threads();
// OMP_NUM_THREADS above kMaxThreads starts at kMaxThreads: a count set_num_threads would refuse is
// never reported.
std::atomic<int> g_num_threads{std::min(g_omp_default, kMaxThreads)};
// The OpenMP count this library put in the calling thread (-1: none, the default applies).
thread_local int t_known_omp = -1;
// kernels::team_size's setting (parallel.hpp).
std::atomic<bool> g_fixed_teams{true};
// This process was forked after the parent ran our regions of several threads: set_num_threads
// refuses more than one thread here.
std::atomic<bool> g_forked_after_threads{false};
std::atomic<uint64_t> g_fork_generation{0};

void after_fork_in_child() {
  g_forked_after_threads.store(g_threads_started.load(std::memory_order_relaxed), std::memory_order_relaxed);
  g_num_threads.store(1, std::memory_order_relaxed);
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}
const bool g_fork_handler = pthread_atfork(nullptr, nullptr, after_fork_in_child) == 0;
}  // namespace

int get_num_threads() {
  const int process_wide = g_num_threads.load(std::memory_order_relaxed);
  const int omp = omp_get_max_threads();
  const int known = t_known_omp >= 0 ? t_known_omp : g_omp_default;
  return omp == known ? process_wide : std::min(process_wide, omp);
}

void set_num_threads(int64_t n) {
  if (n < 1 || n > kMaxThreads)
    throw std::invalid_argument("n: expected an int in [1, " + std::to_string(kMaxThreads) + "], got " +
                                std::to_string(n));
  if (n > 1 && g_forked_after_threads.load(std::memory_order_relaxed))
    throw std::invalid_argument(
        "n: this process was forked after its parent's OpenMP threads ran, and OpenMP (libgomp) cannot start "
        "threads again in it: it computes on 1 thread; expected 1, got " +
        std::to_string(n) + " (start the process with multiprocessing's 'spawn' or 'forkserver' method for more)");
  g_num_threads.store(static_cast<int>(n), std::memory_order_relaxed);
  // Keep OpenMP's count in this thread equal, so threadpoolctl reports what we use.
  omp_set_num_threads(static_cast<int>(n));
  t_known_omp = static_cast<int>(n);
}

uint64_t fork_generation() { return g_fork_generation.load(std::memory_order_relaxed); }

bool fixed_teams() { return g_fixed_teams.load(std::memory_order_relaxed); }

bool set_fixed_teams(bool fixed) { return g_fixed_teams.exchange(fixed, std::memory_order_relaxed); }

}  // namespace transformer_core
