#include "transformer_core/ops/activation.hpp"

#include <stdexcept>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

namespace {
struct NamedActivation {
  const char* name;
  Activation act;
};
// The one table of activation names (Hugging Face's `hidden_act` / torch's `activation` strings).
constexpr NamedActivation kActivations[] = {
    {"relu", Activation::kRelu},          {"gelu", Activation::kGelu},
    {"gelu_tanh", Activation::kGeluTanh}, {"gelu_new", Activation::kGeluTanh},
    {"gelu_pytorch_tanh", Activation::kGeluTanh}, {"silu", Activation::kSilu},
    {"swish", Activation::kSilu},         {"tanh", Activation::kTanh},
};
}  // namespace

Activation parse_activation(const std::string& name) {
  for (const auto& a : kActivations)
    if (name == a.name) return a.act;
  std::string expected;
  for (const auto& a : kActivations) expected += std::string(expected.empty() ? "'" : ", '") + a.name + "'";
  throw std::invalid_argument("activation: expected one of " + expected + ", got '" + name + "'");
}

std::vector<std::string> activation_names() {
  std::vector<std::string> names;
  for (const auto& a : kActivations) names.emplace_back(a.name);
  return names;
}

template <class T>
void activation(const T* x, int64_t n, Activation act, T* y) {
  require_nonnegative(n, "activation: size");
  kernels::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) { kernels::activate(x + b, e - b, act, y + b); });
}

template <class T>
void activation(T* x, int64_t n, Activation act) {
  activation(static_cast<const T*>(x), n, act, x);
}

template <class T>
void gated_activation(const T* gate, const T* up, int64_t rows, int64_t F, int64_t ld, Activation act, T* out) {
  require_nonnegative(rows, "gated_activation: rows");
  require_nonnegative(F, "gated_activation: features");
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(F, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::gated_row(gate + r * ld, up + r * ld, F, act, out + r * F);
  });
}

#define TC_INSTANTIATE(T)                                       \
  template void activation<T>(T*, int64_t, Activation);         \
  template void activation<T>(const T*, int64_t, Activation, T*); \
  template void gated_activation<T>(const T*, const T*, int64_t, int64_t, int64_t, Activation, T*);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
