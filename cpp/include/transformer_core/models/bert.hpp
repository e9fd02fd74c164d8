// BERT (Devlin et al. 2019), encoder-only; the tutorials' encoder (token + learned position
// embeddings, post-LN encoder layers) and their "BERT vs GPT" comparison.
//
//   embeddings = LayerNorm(word[input_ids] + position[0..L) + token_type[token_type_ids])
//   hidden     = post-LN TransformerEncoderLayer (GELU) × num_hidden_layers
//   pooler     = tanh(dense(hidden[:, 0]))                      (optional)
//
// input_ids, token_type_ids: [N, L] int64   attention_mask: [N, L] uint8 (1 = real token)
// last_hidden_state: [N, L, H]              pooler_output: [N, H]
// Parameter names are Hugging Face's BertModel state_dict names.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/transformer_layers.hpp"

namespace transformer_core::models {

using ops::Activation;

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  Activation hidden_act = Activation::kGelu;
  double layer_norm_eps = 1e-12;
  bool add_pooling_layer = true;
  int64_t pad_token_id = -1;  // training: word_embeddings' padding_idx (its row gets no gradient; < 0: none)
};

template <class T>
class BertModel : public layers::Module<T> {
 public:
  // Throws std::invalid_argument naming the config field for sizes < 1 (num_hidden_layers < 0),
  // hidden_size not a multiple of num_attention_heads, or a negative / NaN layer_norm_eps.
  explicit BertModel(const BertConfig& config);

  // last_hidden_state [N, L, H]; pooler_output [N, H] or nullptr (ignored without a pooler).
  // attention_mask may be nullptr (every token real), token_type_ids nullptr (all zeros). With
  // padding, every GEMM, norm and activation runs on the real tokens only (packed rows), attention
  // on the padded batch with the padding keys masked; padding positions are returned as zeros.
  // The pooler reads position 0's state as Hugging Face computes it even where that position is
  // padding (left padding, a mask with a hole there): such a sequence runs padded (all L positions,
  // the padding keys masked) when pooler_output is asked for. A sequence of padding only has no
  // state (zeros; pooler_output = tanh(bias)): Hugging Face's eager and SDPA attentions disagree there.
  // Throws std::invalid_argument for ids outside their tables or L > max_position_embeddings.
  void forward(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids, int64_t N,
               int64_t L, T* last_hidden_state, T* pooler_output) const;

  const BertConfig& config() const { return config_; }

  // ---- training (bert_train.cpp; fine-tuning) ----
  // As forward, on the padded batch (no packing: padding queries are computed and their rows set
  // to zero in last_hidden_state, as forward returns them), keeping every activation the backward
  // needs; drop.p: hidden_dropout_prob on the embeddings and on both residual branches of every layer.
  // The pooler reads position 0's computed state even where it is padding (as forward, Hugging
  // Face); a sequence of padding only pools zeros (pooler_output = tanh(bias)).
  void forward_train(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids,
                     int64_t N, int64_t L, T* last_hidden_state, T* pooler_output, const layers::Dropout& drop = {});
  // The gradients of a loss given d last_hidden_state [N, L, H] (padding rows ignored: they are
  // constant zeros) and d pooler_output [N, H] (or nullptr; it reaches position 0's state, padding
  // or not, except in a sequence of padding only): every parameter's gradient added.
  // Throws std::logic_error without a training forward since the last backward.
  void backward(const T* d_last_hidden_state, const T* d_pooler_output);
  bool has_training_state() const { return train_.valid; }
  void release_activations() override;

 private:
  BertConfig config_;
  layers::Embeddings<T> embeddings_;
  std::vector<std::unique_ptr<layers::TransformerEncoderLayer<T>>> layers_;
  std::unique_ptr<layers::Linear<T>> pooler_;
  struct TrainState {
    int64_t N = 0, L = 0;
    std::vector<int64_t> ids, positions, types;  // [N·L]
    std::vector<uint8_t> mask;                   // [N, L] or empty
    std::vector<std::vector<T>> stream;          // num_hidden_layers + 1 hidden states [N·L, H]
    std::vector<T> cls, pooler_pre;              // [N, H]: hidden[:, 0] and dense(cls) before tanh
    std::vector<T> grad_a, grad_b;
    bool valid = false;
  } train_;
};

}  // namespace transformer_core::models
