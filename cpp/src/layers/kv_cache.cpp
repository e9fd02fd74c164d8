#include "transformer_core/layers/kv_cache.hpp"

#include <algorithm>
#include <stdexcept>

#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

template <class T>
KVCache<T>::KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t head_dim, int64_t capacity)
    : batch_(batch), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  ops::require_nonnegative(num_layers, "num_layers");
  ops::require_positive(batch, "batch");
  ops::require_positive(num_kv_heads, "num_kv_heads");
  ops::require_positive(head_dim, "head_dim");
  ops::require_positive(capacity, "capacity");
  // every layer's keys and values, checked before the per-layer storage (a vector of num_layers) exists
  ops::require_weights({{2, std::max<int64_t>(num_layers, 1), batch, num_kv_heads, capacity, head_dim}}, sizeof(T),
                       "num_layers, batch, num_kv_heads, head_dim, capacity");
  keys_.resize(static_cast<size_t>(num_layers));
  values_.resize(static_cast<size_t>(num_layers));
  reserve(capacity);
}

template <class T>
void KVCache<T>::reserve(int64_t total) {
  if (total <= capacity_) return;
  const int64_t new_cap = std::max(total, 2 * capacity_);
  // keys and values of every layer: 2 · layers · N · H_kv · new_cap · D values
  ops::require_weights({{2, std::max<int64_t>(num_layers(), 1), batch_, num_kv_heads_, new_cap, head_dim_}}, sizeof(T),
                       "total (the KVCache capacity asked for)");
  auto grow = [&](Storage& old) {
    Storage fresh = Storage::from_shape(
        checked_shape<T, 4>({batch_, num_kv_heads_, new_cap, head_dim_}, "total (the KVCache capacity asked for)"));
    // Every (n, h) block's written part, [:written_], into the fresh zeros: what follows is zeros
    // in both, and copying it would only make its pages resident. Not only [:length]: in the middle
    // of a step (layers called in order, the length advanced by the last one) the earlier layers
    // already hold the step's positions past the length, and a reserve between two layers must
    // keep them.
    for (int64_t nh = 0; nh < batch_ * num_kv_heads_; ++nh)
      std::copy(old.data() + nh * capacity_ * head_dim_, old.data() + (nh * capacity_ + written_) * head_dim_,
                fresh.data() + nh * new_cap * head_dim_);
    old = std::move(fresh);
  };
  for (auto& k : keys_) grow(k);
  for (auto& v : values_) grow(v);
  capacity_ = new_cap;
}

template <class T>
void KVCache<T>::crop(int64_t length) {
  if (length < 0 || length > length_)
    throw std::invalid_argument("length: expected 0 <= length <= " + std::to_string(length_) + " (the cache length), got " +
                                std::to_string(length));
  length_ = length;
}

template <class T>
void KVCache<T>::set_length(int64_t length) {
  if (length < 0 || length > capacity_)
    throw std::invalid_argument("length: expected 0 <= length <= " + std::to_string(capacity_) + " (the capacity), got " +
                                std::to_string(length));
  length_ = length;
  written_ = std::max(written_, length);
}

template <class T>
void KVCache<T>::append(int64_t layer, const T* k_src, const T* v_src, int64_t ld, int64_t L) {
  const int64_t D = head_dim_, cap = capacity_, past = length_;
  T* kc = keys(layer);
  T* vc = values(layer);
  for (int64_t n = 0; n < batch_; ++n)
    for (int64_t h = 0; h < num_kv_heads_; ++h)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t src = (n * L + l) * ld + h * D;
        const int64_t dst = ((n * num_kv_heads_ + h) * cap + past + l) * D;
        std::copy(k_src + src, k_src + src + D, kc + dst);
        std::copy(v_src + src, v_src + src + D, vc + dst);
      }
  written_ = std::max(written_, past + L);
}

template class KVCache<float>;
template class KVCache<double>;

}  // namespace transformer_core::layers
