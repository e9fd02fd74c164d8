// Packed weights kept for the length of one scope on one thread: a sentence encoder's encode()
// runs the same weights over batch after batch, and linear_packed (linear.hpp) packed each of them
// into panels again for every batch (5 % of a MiniLM encode on a Zen 5 EPYC).
//
// Inside a PackedWeightScope, the first product of a weight packs it into the scope's cache; the
// later products of the same weight (same address and shape) by the same kernels (the kernel table
// that packed the panels: set_isa from another thread meanwhile switches to kernels whose panels
// are laid out otherwise, which pack their own) on that thread use those panels. The
// panels are the same floats the product would pack, so results do not change by a bit. The cache
// is dropped when the scope ends: a weight written between two scopes is packed again. Inside a
// scope the weights must not change (encode() reads them while it runs; so would any forward), and
// every weight multiplied must live through the scope: the key is the address, so a temporary
// weight freed and another allocated at its place would meet the old panels. Only a model's own
// weights qualify; the scope is private to the package (SentenceEncoder.encode).
// Weights beyond kPackedCacheFloats in all are packed per product as outside a scope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::kernels {

constexpr size_t kPackedCacheFloats = size_t(1) << 26;  // 256 MiB of fp32 panels

class PackedWeightCache {
 public:
  // The panels of weight w [n, k] packed earlier in this scope by the kernel table `packer`, or
  // nullptr. (w: fp32, or another format's weight, e.g. int8 in ops/quantized_linear.cpp; its
  // panels then sit in the floats' bytes.)
  float* find(const void* w, int64_t n, int64_t k, const void* packer) {
    const auto it = panels_.find({w, n, k, packer});
    return it == panels_.end() ? nullptr : it->second.data();
  }
  // A buffer of `floats` for the panels of w [n, k] by `packer`, to pack into; nullptr when over
  // the budget.
  float* allot(const void* w, int64_t n, int64_t k, const void* packer, size_t floats) {
    if (held_ + floats > kPackedCacheFloats) return nullptr;
    held_ += floats;
    AlignedVector<float>& panels = panels_[{w, n, k, packer}];
    panels.resize(floats);
    return panels.data();
  }

 private:
  std::map<std::tuple<const void*, int64_t, int64_t, const void*>, AlignedVector<float>> panels_;
  size_t held_ = 0;
};

// The calling thread's innermost scope's cache, or nullptr outside any scope.
inline PackedWeightCache*& current_packed_weights() {
  thread_local PackedWeightCache* current = nullptr;
  return current;
}

// RAII: a cache for the calling thread while it lives (scopes nest; the inner one is used).
class PackedWeightScope {
 public:
  PackedWeightScope() : outer_(current_packed_weights()) { current_packed_weights() = &cache_; }
  ~PackedWeightScope() { current_packed_weights() = outer_; }
  PackedWeightScope(const PackedWeightScope&) = delete;
  PackedWeightScope& operator=(const PackedWeightScope&) = delete;

 private:
  PackedWeightCache cache_;
  PackedWeightCache* outer_;
};

}  // namespace transformer_core::kernels
