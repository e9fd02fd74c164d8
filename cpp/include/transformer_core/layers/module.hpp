// Module: a layer that owns its weights and names them as torch's state_dict does.
//
// Each parameter lives in an xt::xtensor owned by the layer; the module keeps a registry of
// (name, shape, pointer) so that the bindings can read and write weights by their torch names
// without knowing the layer. Modules are neither copied nor moved once built, so the pointers in the
// registry stay valid for the module's life.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

template <class T>
struct ParamRef {
  std::string name;            // torch / Hugging Face name, e.g. "self_attn.in_proj_weight"
  std::vector<int64_t> shape;  // e.g. {3 * E, E}
  T* data;                     // C-contiguous storage inside the owning module
};

// A zero-filled tensor of `shape`, after checking that the sizes are >= 1, that their product does
// not overflow and that it fits in this machine's memory (std::invalid_argument naming `name`).
template <class T, size_t N>
xt::xtensor<T, N> allocate(const std::array<int64_t, N>& shape, const std::string& name) {
  int64_t count = 1;
  for (int64_t d : shape) {
    ops::require_positive(d, name);
    count = ops::checked_product({count, d}, name);
  }
  ops::require_allocatable(count, static_cast<int64_t>(sizeof(T)), name);
  std::array<size_t, N> s;
  for (size_t i = 0; i < N; ++i) s[i] = static_cast<size_t>(shape[i]);
  return xt::xtensor<T, N>(s, T(0));
}

template <class T>
class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  const std::vector<ParamRef<T>>& parameters() const { return params_; }

  const ParamRef<T>& parameter(const std::string& name) const {
    for (const auto& p : params_)
      if (p.name == name) return p;
    throw std::invalid_argument("name: no parameter named '" + name + "'");
  }

 protected:
  void register_parameter(std::string name, std::vector<int64_t> shape, T* data) {
    params_.push_back({std::move(name), std::move(shape), data});
  }
  // Adds every parameter of `child` under "prefix.name" (or under its own name if prefix is empty).
  void register_module(const std::string& prefix, const Module& child) {
    for (const auto& p : child.parameters())
      params_.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.shape, p.data});
  }
  // Registers rows [row0, row0 + rows) of a child's 2-D (or 1-D) parameter under a new name: how a
  // packed weight [q; k; v] shows up as Hugging Face's separate query/key/value weights.
  void register_slice(std::string name, const Module& child, const std::string& child_name, int64_t row0,
                      int64_t rows) {
    const ParamRef<T>& p = child.parameter(child_name);
    int64_t row_size = 1;
    for (size_t i = 1; i < p.shape.size(); ++i) row_size *= p.shape[i];
    std::vector<int64_t> shape = p.shape;
    shape[0] = rows;
    params_.push_back({std::move(name), std::move(shape), p.data + row0 * row_size});
  }
  // Registers a child's parameter under another name (Hugging Face's name for torch's, say).
  void register_alias(std::string name, const Module& child, const std::string& child_name) {
    const ParamRef<T>& p = child.parameter(child_name);
    params_.push_back({std::move(name), p.shape, p.data});
  }

 private:
  std::vector<ParamRef<T>> params_;
};

}  // namespace transformer_core::layers
