// GPT-2 (Radford et al. 2019), decoder-only; the tutorials' "BERT vs GPT" and "KV cache": the
// decoder stack (decoder.hpp) with LayerNorm, learned positions (wpe), a GELU (tanh) FeedForward,
// biases everywhere, and the LM head tied to the token embedding (wte).
//
// Weights: Hugging Face's GPT2Model names. HF stores GPT-2's projections as Conv1D, [in, out]
// (y = x W + b); here every weight is [out, in] as nn.Linear, so those four are registered
// transposed (the Python loader transposes them): h.{i}.attn.c_attn.weight [3E, E],
// h.{i}.attn.c_proj.weight [E, E], h.{i}.mlp.c_fc.weight [F, E], h.{i}.mlp.c_proj.weight [E, F].
#pragma once

#include <cstdint>

#include "transformer_core/models/decoder.hpp"

namespace transformer_core::models {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0 = 4 · n_embd
  Activation activation_function = Activation::kGeluTanh;
  double layer_norm_epsilon = 1e-5;
};

template <class T>
class GPT2Model : public DecoderModel<T> {
 public:
  explicit GPT2Model(const GPT2Config& config);
};

}  // namespace transformer_core::models
