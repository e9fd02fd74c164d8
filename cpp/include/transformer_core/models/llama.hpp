// Llama (Touvron et al. 2023; SmolLM2 is one), decoder-only; the tutorials' modern variants: the
// decoder stack (decoder.hpp) with RMSNorm, rotary positions (RoPE), grouped-query attention and a
// SwiGLU GatedFeedForward, no biases by default, the LM head tied or not.
//
// Weights: Hugging Face's LlamaModel names — embed_tokens.weight,
// layers.{i}.input_layernorm.weight, layers.{i}.self_attn.{q,k,v,o}_proj.weight,
// layers.{i}.post_attention_layernorm.weight, layers.{i}.mlp.{gate,up,down}_proj.weight,
// norm.weight — and lm_head.weight when the head is not tied.
#pragma once

#include <cstdint>

#include "transformer_core/models/decoder.hpp"

namespace transformer_core::models {

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // 0 = num_attention_heads
  int64_t head_dim = 0;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;  // training: embed_tokens' padding_idx, as Hugging Face's (< 0: none)
  Activation hidden_act = Activation::kSilu;
  // The order of the q/k weight rows inside each head, and so the RoPE pairs: kHalf (Hugging Face's
  // rotate-half: row i with row i + D/2) or kInterleaved (Meta's original / llama.cpp's GGUF order:
  // rows 2i, 2i+1), which lets a GGUF file's q/k blocks be used in place.
  ops::RotaryLayout rope_layout = ops::RotaryLayout::kHalf;
};

template <class T>
class LlamaModel : public DecoderModel<T> {
 public:
  explicit LlamaModel(const LlamaConfig& config);
};

}  // namespace transformer_core::models
