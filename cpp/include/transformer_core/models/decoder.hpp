// The decoder-only stack every causal language model here is built from (the tutorials' "BERT vs
// GPT", GPT-2, Llama): nanoGPT's Block, llama.cpp's build_norm / build_attn / build_ffn.
//
//   h = embed_tokens[input_ids] (+ embed_positions[positions])          (learned positions: GPT-2)
//   block i:  h = h + attn(attn_norm(h))       attention: causal, GQA, KV cache, RoPE (Llama)
//             h = h + mlp(mlp_norm(h))         mlp: FeedForward (GPT-2) or GatedFeedForward (SwiGLU)
//   hidden = final_norm(h);   logits = hidden · lm_headᵀ   (lm_head tied to embed_tokens, or its own)
//
// input_ids, positions: [N, L] int64   attention_mask: [N, past + L] uint8 (1 = real token)
// hidden: [N, L, E]   logits: [rows, vocab_size]
//
// An architecture is a DecoderConfig plus the names of its weights (gpt2.hpp, llama.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/kv_cache.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/layers/rotary.hpp"

namespace transformer_core::models {

using ops::Activation;

struct DecoderConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;       // 0 = num_heads
  int64_t head_dim = 0;           // 0 = hidden_size / num_heads
  int64_t intermediate_size = 0;
  int64_t max_positions = 0;      // the context length
  ops::NormKind norm = ops::NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  bool gated_mlp = false;         // GatedFeedForward (SwiGLU / GeGLU) instead of FeedForward
  Activation activation = Activation::kGeluTanh;
  bool attention_bias = true;
  bool mlp_bias = true;
  bool learned_positions = true;  // false: RoPE
  double rope_theta = 10000.0;
  ops::RotaryLayout rope_layout = ops::RotaryLayout::kHalf;
  bool tie_word_embeddings = true;
};

template <class T>
class DecoderBlock : public layers::Module<T> {
 public:
  explicit DecoderBlock(const DecoderConfig& c);

  // h [N, L, E] updated in place; in.masks must be causal; in.cache receives this layer's keys/values.
  void forward(T* h, int64_t N, int64_t L, const layers::AttentionInputs<T>& in) const;

  const layers::Norm<T>& attn_norm() const { return *attn_norm_; }
  const layers::MultiheadAttention<T>& attn() const { return attn_; }
  const layers::Norm<T>& mlp_norm() const { return *mlp_norm_; }
  const layers::Mlp<T>& mlp() const { return *mlp_; }

 private:
  std::unique_ptr<layers::Norm<T>> attn_norm_;
  layers::MultiheadAttention<T> attn_;
  std::unique_ptr<layers::Norm<T>> mlp_norm_;
  std::unique_ptr<layers::Mlp<T>> mlp_;
};

template <class T>
class DecoderModel : public layers::Module<T> {
 public:
  // Throws std::invalid_argument naming the field for invalid sizes (see DecoderConfig).
  explicit DecoderModel(const DecoderConfig& c);

  // input_ids [N, L]; positions [N, L] or nullptr (past + l); attention_mask [N, past + L] (1 = real)
  // or nullptr; the cache holds `past` positions and gains L. hidden [N, L, E] (after final_norm).
  // Throws std::invalid_argument for ids outside the vocabulary, positions outside the context, or
  // a cache that does not fit.
  void forward(const int64_t* input_ids, int64_t N, int64_t L, const int64_t* positions,
               const uint8_t* attention_mask, layers::KVCache<T>& cache, T* hidden) const;

  // logits [rows, vocab_size] = hidden [rows, E] · lm_headᵀ
  void logits(const T* hidden, int64_t rows, T* logits) const;

  // A tied LM head in int8 (DecoderModel<float> only): an int8 per-channel copy of embed_tokens
  // that logits() multiplies by, the lookups staying in fp32 (as torch's quantize_dynamic treats a
  // tied nn.Linear head). Does nothing when the head is untied (its Linear is quantized with the
  // others) or the table is itself quantized (GGUF blocks: logits() uses them).
  void quantize_tied_lm_head_int8();

  const DecoderConfig& config() const { return config_; }
  int64_t head_dim() const { return blocks_.empty() ? config_.head_dim : blocks_[0]->attn().head_dim(); }

 protected:
  // The parts, for an architecture's constructor to register under its own weight names.
  const layers::Embedding<T>& embed_tokens() const { return embed_tokens_; }
  const layers::Embedding<T>* embed_positions() const { return embed_positions_.get(); }
  const DecoderBlock<T>& block(int64_t i) const { return *blocks_[static_cast<size_t>(i)]; }
  const layers::Norm<T>& final_norm() const { return *final_norm_; }
  const layers::Linear<T>* lm_head() const { return lm_head_.get(); }

 private:
  DecoderConfig config_;
  layers::Embedding<T> embed_tokens_;
  std::unique_ptr<layers::Embedding<T>> embed_positions_;
  std::unique_ptr<layers::RotaryEmbedding<T>> rotary_;
  std::vector<std::unique_ptr<DecoderBlock<T>>> blocks_;
  std::unique_ptr<layers::Norm<T>> final_norm_;
  std::unique_ptr<layers::Linear<T>> lm_head_;  // nullptr: tied to embed_tokens
};

}  // namespace transformer_core::models
