// Fused optimizer updates over one parameter's flat arrays, element-wise, in torch.optim's order of
// operations (torch/optim/adam.py and sgd.py, the single-tensor path), and the reductions that
// gradient clipping and the non-finite check need.
//
// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019), step t (1-based):
//   g ← -g if maximize
//   AdamW: p ← p · (1 - lr · wd)            Adam: g ← g + wd · p         (when wd ≠ 0)
//   m ← lerp(m, g, 1 - β1)                  (= β1 m + (1 - β1) g, torch's lerp_ rounding)
//   v ← v · β2 + (1 - β2) · g · g
//   step_size = lr / (1 - β1ᵗ),   denom = sqrt(v̂) / sqrt(1 - β2ᵗ) + eps,   v̂ = v (or, amsgrad,
//   v_max ← max(v_max, v) and v̂ = v_max)
//   p ← p + (-step_size) · m / denom
//
// SGD with momentum (Sutskever et al. 2013; torch's formulation), momentum buffer b:
//   g ← -g if maximize;   g ← g + wd · p
//   b ← g (first step)  or  b ← b · μ + (1 - dampening) · g;   g ← g + μ · b (nesterov) or g ← b
//   p ← p + (-lr) · g
//
// The scalars are rounded to T once, as torch passes Python floats into a T kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace transformer_core::kernels {

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = true;  // AdamW; false: Adam's L2 term added to the gradient
  bool amsgrad = false, maximize = false;
  int64_t step = 1;  // this update's step number, t >= 1
};

// Calls f(std::bool_constant<flags>...) for the runtime flags, so that each combination of the
// update's options gets its own loop: a flag tested inside the loop (or read through the Hyper
// reference, which GCC must assume a store to p[i] may change) kept GCC from vectorising it.
template <class F>
inline void with_flags(const F& f) {
  f();
}
template <class F, class... Flags>
inline void with_flags(const F& f, bool flag, Flags... rest) {
  if (flag) with_flags([&](auto... c) { f(std::true_type{}, c...); }, rest...);
  else with_flags([&](auto... c) { f(std::false_type{}, c...); }, rest...);
}

// p, g, m, v: [n]   v_max: [n] (amsgrad) or nullptr.  Elements [begin, end).
template <class T>
inline void adam_update(T* p, const T* g, T* m, T* v, T* v_max, int64_t begin, int64_t end, const AdamHyper& h) {
  const double t = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  const T neg_step_size = static_cast<T>(-(h.lr / bias_correction1));
  const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
  const T wd = static_cast<T>(h.weight_decay);
  const T w1 = static_cast<T>(1.0 - h.beta1), w1c = T(1) - w1;  // lerp weight and its complement
  const T beta2 = static_cast<T>(h.beta2), one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
  const T eps = static_cast<T>(h.eps);
  const bool use_wd = h.weight_decay != 0.0, small_w = std::abs(1.0 - h.beta1) < 0.5;
  with_flags(
      [&](auto maximize, auto decoupled_wd, auto l2_wd, auto lerp_from_m, auto amsgrad) {
        // the scalars are this function's locals, not fields of h: no store through p, m, v can change them
        for (int64_t i = begin; i < end; ++i) {
          T gi = maximize ? -g[i] : g[i];
          T pi = p[i];
          if constexpr (decoupled_wd) pi = pi * decay;
          if constexpr (l2_wd) gi = gi + wd * pi;
          const T mi = lerp_from_m ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * w1c;  // torch's lerp
          const T vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
          m[i] = mi;
          v[i] = vi;
          T vh = vi;
          if constexpr (amsgrad) {
            vh = std::max(v_max[i], vi);
            if (vi != vi) vh = vi;  // torch.maximum propagates NaN
            v_max[i] = vh;
          }
          const T denom = std::sqrt(vh) / bc2_sqrt + eps;
          p[i] = pi + neg_step_size * mi / denom;
        }
      },
      h.maximize, use_wd && h.decoupled_weight_decay, use_wd && !h.decoupled_weight_decay, small_w,
      v_max != nullptr);
}

struct SgdHyper {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
  bool first_step = true;  // the momentum buffer does not exist yet: b ← g
};

// p, g: [n]   buf: [n] (momentum ≠ 0) or nullptr.  Elements [begin, end).
template <class T>
inline void sgd_update(T* p, const T* g, T* buf, int64_t begin, int64_t end, const SgdHyper& h) {
  const T wd = static_cast<T>(h.weight_decay), mu = static_cast<T>(h.momentum);
  const T one_minus_damp = static_cast<T>(1.0 - h.dampening), neg_lr = static_cast<T>(-h.lr);
  const bool use_wd = h.weight_decay != 0.0, use_momentum = h.momentum != 0.0 && buf != nullptr;
  with_flags(
      [&](auto maximize, auto weight_decay, auto momentum, auto first_step, auto nesterov) {
        for (int64_t i = begin; i < end; ++i) {
          T gi = maximize ? -g[i] : g[i];
          if constexpr (weight_decay) gi = gi + wd * p[i];
          if constexpr (momentum) {
            const T bi = first_step ? gi : buf[i] * mu + one_minus_damp * gi;
            buf[i] = bi;
            gi = nesterov ? gi + mu * bi : bi;
          }
          p[i] = p[i] + neg_lr * gi;
        }
      },
      // first_step and nesterov only matter with momentum
      h.maximize, use_wd, use_momentum, use_momentum && h.first_step, use_momentum && h.nesterov);
}

// Number of elements of x[begin, end) that are NaN or ±inf.
template <class T>
inline int64_t count_nonfinite(const T* x, int64_t begin, int64_t end) {
  int64_t c = 0;
  for (int64_t i = begin; i < end; ++i) c += (x[i] - x[i] != T(0));  // inf - inf and NaN are NaN
  return c;
}

// Partial sums of a vector norm over x[begin, end), in double:
//   ord = 2: Σ x²,   ord = 1: Σ |x|,   ord = inf: max |x|,   other ord > 0: Σ |x|^ord
// (NaN propagates: a NaN element makes the sum NaN, and the max NaN.)
template <class T>
inline double norm_partial(const T* x, int64_t begin, int64_t end, double ord) {
  if (ord == 2.0) {
    double s = 0;
    for (int64_t i = begin; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }
  if (ord == 1.0) {
    double s = 0;
    for (int64_t i = begin; i < end; ++i) s += std::abs(static_cast<double>(x[i]));
    return s;
  }
  if (std::isinf(ord)) {
    double s = 0;
    for (int64_t i = begin; i < end; ++i) {
      const double a = std::abs(static_cast<double>(x[i]));
      if (a > s || a != a) s = a;
      if (s != s) break;
    }
    return s;
  }
  double s = 0;
  for (int64_t i = begin; i < end; ++i) s += std::pow(std::abs(static_cast<double>(x[i])), ord);
  return s;
}

}  // namespace transformer_core::kernels
