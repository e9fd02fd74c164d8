// GPT-2 (Radford et al. 2019), decoder-only; seed 000 "BERT vs GPT" and "KV cache".
//
//   h      = wte[input_ids] + wpe[past .. past + L)
//   block: h = h + c_proj(Attention_causal(c_attn(ln_1(h))))          (pre-LN)
//          h = h + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(h))))
//   hidden = ln_f(h);   logits = hidden · wteᵀ                          (LM head tied to wte)
//
// Hugging Face's layout: Conv1D weights are stored [in, out] (y = x W + b, the transpose of
// nn.Linear), c_attn packs q, k, v as [E, 3E].
//
// KV cache (KVCache below): per layer, keys and values [N, H_kv, capacity, D]; `length` positions
// are filled. A step with L new tokens appends L positions; when full, the capacity doubles (at
// least to what is needed) and the contents are copied once. Memory per layer and position:
// 2 · N · H_kv · D values, so grouped-query attention (H_kv < H) shrinks it by H / H_kv.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/transformer_layers.hpp"

namespace transformer_core::models {

using kernels::Activation;

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0 = 4 · n_embd
  Activation activation = Activation::kGeluTanh;
  double layer_norm_epsilon = 1e-5;
};

template <class T>
class KVCache {
 public:
  KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t head_dim, int64_t capacity = 0);

  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch() const { return batch_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

  // Makes room for `total` positions (capacity doubles, at least to `total`), keeping the contents.
  void reserve(int64_t total);
  void set_length(int64_t length) { length_ = length; }

  // [N, H_kv, capacity, D] of one layer.
  T* keys(int64_t layer) { return keys_[static_cast<size_t>(layer)].data(); }
  T* values(int64_t layer) { return values_[static_cast<size_t>(layer)].data(); }
  const T* keys(int64_t layer) const { return keys_[static_cast<size_t>(layer)].data(); }
  const T* values(int64_t layer) const { return values_[static_cast<size_t>(layer)].data(); }

 private:
  int64_t batch_, num_kv_heads_, head_dim_, capacity_ = 0, length_ = 0;
  std::vector<xt::xtensor<T, 4>> keys_, values_;
};

template <class T>
class GPT2Block : public layers::Module<T> {
 public:
  GPT2Block(const GPT2Config& c);

  // h [N, L, E] updated in place. The cache's layer `layer` gets the L new keys/values at positions
  // [past, past + L), past = cache.length() (the caller advances the length after all layers).
  // key_mask: [N, past + L] (1 = real token) or nullptr.
  void forward(T* h, int64_t N, int64_t L, KVCache<T>& cache, int64_t layer, const uint8_t* key_mask) const;

 private:
  int64_t E_, H_, D_, F_;
  Activation act_;
  layers::LayerNorm<T> ln_1_, ln_2_;
  xt::xtensor<T, 2> c_attn_w_, attn_proj_w_, c_fc_w_, mlp_proj_w_;  // [in, out]
  xt::xtensor<T, 1> c_attn_b_, attn_proj_b_, c_fc_b_, mlp_proj_b_;
};

template <class T>
class GPT2Model : public layers::Module<T> {
 public:
  explicit GPT2Model(const GPT2Config& c);

  // input_ids [N, L] int64; attention_mask [N, past + L] (1 = real) or nullptr; the cache holds
  // `past` positions and gains L. hidden [N, L, E] (after ln_f).
  // Throws std::invalid_argument for ids outside the vocabulary or past + L > n_positions.
  void forward(const int64_t* input_ids, int64_t N, int64_t L, const uint8_t* attention_mask, KVCache<T>& cache,
               T* hidden) const;

  // logits [rows, vocab] = hidden [rows, E] · wteᵀ (the LM head, tied to the token embedding).
  void lm_head(const T* hidden, int64_t rows, T* logits) const;

  const GPT2Config& config() const { return config_; }

 private:
  GPT2Config config_;
  xt::xtensor<T, 2> wte_, wpe_;
  std::vector<std::unique_ptr<GPT2Block<T>>> blocks_;
  layers::LayerNorm<T> ln_f_;
};

}  // namespace transformer_core::models
