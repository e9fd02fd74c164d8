// BERT (Devlin et al. 2019), encoder-only; seed 001 "Positional Embeddings" and "Encoder", seed 000
// "BERT vs GPT".
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
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/transformer_layers.hpp"

namespace transformer_core::models {

using kernels::Activation;

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
};

template <class T>
class BertEmbeddings : public layers::Module<T> {
 public:
  // word_embeddings.weight [V, H], position_embeddings.weight [P, H],
  // token_type_embeddings.weight [T, H], LayerNorm.weight [H], LayerNorm.bias [H]
  explicit BertEmbeddings(const BertConfig& config);

  // Throws std::invalid_argument for ids outside [0, vocab_size) / [0, type_vocab_size) or
  // L > max_position_embeddings. token_type_ids may be nullptr (all zeros).
  void check_inputs(const int64_t* input_ids, const int64_t* token_type_ids, int64_t N, int64_t L) const;
  // out [rows, H] for the tokens at flat positions index[0..rows) of the [N, L] batch (position
  // index[r] % L); index == nullptr: every position, rows = N · L.
  void forward(const int64_t* input_ids, const int64_t* token_type_ids, int64_t L, const int64_t* index,
               int64_t rows, T* out) const;

 private:
  BertConfig config_;
  xt::xtensor<T, 2> word_, position_, token_type_;
  xt::xtensor<T, 1> norm_weight_, norm_bias_;
};

template <class T>
class BertModel : public layers::Module<T> {
 public:
  explicit BertModel(const BertConfig& config);

  // last_hidden_state [N, L, H]; pooler_output [N, H] or nullptr (ignored without a pooler).
  // attention_mask may be nullptr (every token real). With padding, every GEMM, norm and activation
  // runs on the real tokens only (packed rows), attention on the padded batch with the padding keys
  // masked; the hidden states of padding positions are returned as zeros.
  void forward(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids, int64_t N,
               int64_t L, T* last_hidden_state, T* pooler_output) const;

  const BertConfig& config() const { return config_; }

 private:
  BertConfig config_;
  BertEmbeddings<T> embeddings_;
  std::vector<std::unique_ptr<layers::TransformerEncoderLayer<T>>> layers_;
  xt::xtensor<T, 2> pooler_weight_;
  xt::xtensor<T, 1> pooler_bias_;
};

}  // namespace transformer_core::models
