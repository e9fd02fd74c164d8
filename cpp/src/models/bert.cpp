#include "transformer_core/models/bert.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::models {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

template <class T>
BertEmbeddings<T>::BertEmbeddings(const BertConfig& c) : config_(c) {
  const size_t H = static_cast<size_t>(c.hidden_size);
  word_ = xt::zeros<T>({static_cast<size_t>(c.vocab_size), H});
  position_ = xt::zeros<T>({static_cast<size_t>(c.max_position_embeddings), H});
  token_type_ = xt::zeros<T>({static_cast<size_t>(c.type_vocab_size), H});
  norm_weight_ = xt::ones<T>({H});
  norm_bias_ = xt::zeros<T>({H});
  this->register_parameter("word_embeddings.weight", {c.vocab_size, c.hidden_size}, word_.data());
  this->register_parameter("position_embeddings.weight", {c.max_position_embeddings, c.hidden_size},
                           position_.data());
  this->register_parameter("token_type_embeddings.weight", {c.type_vocab_size, c.hidden_size}, token_type_.data());
  this->register_parameter("LayerNorm.weight", {c.hidden_size}, norm_weight_.data());
  this->register_parameter("LayerNorm.bias", {c.hidden_size}, norm_bias_.data());
}

template <class T>
void BertEmbeddings<T>::check_inputs(const int64_t* ids, const int64_t* tt, int64_t N, int64_t L) const {
  if (L > config_.max_position_embeddings)
    throw std::invalid_argument("input_ids: sequence length " + str(L) + " exceeds max_position_embeddings (" +
                                str(config_.max_position_embeddings) + ")");
  for (int64_t i = 0; i < N * L; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw std::invalid_argument("input_ids: token id " + str(ids[i]) + " at flat index " + str(i) +
                                  " is outside the vocabulary [0, " + str(config_.vocab_size) + ")");
    if (tt != nullptr && (tt[i] < 0 || tt[i] >= config_.type_vocab_size))
      throw std::invalid_argument("token_type_ids: id " + str(tt[i]) + " at flat index " + str(i) +
                                  " is outside [0, " + str(config_.type_vocab_size) + ")");
  }
}

template <class T>
void BertEmbeddings<T>::forward(const int64_t* ids, const int64_t* tt, int64_t L, const int64_t* index, int64_t rows,
                                T* out) const {
  const int64_t H = config_.hidden_size;
  const T eps = static_cast<T>(config_.layer_norm_eps);
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / H), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = index != nullptr ? index[i] : i;  // flat position n · L + l
      const int64_t pos = r % L;
      const T* w = word_.data() + ids[r] * H;
      const T* p = position_.data() + pos * H;
      const T* t = token_type_.data() + (tt != nullptr ? tt[r] : 0) * H;
      T* y = out + i * H;
      for (int64_t j = 0; j < H; ++j) y[j] = w[j] + p[j] + t[j];
      kernels::layer_norm_row(y, H, norm_weight_.data(), norm_bias_.data(), eps, y);
    }
  });
}

template <class T>
BertModel<T>::BertModel(const BertConfig& c) : config_(c), embeddings_(c) {
  if (c.hidden_size < 1 || c.num_attention_heads < 1 || c.hidden_size % c.num_attention_heads != 0)
    throw std::invalid_argument("hidden_size (" + str(c.hidden_size) + ") must be a positive multiple of " +
                                "num_attention_heads (" + str(c.num_attention_heads) + ")");
  if (c.vocab_size < 1 || c.max_position_embeddings < 1 || c.type_vocab_size < 1 || c.num_hidden_layers < 0 ||
      c.intermediate_size < 1)
    throw std::invalid_argument("BertConfig: vocab_size, max_position_embeddings, type_vocab_size and "
                                "intermediate_size must be >= 1 and num_hidden_layers >= 0");
  this->register_module("embeddings", embeddings_);
  const int64_t H = c.hidden_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(std::make_unique<layers::TransformerEncoderLayer<T>>(
        H, c.num_attention_heads, c.intermediate_size, c.hidden_act, static_cast<T>(c.layer_norm_eps),
        /*norm_first=*/false));
    const auto& layer = *layers_.back();
    const auto& attn = layer.self_attn();
    const std::string p = "encoder.layer." + str(i) + ".";
    // Hugging Face keeps query/key/value separate; we keep them packed [3H, H] for one QKV GEMM.
    this->register_slice(p + "attention.self.query.weight", attn, "in_proj_weight", 0, H);
    this->register_slice(p + "attention.self.query.bias", attn, "in_proj_bias", 0, H);
    this->register_slice(p + "attention.self.key.weight", attn, "in_proj_weight", H, H);
    this->register_slice(p + "attention.self.key.bias", attn, "in_proj_bias", H, H);
    this->register_slice(p + "attention.self.value.weight", attn, "in_proj_weight", 2 * H, H);
    this->register_slice(p + "attention.self.value.bias", attn, "in_proj_bias", 2 * H, H);
    const std::pair<const char*, const char*> renames[] = {
        {"attention.output.dense.weight", "self_attn.out_proj.weight"},
        {"attention.output.dense.bias", "self_attn.out_proj.bias"},
        {"attention.output.LayerNorm.weight", "norm1.weight"},
        {"attention.output.LayerNorm.bias", "norm1.bias"},
        {"intermediate.dense.weight", "linear1.weight"},
        {"intermediate.dense.bias", "linear1.bias"},
        {"output.dense.weight", "linear2.weight"},
        {"output.dense.bias", "linear2.bias"},
        {"output.LayerNorm.weight", "norm2.weight"},
        {"output.LayerNorm.bias", "norm2.bias"},
    };
    for (const auto& [hf, ours] : renames) {
      const auto& ref = layer.parameter(ours);
      this->register_parameter(p + hf, ref.shape, ref.data);
    }
  }
  if (c.add_pooling_layer) {
    pooler_weight_ = xt::zeros<T>({static_cast<size_t>(H), static_cast<size_t>(H)});
    pooler_bias_ = xt::zeros<T>({static_cast<size_t>(H)});
    this->register_parameter("pooler.dense.weight", {H, H}, pooler_weight_.data());
    this->register_parameter("pooler.dense.bias", {H}, pooler_bias_.data());
  }
}

template <class T>
void BertModel<T>::forward(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids,
                           int64_t N, int64_t L, T* hidden, T* pooled) const {
  embeddings_.check_inputs(input_ids, token_type_ids, N, L);
  const int64_t H = config_.hidden_size;
  // attention_mask [N, L] (1 = real token) masks keys: padded positions are never attended to.
  layers::MaskArgs<T> masks;
  std::vector<int64_t> index;  // flat positions of the real tokens
  if (attention_mask != nullptr) {
    masks.key_mask = attention_mask;
    masks.key_mask_stride_n = L;
    masks.key_mask_stride_s = 1;
    for (int64_t r = 0; r < N * L; ++r)
      if (attention_mask[r]) index.push_back(r);
  }
  if (attention_mask == nullptr || static_cast<int64_t>(index.size()) == N * L) {
    embeddings_.forward(input_ids, token_type_ids, L, nullptr, N * L, hidden);
    for (const auto& layer : layers_) layer->forward(hidden, N, L, hidden, masks);
  } else {
    // Packed: the layers see only the real tokens [count, H]; padding rows come back as zeros.
    const layers::PackedTokens tokens{N, L, static_cast<int64_t>(index.size()), index.data()};
    std::vector<T> packed(static_cast<size_t>(tokens.count * H));
    embeddings_.forward(input_ids, token_type_ids, L, index.data(), tokens.count, packed.data());
    for (const auto& layer : layers_) layer->forward_packed(packed.data(), tokens, packed.data(), masks);
    std::fill(hidden, hidden + N * L * H, T(0));
    for (int64_t t = 0; t < tokens.count; ++t)
      std::copy(packed.data() + t * H, packed.data() + (t + 1) * H, hidden + index[static_cast<size_t>(t)] * H);
  }
  if (pooled != nullptr && config_.add_pooling_layer) {
    // pooler_output [N, H] = tanh(hidden[:, 0] · Wᵀ + b)
    std::vector<T> cls(static_cast<size_t>(N * H));  // hidden[:, 0]
    for (int64_t n = 0; n < N; ++n) std::copy(hidden + n * L * H, hidden + n * L * H + H, cls.data() + n * H);
    kernels::linear(cls.data(), N, H, pooler_weight_.data(), pooler_bias_.data(), H, pooled);
    for (int64_t i = 0; i < N * H; ++i) pooled[i] = std::tanh(pooled[i]);
  }
}

template class BertEmbeddings<float>;
template class BertEmbeddings<double>;
template class BertModel<float>;
template class BertModel<double>;

}  // namespace transformer_core::models
