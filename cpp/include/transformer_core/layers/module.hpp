// Module: a layer that owns its weights and names them as torch's state_dict does.
//
// Each parameter lives in an xt::xtensor owned by the layer; the module keeps a registry of
// (name, shape, pointer) so that the bindings can read and write weights by their torch names
// without knowing the layer. Modules are neither copied nor moved once built, so the pointers in the
// registry stay valid for the module's life.
//
// Quantized weights (layers/quantized_matrix.hpp): a layer may hold a weight in a quantized format
// instead of its xtensor (Linear: int8 or GGUF blocks; Embedding: GGUF blocks). Each registry entry
// remembers the layer that owns the storage (`owner`, its own name there and the first row of a
// slice), so that the weight can still be read by name, dequantized (read_parameter), and so that
// the layers of a model can be found from its registry (layers/quantization.hpp). The `data` of a
// quantized weight is nullptr in the owner's registry and in the registry of the module that was
// refreshed after quantizing (refresh_parameters); check quantized(p) before using `data`.
#pragma once

#include <algorithm>
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
class Module;

template <class T>
struct ParamRef {
  std::string name;            // torch / Hugging Face name, e.g. "self_attn.in_proj_weight"
  std::vector<int64_t> shape;  // e.g. {3 * E, E}
  T* data;                     // C-contiguous storage inside the owning module (nullptr: quantized)
  Module<T>* owner = nullptr;  // the module that registered the storage (register_parameter)
  std::string owner_name;      // the parameter's name there
  int64_t row0 = 0;            // first row (first element of a 1-D parameter) of the owner's parameter
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

// While set (on this thread), allocate_weight() leaves a layer's weight matrix uninitialised instead
// of zero-filling it: for loaders that overwrite or replace every weight of the modules they build
// (a model about to receive GGUF blocks never touches, so never makes resident, the fp32 matrices
// those replace). Set through DeferWeightInit.
inline bool& weight_init_deferred() {
  thread_local bool deferred = false;
  return deferred;
}

// RAII: defers (or not) the zero-filling of weights built on this thread while it lives.
class DeferWeightInit {
 public:
  explicit DeferWeightInit(bool on = true) : old_(weight_init_deferred()) { weight_init_deferred() = on; }
  ~DeferWeightInit() { weight_init_deferred() = old_; }
  DeferWeightInit(const DeferWeightInit&) = delete;
  DeferWeightInit& operator=(const DeferWeightInit&) = delete;

 private:
  bool old_;
};

// A layer's weight matrix: allocate()'s checks, zero-filled unless weight_init_deferred().
template <class T, size_t N>
xt::xtensor<T, N> allocate_weight(const std::array<int64_t, N>& shape, const std::string& name) {
  if (!weight_init_deferred()) return allocate<T, N>(shape, name);
  int64_t count = 1;
  for (int64_t d : shape) {
    ops::require_positive(d, name);
    count = ops::checked_product({count, d}, name);
  }
  ops::require_allocatable(count, static_cast<int64_t>(sizeof(T)), name);
  std::array<size_t, N> s;
  for (size_t i = 0; i < N; ++i) s[i] = static_cast<size_t>(shape[i]);
  return xt::xtensor<T, N>::from_shape(s);  // uninitialised
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

  // Whether this module's OWN parameter `name` (one it registered with register_parameter) is held
  // in a quantized format; its registry data is then nullptr. Overridden by Linear and Embedding.
  virtual bool quantized(const std::string& name) const {
    (void)name;
    return false;
  }
  // The storage of rows [row0, row0 + rows) of this module's own parameter `name` (rows < 0: to
  // the end): "float32" / "float64", or the quantized format ("int8", "Q4_1"; "Q8_0+Q4_1" for rows
  // held in several formats).
  virtual std::string storage(const std::string& name, int64_t row0 = 0, int64_t rows = -1) const {
    (void)name, (void)row0, (void)rows;
    return sizeof(T) == 4 ? "float32" : "float64";
  }
  // Rows [row0, row0 + rows) of this module's own quantized parameter `name`, dequantized into out
  // (row-major). Called only when quantized(name).
  virtual void dequantize_rows(const std::string& name, int64_t row0, int64_t rows, T* out) const {
    (void)row0, (void)rows, (void)out;
    throw std::invalid_argument("name: parameter '" + name + "' is not quantized");
  }

  // Whether the weight an entry of this registry names is held quantized by its owner.
  static bool quantized(const ParamRef<T>& p) { return p.owner != nullptr && p.owner->quantized(p.owner_name); }
  // The storage an entry names ("float32", "int8", "Q4_1", ...).
  static std::string storage(const ParamRef<T>& p) {
    if (p.owner == nullptr) return sizeof(T) == 4 ? "float32" : "float64";
    return p.owner->storage(p.owner_name, p.row0, p.shape.empty() ? 1 : p.shape[0]);
  }
  // Copies the values of an entry into out (p.shape, row-major), dequantized if the owner holds the
  // weight quantized.
  static void read_parameter(const ParamRef<T>& p, T* out) {
    if (quantized(p)) {
      p.owner->dequantize_rows(p.owner_name, p.row0, p.shape.empty() ? 1 : p.shape[0], out);
      return;
    }
    int64_t count = 1;
    for (int64_t d : p.shape) count *= d;
    std::copy(p.data, p.data + count, out);
  }

  // Re-reads every entry's data pointer from its owner's own registry (nullptr for a weight the
  // owner now holds quantized): call on the module whose registry is used after quantizing layers
  // inside it (layers/quantization.hpp does).
  void refresh_parameters() {
    for (auto& p : params_) {
      if (p.owner == nullptr || p.owner == this) continue;
      const ParamRef<T>& own = p.owner->parameter(p.owner_name);
      int64_t row_size = 1;
      for (size_t i = 1; i < own.shape.size(); ++i) row_size *= own.shape[i];
      p.data = own.data == nullptr ? nullptr : own.data + p.row0 * row_size;
    }
  }

 protected:
  void register_parameter(std::string name, std::vector<int64_t> shape, T* data) {
    std::string own = name;
    params_.push_back({std::move(name), std::move(shape), data, this, std::move(own), 0});
  }
  // Sets the data pointer of this module's own parameter `name` (nullptr once it is quantized).
  void set_parameter_data(const std::string& name, T* data) {
    for (auto& p : params_)
      if (p.owner == this && p.owner_name == name) p.data = data;
  }
  // Adds every parameter of `child` under "prefix.name" (or under its own name if prefix is empty).
  void register_module(const std::string& prefix, const Module& child) {
    for (const auto& p : child.parameters())
      params_.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.shape, p.data, p.owner, p.owner_name,
                         p.row0});
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
    params_.push_back({std::move(name), std::move(shape), p.data == nullptr ? nullptr : p.data + row0 * row_size,
                       p.owner, p.owner_name, p.row0 + row0});
  }
  // Registers a child's parameter under another name (Hugging Face's name for torch's, say).
  void register_alias(std::string name, const Module& child, const std::string& child_name) {
    const ParamRef<T>& p = child.parameter(child_name);
    params_.push_back({std::move(name), p.shape, p.data, p.owner, p.owner_name, p.row0});
  }

 private:
  std::vector<ParamRef<T>> params_;
};

}  // namespace transformer_core::layers
