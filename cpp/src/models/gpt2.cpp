#include "transformer_core/models/gpt2.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/attention.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::models {

namespace {
std::string str(int64_t v) { return std::to_string(v); }

// y[rows, out] = x[rows, in] · w[in, out] + b[out]     (Hugging Face's Conv1D)
template <class T>
void conv1d(const T* x, int64_t rows, int64_t in, const T* w, const T* b, int64_t out, T* y) {
  kernels::linear(x, rows, in, w, b, out, y, /*w_in_out=*/true);
}
}  // namespace

template <class T>
KVCache<T>::KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t head_dim, int64_t capacity)
    : batch_(batch), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  if (num_layers < 0 || batch < 1 || num_kv_heads < 1 || head_dim < 1)
    throw std::invalid_argument("KVCache: invalid sizes");
  keys_.resize(static_cast<size_t>(num_layers));
  values_.resize(static_cast<size_t>(num_layers));
  reserve(std::max<int64_t>(capacity, 1));
}

template <class T>
void KVCache<T>::reserve(int64_t total) {
  if (total <= capacity_) return;
  const int64_t new_cap = std::max(total, 2 * capacity_);
  const std::array<size_t, 4> shape = {static_cast<size_t>(batch_), static_cast<size_t>(num_kv_heads_),
                                       static_cast<size_t>(new_cap), static_cast<size_t>(head_dim_)};
  auto grow = [&](xt::xtensor<T, 4>& old) {
    xt::xtensor<T, 4> fresh(shape);
    // copy the filled [.., :length, :] block of every (n, h)
    for (int64_t nh = 0; nh < batch_ * num_kv_heads_; ++nh)
      std::copy(old.data() + nh * capacity_ * head_dim_, old.data() + nh * capacity_ * head_dim_ + length_ * head_dim_,
                fresh.data() + nh * new_cap * head_dim_);
    old = std::move(fresh);
  };
  for (auto& k : keys_) grow(k);
  for (auto& v : values_) grow(v);
  capacity_ = new_cap;
}

template <class T>
GPT2Block<T>::GPT2Block(const GPT2Config& c)
    : E_(c.n_embd),
      H_(c.n_head),
      D_(c.n_embd / c.n_head),
      F_(c.n_inner > 0 ? c.n_inner : 4 * c.n_embd),
      act_(c.activation),
      ln_1_(c.n_embd, static_cast<T>(c.layer_norm_epsilon)),
      ln_2_(c.n_embd, static_cast<T>(c.layer_norm_epsilon)) {
  const size_t E = static_cast<size_t>(E_), F = static_cast<size_t>(F_);
  c_attn_w_ = xt::zeros<T>({E, 3 * E});
  c_attn_b_ = xt::zeros<T>({3 * E});
  attn_proj_w_ = xt::zeros<T>({E, E});
  attn_proj_b_ = xt::zeros<T>({E});
  c_fc_w_ = xt::zeros<T>({E, F});
  c_fc_b_ = xt::zeros<T>({F});
  mlp_proj_w_ = xt::zeros<T>({F, E});
  mlp_proj_b_ = xt::zeros<T>({E});
  this->register_module("ln_1", ln_1_);
  this->register_parameter("attn.c_attn.weight", {E_, 3 * E_}, c_attn_w_.data());
  this->register_parameter("attn.c_attn.bias", {3 * E_}, c_attn_b_.data());
  this->register_parameter("attn.c_proj.weight", {E_, E_}, attn_proj_w_.data());
  this->register_parameter("attn.c_proj.bias", {E_}, attn_proj_b_.data());
  this->register_module("ln_2", ln_2_);
  this->register_parameter("mlp.c_fc.weight", {E_, F_}, c_fc_w_.data());
  this->register_parameter("mlp.c_fc.bias", {F_}, c_fc_b_.data());
  this->register_parameter("mlp.c_proj.weight", {F_, E_}, mlp_proj_w_.data());
  this->register_parameter("mlp.c_proj.bias", {E_}, mlp_proj_b_.data());
}

template <class T>
void GPT2Block<T>::forward(T* h, int64_t N, int64_t L, KVCache<T>& cache, int64_t layer,
                           const uint8_t* key_mask) const {
  const int64_t rows = N * L, E = E_, D = D_, past = cache.length(), S = past + L, cap = cache.capacity();
  std::vector<T> a(static_cast<size_t>(rows * E)), qkv(static_cast<size_t>(rows * 3 * E));
  // qkv [N·L, 3E] = ln_1(h) · c_attn
  ln_1_.forward(h, rows, a.data());
  conv1d(a.data(), rows, E, c_attn_w_.data(), c_attn_b_.data(), 3 * E, qkv.data());
  // Append the new keys/values to the cache: k, v [N, H, past + l, D] = qkv[n, l, E + h·D ...]
  T* kc = cache.keys(layer);
  T* vc = cache.values(layer);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t hh = 0; hh < H_; ++hh)
      for (int64_t l = 0; l < L; ++l) {
        const T* src = qkv.data() + (n * L + l) * 3 * E + hh * D;
        T* kdst = kc + ((n * H_ + hh) * cap + past + l) * D;
        T* vdst = vc + ((n * H_ + hh) * cap + past + l) * D;
        std::copy(src + E, src + E + D, kdst);
        std::copy(src + 2 * E, src + 2 * E + D, vdst);
      }
  // context [N, L, H·D] = softmax(q kᵀ / √D + causal (bottom-right) + key mask) v
  kernels::AttentionArgs<T> args;
  args.q = qkv.data();
  args.q_stride_n = L * 3 * E, args.q_stride_h = D, args.q_stride_l = 3 * E;
  args.k = kc;
  args.k_stride_n = H_ * cap * D, args.k_stride_h = cap * D, args.k_stride_s = D;
  args.v = vc;
  args.v_stride_n = H_ * cap * D, args.v_stride_h = cap * D, args.v_stride_s = D;
  args.out = a.data();
  args.o_stride_n = L * E, args.o_stride_h = D, args.o_stride_l = E;
  args.batch = N, args.num_heads = H_, args.num_kv_heads = H_, args.q_len = L, args.kv_len = S;
  args.head_dim = D, args.v_head_dim = D;
  args.scale = T(1) / std::sqrt(static_cast<T>(D));
  args.is_causal = true;
  args.causal_offset = past;
  if (key_mask != nullptr) {
    args.key_mask = key_mask;
    args.key_mask_stride_n = S;
    args.key_mask_stride_s = 1;
  }
  ops::scaled_dot_product_attention(args);
  // h = h + context · c_proj
  conv1d(a.data(), rows, E, attn_proj_w_.data(), attn_proj_b_.data(), E, qkv.data());
  for (int64_t i = 0; i < rows * E; ++i) h[i] += qkv[i];
  // h = h + mlp.c_proj(act(mlp.c_fc(ln_2(h))))
  ln_2_.forward(h, rows, a.data());
  std::vector<T> f(static_cast<size_t>(rows * F_));
  kernels::linear(a.data(), rows, E, c_fc_w_.data(), c_fc_b_.data(), F_, f.data(), /*w_in_out=*/true, act_);
  conv1d(f.data(), rows, F_, mlp_proj_w_.data(), mlp_proj_b_.data(), E, a.data());
  for (int64_t i = 0; i < rows * E; ++i) h[i] += a[i];
}

template <class T>
GPT2Model<T>::GPT2Model(const GPT2Config& c) : config_(c), ln_f_(c.n_embd, static_cast<T>(c.layer_norm_epsilon)) {
  if (c.n_embd < 1 || c.n_head < 1 || c.n_embd % c.n_head != 0)
    throw std::invalid_argument("n_embd (" + str(c.n_embd) + ") must be a positive multiple of n_head (" +
                                str(c.n_head) + ")");
  if (c.vocab_size < 1 || c.n_positions < 1 || c.n_layer < 0)
    throw std::invalid_argument("GPT2Config: vocab_size and n_positions must be >= 1, n_layer >= 0");
  wte_ = xt::zeros<T>({static_cast<size_t>(c.vocab_size), static_cast<size_t>(c.n_embd)});
  wpe_ = xt::zeros<T>({static_cast<size_t>(c.n_positions), static_cast<size_t>(c.n_embd)});
  this->register_parameter("wte.weight", {c.vocab_size, c.n_embd}, wte_.data());
  this->register_parameter("wpe.weight", {c.n_positions, c.n_embd}, wpe_.data());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(std::make_unique<GPT2Block<T>>(c));
    this->register_module("h." + str(i), *blocks_.back());
  }
  this->register_module("ln_f", ln_f_);
}

template <class T>
void GPT2Model<T>::forward(const int64_t* ids, int64_t N, int64_t L, const uint8_t* attention_mask,
                           KVCache<T>& cache, T* hidden) const {
  const int64_t E = config_.n_embd, past = cache.length();
  if (past + L > config_.n_positions)
    throw std::invalid_argument("input_ids: past length " + str(past) + " + new length " + str(L) +
                                " exceeds n_positions (" + str(config_.n_positions) + ")");
  if (cache.batch() != N || cache.num_layers() != config_.n_layer || cache.num_kv_heads() != config_.n_head ||
      cache.head_dim() != E / config_.n_head)
    throw std::invalid_argument("past_key_values: cache of batch " + str(cache.batch()) + ", " +
                                str(cache.num_layers()) + " layers does not fit this model and batch " + str(N));
  for (int64_t i = 0; i < N * L; ++i)
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw std::invalid_argument("input_ids: token id " + str(ids[i]) + " at flat index " + str(i) +
                                  " is outside the vocabulary [0, " + str(config_.vocab_size) + ")");
  cache.reserve(past + L);
  // h [N, L, E] = wte[ids] + wpe[past + l]
  for (int64_t r = 0; r < N * L; ++r) {
    const T* w = wte_.data() + ids[r] * E;
    const T* p = wpe_.data() + (past + r % L) * E;
    for (int64_t j = 0; j < E; ++j) hidden[r * E + j] = w[j] + p[j];
  }
  for (int64_t i = 0; i < config_.n_layer; ++i) blocks_[static_cast<size_t>(i)]->forward(hidden, N, L, cache, i, attention_mask);
  cache.set_length(past + L);
  ln_f_.forward(hidden, N * L, hidden);
}

template <class T>
void GPT2Model<T>::lm_head(const T* hidden, int64_t rows, T* logits) const {
  kernels::linear(hidden, rows, config_.n_embd, wte_.data(), static_cast<const T*>(nullptr), config_.vocab_size,
                  logits);
}

template class KVCache<float>;
template class KVCache<double>;
template class GPT2Block<float>;
template class GPT2Block<double>;
template class GPT2Model<float>;
template class GPT2Model<double>;

}  // namespace transformer_core::models
