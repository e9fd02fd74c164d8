#include "transformer_core/ops/optim.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::ops {

namespace {
constexpr int64_t kElementGrain = 32768;
// The chunk of a sum: fixed, so that partial sums (and their order) do not depend on the threads.
constexpr int64_t kSumChunk = 65536;

std::string num(double v) { return std::to_string(v); }
void check_size(int64_t n, const char* op) {
  if (n < 0) throw std::invalid_argument(std::string(op) + ": size must be >= 0, got " + std::to_string(n));
}
}  // namespace

template <class T>
void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq, int64_t n, const AdamHyper& h) {
  check_size(n, "adam_update");
  if (!(h.lr >= 0)) throw std::invalid_argument("adam_update: lr must be >= 0, got " + num(h.lr));
  if (!(h.eps >= 0)) throw std::invalid_argument("adam_update: eps must be >= 0, got " + num(h.eps));
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0))
    throw std::invalid_argument("adam_update: betas must be in [0, 1), got (" + num(h.beta1) + ", " + num(h.beta2) + ")");
  if (h.step < 1) throw std::invalid_argument("adam_update: step must be >= 1, got " + std::to_string(h.step));
  if (h.amsgrad && max_exp_avg_sq == nullptr)
    throw std::invalid_argument("adam_update: amsgrad needs max_exp_avg_sq");
  kernels::parallel_for(0, n, kElementGrain, [&](int64_t b, int64_t e) {
    kernels::adam_update(param, grad, exp_avg, exp_avg_sq, h.amsgrad ? max_exp_avg_sq : nullptr, b, e, h);
  });
}

template <class T>
void sgd_update(T* param, const T* grad, T* momentum_buffer, int64_t n, const SgdHyper& h) {
  check_size(n, "sgd_update");
  if (!(h.lr >= 0)) throw std::invalid_argument("sgd_update: lr must be >= 0, got " + num(h.lr));
  if (!(h.momentum >= 0)) throw std::invalid_argument("sgd_update: momentum must be >= 0, got " + num(h.momentum));
  if (h.momentum != 0 && momentum_buffer == nullptr)
    throw std::invalid_argument("sgd_update: momentum != 0 needs a momentum_buffer");
  kernels::parallel_for(0, n, kElementGrain,
                        [&](int64_t b, int64_t e) { kernels::sgd_update(param, grad, momentum_buffer, b, e, h); });
}

template <class T>
int64_t count_nonfinite(const T* x, int64_t n) {
  check_size(n, "count_nonfinite");
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<int64_t> part(static_cast<size_t>(chunks));
  kernels::parallel_for(0, chunks, 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) part[c] = kernels::count_nonfinite(x, c * kSumChunk, std::min(n, (c + 1) * kSumChunk));
  });
  int64_t total = 0;
  for (int64_t c : part) total += c;
  return total;
}

template <class T>
double vector_norm(const T* x, int64_t n, double ord, bool power) {
  check_size(n, "vector_norm");
  if (!(ord > 0)) throw std::invalid_argument("vector_norm: ord must be > 0 (or inf), got " + num(ord));
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
  kernels::parallel_for(0, chunks, 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) part[c] = kernels::norm_partial(x, c * kSumChunk, std::min(n, (c + 1) * kSumChunk), ord);
  });
  const bool is_max = std::isinf(ord);
  double total = 0;
  for (double p : part) {
    if (!is_max) total += p;
    else if (p != p || (total == total && p > total)) total = p;  // max, NaN wins
  }
  if (power || is_max) return total;
  if (ord == 2.0) return std::sqrt(total);
  if (ord == 1.0) return total;
  return std::pow(total, 1.0 / ord);
}

#define TC_INSTANTIATE(T)                                                                      \
  template void adam_update<T>(T*, const T*, T*, T*, T*, int64_t, const AdamHyper&);           \
  template void sgd_update<T>(T*, const T*, T*, int64_t, const SgdHyper&);                     \
  template int64_t count_nonfinite<T>(const T*, int64_t);                                      \
  template double vector_norm<T>(const T*, int64_t, double, bool);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
