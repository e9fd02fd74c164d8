#include "transformer_core/models/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/ops/checks.hpp"
#include "transformer_core/ops/embedding.hpp"
#include "transformer_core/ops/linear.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::models {

using kernels::Scratch;
using ops::to_string;

namespace {
const DecoderConfig& checked(const DecoderConfig& c) {
  ops::require_positive(c.vocab_size, "vocab_size");
  ops::require_positive(c.hidden_size, "hidden_size");
  ops::require_nonnegative(c.num_layers, "num_hidden_layers");
  ops::require_positive(c.num_heads, "num_attention_heads");
  ops::require_nonnegative(c.num_kv_heads, "num_key_value_heads");
  ops::require_nonnegative(c.head_dim, "head_dim");
  if (c.head_dim == 0 && c.hidden_size % c.num_heads != 0)
    throw std::invalid_argument("hidden_size: expected a multiple of num_attention_heads (" + to_string(c.num_heads) +
                                "), got " + to_string(c.hidden_size));
  const int64_t kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  if (c.num_heads % kv_heads != 0)
    throw std::invalid_argument("num_key_value_heads: expected a divisor of num_attention_heads (" +
                                to_string(c.num_heads) + "), got " + to_string(kv_heads));
  ops::require_positive(c.intermediate_size, "intermediate_size");
  ops::require_positive(c.max_positions, "max_position_embeddings");
  if (!(c.norm_eps >= 0 && std::isfinite(c.norm_eps)))
    throw std::invalid_argument("norm_eps: expected a finite value >= 0, got " + std::to_string(c.norm_eps));
  if (!c.learned_positions && !(c.rope_theta > 0 && std::isfinite(c.rope_theta)))
    throw std::invalid_argument("rope_theta: expected a finite value > 0, got " + std::to_string(c.rope_theta));
  return c;
}

// Every weight of the model, checked (64-bit, against memory) before the first is allocated: the
// token (and position) tables and the LM head, the rotary cos and sin tables (P · D each, or
// P · D/2 interleaved), then per layer q/out (H · heads·D each), k/v (H · kv_heads·D each), the
// MLP (2 or 3 H·I) and the norms.
template <class T>
const DecoderConfig& checked_sizes(const DecoderConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, Lyr = c.num_layers;
  const int64_t D = c.head_dim > 0 ? c.head_dim : H / c.num_heads;
  const int64_t kv = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  ops::require_weights({{2, c.vocab_size, H},
                        {c.learned_positions ? c.max_positions : 0, H},
                        // RoPE's tables are built for the first positions, grown as sequences need
                        {c.learned_positions ? 0 : 2,
                         std::min(c.max_positions, layers::RotaryEmbedding<T>::kFirstPositions),
                         c.rope_layout == ops::RotaryLayout::kHalf ? D : D / 2},
                        {Lyr, 2, c.num_heads, D, H},
                        {Lyr, 2, kv, D, H},
                        {Lyr, c.gated_mlp ? 3 : 2, H, I},
                        {Lyr, 8, H}},
                       sizeof(T),
                       "vocab_size, hidden_size, num_hidden_layers, num_attention_heads, head_dim, intermediate_size, "
                       "max_position_embeddings");
  return c;
}

template <class T>
std::unique_ptr<layers::Norm<T>> make_norm(const DecoderConfig& c) {
  if (c.norm == ops::NormKind::kRMSNorm) return std::make_unique<layers::RMSNorm<T>>(c.hidden_size, static_cast<T>(c.norm_eps));
  return std::make_unique<layers::LayerNorm<T>>(c.hidden_size, static_cast<T>(c.norm_eps));
}

template <class T>
std::unique_ptr<layers::Mlp<T>> make_mlp(const DecoderConfig& c) {
  if (c.gated_mlp)
    return std::make_unique<layers::GatedFeedForward<T>>(c.hidden_size, c.intermediate_size, c.activation, c.mlp_bias);
  return std::make_unique<layers::FeedForward<T>>(c.hidden_size, c.intermediate_size, c.activation, c.mlp_bias);
}
}  // namespace

template <class T>
DecoderBlock<T>::DecoderBlock(const DecoderConfig& c)
    : attn_norm_(make_norm<T>(c)),
      attn_(c.hidden_size, c.num_heads, c.attention_bias, 0, 0, c.num_kv_heads, c.head_dim),
      mlp_norm_(make_norm<T>(c)),
      mlp_(make_mlp<T>(c)) {}

template <class T>
void DecoderBlock<T>::forward(T* h, int64_t N, int64_t L, const layers::AttentionInputs<T>& in) const {
  const int64_t rows = N * L;
  const size_t size = static_cast<size_t>(rows * attn_norm_->size());
  T* a = kernels::workspace<T>(Scratch::kLayerA, size);
  T* b = kernels::workspace<T>(Scratch::kLayerB, size);
  attn_norm_->forward(h, rows, a);                 // a = attn_norm(h)
  attn_.forward(a, a, a, N, L, L, b, in);          // b = attn(a)
  mlp_norm_->forward_residual(h, b, rows, a);      // h = h + b;  a = mlp_norm(h)
  mlp_->forward(a, rows, b);                       // b = mlp(a)
  ops::add(h, b, rows * attn_norm_->size(), h);    // h = h + b
}

template <class T>
DecoderModel<T>::DecoderModel(const DecoderConfig& c) : config_(checked_sizes<T>(checked(c))), embed_tokens_(c.vocab_size, c.hidden_size) {
  if (c.learned_positions) {
    embed_positions_ = std::make_unique<layers::Embedding<T>>(c.max_positions, c.hidden_size);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) blocks_.push_back(std::make_unique<DecoderBlock<T>>(c));
  if (!c.learned_positions) {
    const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_heads;
    rotary_ = std::make_unique<layers::RotaryEmbedding<T>>(head_dim, c.max_positions, c.rope_theta, c.rope_layout);
  }
  final_norm_ = make_norm<T>(c);
  if (!c.tie_word_embeddings) lm_head_ = std::make_unique<layers::Linear<T>>(c.hidden_size, c.vocab_size, false);
}

template <class T>
void DecoderModel<T>::forward(const int64_t* input_ids, int64_t N, int64_t L, const int64_t* positions,
                              const uint8_t* attention_mask, layers::KVCache<T>& cache, T* hidden) const {
  const int64_t past = cache.length(), rows = N * L, P = config_.max_positions;
  if (past + L > P)
    throw std::invalid_argument("input_ids: past length " + to_string(past) + " + new length " + to_string(L) +
                                " exceeds the context (max_position_embeddings = " + to_string(P) + ")");
  if (cache.batch() != N || cache.num_layers() != config_.num_layers)
    throw std::invalid_argument("past_key_values: a cache of batch " + to_string(cache.batch()) + " and " +
                                to_string(cache.num_layers()) + " layers does not fit batch " + to_string(N) +
                                " of a model of " + to_string(config_.num_layers) + " layers");
  embed_tokens_.check(input_ids, rows, "input_ids");
  // Positions of the new tokens: given (left padding: derived from the mask), else past + l.
  std::vector<int64_t> default_positions;
  if (positions == nullptr) {
    default_positions.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) default_positions[static_cast<size_t>(r)] = past + r % L;
    positions = default_positions.data();
  }
  ops::check_ids(positions, rows, P, "position_ids");
  if (rotary_ != nullptr) rotary_->prepare(positions, rows);  // grown (or refused) before the cache is
  cache.reserve(past + L);

  embed_tokens_.forward(input_ids, rows, hidden);                                   // h = wte[ids]
  if (embed_positions_ != nullptr) embed_positions_->forward_add(positions, rows, hidden);  // h += wpe[pos]
  layers::AttentionInputs<T> in;
  in.masks.is_causal = true;
  if (attention_mask != nullptr) {  // [N, past + L], 1 = a real token
    in.masks.key_mask = attention_mask;
    in.masks.key_mask_stride_n = past + L;
    in.masks.key_mask_stride_s = 1;
  }
  in.cache = &cache;
  in.rotary = rotary_.get();
  in.positions = positions;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    in.layer = static_cast<int64_t>(i);
    blocks_[i]->forward(hidden, N, L, in);
  }
  cache.set_length(past + L);
  final_norm_->forward(hidden, rows, hidden);
}

template <class T>
void DecoderModel<T>::logits(const T* hidden, int64_t rows, T* out) const {
  if (lm_head_ != nullptr) {
    lm_head_->forward(hidden, rows, out);
  } else {  // tied: logits = hidden · embed_tokensᵀ (fp32, its int8 copy, or its GGUF blocks)
    embed_tokens_.project(hidden, rows, out);
  }
}

template <class T>
void DecoderModel<T>::quantize_tied_lm_head_int8() {
  if (lm_head_ != nullptr || embed_tokens_.quantized_weight() != nullptr || embed_tokens_.output_int8() != nullptr)
    return;
  embed_tokens_.quantize_output_int8();
}

template class DecoderBlock<float>;
template class DecoderBlock<double>;
template class DecoderModel<float>;
template class DecoderModel<double>;

}  // namespace transformer_core::models
