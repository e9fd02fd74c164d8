// Optimizer ops: the fused, element-wise update of one parameter (kernels/optim.hpp) and the
// reductions of gradient clipping, over flat C-contiguous arrays of n elements, parallel over
// fixed chunks. Element-wise updates and chunked sums combined in chunk order: the same bits for any
// thread count. Throw std::invalid_argument on bad hyperparameters (the bindings: ValueError).
#pragma once

#include <cstdint>

#include "transformer_core/kernels/optim.hpp"

namespace transformer_core::ops {

using kernels::AdamHyper;
using kernels::SgdHyper;

// One Adam / AdamW step.   param, grad, exp_avg, exp_avg_sq: [n]   max_exp_avg_sq: [n] (amsgrad) or nullptr
template <class T>
void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq, int64_t n, const AdamHyper& h);

// One SGD step.   param, grad: [n]   momentum_buffer: [n] (momentum != 0) or nullptr
template <class T>
void sgd_update(T* param, const T* grad, T* momentum_buffer, int64_t n, const SgdHyper& h);

// Number of NaN / ±inf values in x[n].
template <class T>
int64_t count_nonfinite(const T* x, int64_t n);

// ‖x‖_ord of x[n] in double: ord = 2 (Euclidean), 1, inf (max |x|), or any other ord > 0.
// Returns the ord-th power sum instead of the norm when `power` is set (ord = inf: the max), so that
// norms of several arrays combine exactly: total = (Σ_i power_i)^(1/ord).
template <class T>
double vector_norm(const T* x, int64_t n, double ord, bool power);

}  // namespace transformer_core::ops
