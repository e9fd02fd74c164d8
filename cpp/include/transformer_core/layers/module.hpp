// Module: a layer that owns its weights and names them as torch's state_dict does.
//
// Each parameter lives in an xt::xtensor owned by the layer; the module keeps a registry of
// (name, shape, pointer) so that the bindings can read and write weights by their torch names
// without knowing the layer. Modules are neither copied nor moved once built, so the pointers in the
// registry stay valid for the module's life.
//
// Training (llm.c's layout: one explicit forward and backward per layer). Each parameter's gradient
// lives beside it: a buffer of the module that registered the parameter (a GradSlot), allocated and
// zeroed on first use, shared by every name the parameter is registered under (aliases, slices, the
// names of a parent). A backward ADDS into the gradients (accumulation over micro-batches, a weight
// used twice) until zero_grad(). A layer's training forward (forward_train) keeps what its backward
// needs; it keeps POINTERS to its inputs, which the caller keeps alive and unchanged until the
// backward (a parent layer keeps them in its own saved activations; the Python face keeps the arrays).
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
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

// Every file that holds a layer sees xtensor with the cache-line-aligned allocator (aligned_xtensor.hpp,
// which CMakeLists.txt includes first): one xt::xtensor type everywhere, weights on 64-byte boundaries.
static_assert(std::is_same_v<xt::xtensor<float, 1>::storage_type::allocator_type, xsimd::aligned_allocator<float, 64>>,
              "compile with -include transformer_core/aligned_xtensor.hpp (see CMakeLists.txt)");

// The gradient of one parameter, owned by the module that registered it (register_parameter).
template <class T>
struct GradSlot {
  int64_t size = 0;        // elements of the whole parameter
  std::vector<T> buffer;   // empty until first used; then `size` values
  bool written = false;    // a backward added into it since the last zero_grad()
};

template <class T>
class Module;

template <class T>
struct ParamRef {
  std::string name;            // torch / Hugging Face name, e.g. "self_attn.in_proj_weight"
  std::vector<int64_t> shape;  // e.g. {3 * E, E}
  T* data;                     // C-contiguous storage inside the owning module (nullptr: quantized)
  GradSlot<T>* grad = nullptr; // the owner's gradient slot of this parameter
  int64_t grad_offset = 0;     // this name's first element in it (a slice starts further in)
  Module<T>* owner = nullptr;  // the module that registered the storage (register_parameter)
  std::string owner_name;      // the parameter's name there
  int64_t row0 = 0;            // first row (first element of a 1-D parameter) of the owner's parameter
};

// The dropout of one training forward (Srivastava et al. 2014; ops::dropout, a counter-based mask):
// each dropout site of a call derives its own seed from `seed`, so a forward and its backward see
// the same masks and a seed gives the same masks on any machine and thread count.
struct Dropout {
  double p = 0;        // residual-branch dropout (torch's dropout1/2/3; HF's hidden/resid_pdrop)
  double ffn_p = 0;    // between a feed-forward's two linears (torch's TransformerEncoderLayer.dropout)
  double embed_p = 0;  // on a model's embeddings (HF's embd_pdrop; BERT: hidden_dropout_prob)
  uint64_t seed = 0;
  double attn_p = 0;   // on the attention probabilities (torch's MultiheadAttention(dropout=); HF's
                       // attention_probs_dropout_prob, attn_pdrop, attention_dropout)

  // The seed of site k (splitmix64 of seed and k).
  uint64_t site(uint64_t k) const {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (k + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // The dropout of child i of a stack (layer i): its own seeds.
  Dropout child(uint64_t i) const { return {p, ffn_p, embed_p, site(1000003ull + i), attn_p}; }
};

// `shape` as xtensor's sizes, after checking that they are >= 1, that their product does not
// overflow and that a tensor of T that size fits in this machine's memory (std::invalid_argument
// naming `name`): the checks before every allocation of a layer.
template <class T, size_t N>
std::array<size_t, N> checked_shape(const std::array<int64_t, N>& shape, const std::string& name) {
  int64_t count = 1;
  for (int64_t d : shape) {
    ops::require_positive(d, name);
    count = ops::checked_product({count, d}, name);
  }
  ops::require_allocatable(count, static_cast<int64_t>(sizeof(T)), name);
  std::array<size_t, N> s;
  for (size_t i = 0; i < N; ++i) s[i] = static_cast<size_t>(shape[i]);
  return s;
}

// A zero-filled tensor of `shape` (checked_shape's checks).
template <class T, size_t N>
xt::xtensor<T, N> allocate(const std::array<int64_t, N>& shape, const std::string& name) {
  return xt::xtensor<T, N>(checked_shape<T, N>(shape, name), T(0));
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
  return xt::xtensor<T, N>::from_shape(checked_shape<T, N>(shape, name));  // uninitialised
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

  // ---- training: gradients and saved activations ------------------------------------------------
  // The gradient of `name` (same shape as the parameter), allocated and zeroed on first use. It does
  // not mark the gradient written.
  T* gradient(const std::string& name) {
    const ParamRef<T>& p = parameter(name);
    if (p.grad->buffer.empty()) p.grad->buffer.assign(static_cast<size_t>(p.grad->size), T(0));
    return p.grad->buffer.data() + p.grad_offset;
  }
  // gradient(name), marked written: a backward adds into what it returns.
  T* accumulate_gradient(const std::string& name) {
    T* g = gradient(name);
    parameter(name).grad->written = true;
    return g;
  }
  // Whether a backward added into the gradient of `name` since the last zero_grad().
  bool gradient_written(const std::string& name) const { return parameter(name).grad->written; }
  // Marks the gradient of `name` written or not (a model that staged it, see DecoderModel).
  void set_gradient_written(const std::string& name, bool written) { parameter(name).grad->written = written; }
  // The whole gradient buffer `name` lives in to zero, unwritten: every parameter sharing it (the
  // row slices of one stored matrix, e.g. q_proj, k_proj and v_proj of a fused QKV weight) too, as
  // they share its `written` flag. Nothing is allocated.
  void clear_gradient(const std::string& name) {
    GradSlot<T>* g = parameter(name).grad;
    std::fill(g->buffer.begin(), g->buffer.end(), T(0));
    g->written = false;
  }
  // Every gradient to zero, none written (the buffers stay allocated).
  void zero_grad() {
    for (const auto& p : params_) {
      std::fill(p.grad->buffer.begin(), p.grad->buffer.end(), T(0));
      p.grad->written = false;
    }
  }
  // Frees what the last training forward kept for its backward (eval mode keeps nothing).
  virtual void release_activations() {}

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

  // Numpy views of an entry's storage (the bindings' parameter_view): one is handed out (view_opened)
  // and, when Python frees it, given back (view_closed). Storage a quantized format replaces while
  // views of it live is kept (retire_storage) until the last of them is given back, so no view
  // ever reads freed memory, and no buffer outlives its views. Called with the GIL held; the mutex
  // guards against retire_storage running in a call that released it.
  static void view_opened(const ParamRef<T>& p) {
    if (p.owner == nullptr) return;
    std::lock_guard<std::mutex> lock(p.owner->views_mutex_);
    ++p.owner->live_views_[p.owner_name];
  }
  static void view_closed(Module* owner, const std::string& owner_name) {
    std::lock_guard<std::mutex> lock(owner->views_mutex_);
    if (--owner->live_views_[owner_name] == 0) owner->retired_.erase(owner_name);  // frees a retired buffer
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
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    own_grads_.emplace_back();
    own_grads_.back().size = size;
    std::string own = name;
    params_.push_back({std::move(name), std::move(shape), data, &own_grads_.back(), 0, this, std::move(own), 0});
  }
  // Drops the storage of this module's own parameter `name` once a quantized format replaces it:
  // freed now, or, while numpy views of it live (view_opened), when the last of them is closed (the
  // views read the last float values meanwhile; they no longer change the model).
  void retire_storage(const std::string& name, xt::xtensor<T, 2>& storage) {
    std::lock_guard<std::mutex> lock(views_mutex_);
    const auto live = live_views_.find(name);
    if (live != live_views_.end() && live->second > 0) retired_[name] = std::move(storage);
    storage = xt::xtensor<T, 2>();
  }
  // Sets the data pointer of this module's own parameter `name` (nullptr once it is quantized).
  void set_parameter_data(const std::string& name, T* data) {
    for (auto& p : params_)
      if (p.owner == this && p.owner_name == name) p.data = data;
  }
  // Adds every parameter of `child` under "prefix.name" (or under its own name if prefix is empty).
  void register_module(const std::string& prefix, const Module& child) {
    for (const auto& p : child.parameters())
      params_.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.shape, p.data, p.grad, p.grad_offset,
                         p.owner, p.owner_name, p.row0});
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
                       p.grad, p.grad_offset + row0 * row_size, p.owner, p.owner_name, p.row0 + row0});
  }
  // Registers a child's parameter under another name (Hugging Face's name for torch's, say).
  void register_alias(std::string name, const Module& child, const std::string& child_name) {
    const ParamRef<T>& p = child.parameter(child_name);
    params_.push_back({std::move(name), p.shape, p.data, p.grad, p.grad_offset, p.owner, p.owner_name, p.row0});
  }

 private:
  std::vector<ParamRef<T>> params_;
  std::deque<GradSlot<T>> own_grads_;  // the gradients of the parameters registered here (stable addresses)
  std::mutex views_mutex_;
  std::map<std::string, int64_t> live_views_;            // numpy views alive, per own parameter
  std::map<std::string, xt::xtensor<T, 2>> retired_;     // replaced storage that views still read
};

}  // namespace transformer_core::layers
