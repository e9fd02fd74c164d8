#include "transformer_core/models/bert.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "transformer_core/ops/checks.hpp"

namespace transformer_core::models {

using ops::to_string;

namespace {
const BertConfig& checked(const BertConfig& c) {
  ops::require_positive(c.vocab_size, "vocab_size");
  ops::require_positive(c.hidden_size, "hidden_size");
  ops::require_nonnegative(c.num_hidden_layers, "num_hidden_layers");
  ops::require_positive(c.num_attention_heads, "num_attention_heads");
  ops::require_positive(c.intermediate_size, "intermediate_size");
  ops::require_positive(c.max_position_embeddings, "max_position_embeddings");
  ops::require_positive(c.type_vocab_size, "type_vocab_size");
  if (c.hidden_size % c.num_attention_heads != 0)
    throw std::invalid_argument("hidden_size: expected a multiple of num_attention_heads (" +
                                to_string(c.num_attention_heads) + "), got " + to_string(c.hidden_size));
  if (!(c.layer_norm_eps >= 0 && std::isfinite(c.layer_norm_eps)))
    throw std::invalid_argument("layer_norm_eps: expected a finite value >= 0, got " + std::to_string(c.layer_norm_eps));
  return c;
}

// Every weight of the model, checked (64-bit, against memory) before the first is allocated: the
// embedding tables, then per layer 4 H² (q, k, v, out) + 2 H·I (the feed-forward) and the small
// vectors, and the pooler H².
template <class T>
const BertConfig& checked_sizes(const BertConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  ops::require_weights({{c.vocab_size, H},
                        {c.max_position_embeddings, H},
                        {c.type_vocab_size, H},
                        {c.num_hidden_layers, 4, H, H},
                        {c.num_hidden_layers, 2, H, I},
                        {c.num_hidden_layers, 10, H},
                        {c.num_hidden_layers, I},
                        {2, H, H}},
                       sizeof(T),
                       "vocab_size, hidden_size, num_hidden_layers, intermediate_size, max_position_embeddings, "
                       "type_vocab_size");
  return c;
}

layers::EmbeddingsConfig embeddings_config(const BertConfig& c) {
  layers::EmbeddingsConfig e;
  e.vocab_size = c.vocab_size;
  e.hidden_size = c.hidden_size;
  e.max_position_embeddings = c.max_position_embeddings;
  e.type_vocab_size = c.type_vocab_size;
  e.layer_norm = true;
  e.layer_norm_eps = c.layer_norm_eps;
  e.padding_idx = c.pad_token_id;
  return e;
}
}  // namespace

template <class T>
BertModel<T>::BertModel(const BertConfig& c) : config_(checked_sizes<T>(checked(c))), embeddings_(embeddings_config(c)) {
  this->register_module("embeddings", embeddings_);
  const int64_t H = c.hidden_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(std::make_unique<layers::TransformerEncoderLayer<T>>(
        H, c.num_attention_heads, c.intermediate_size, c.hidden_act, static_cast<T>(c.layer_norm_eps),
        /*norm_first=*/false));
    const auto& layer = *layers_.back();
    const auto& attn = layer.self_attn();
    // Hugging Face's names for torch's: query/key/value are row blocks of the packed in_proj [3H, H].
    const std::string p = "encoder.layer." + to_string(i) + ".";
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
    for (const auto& [hf, ours] : renames) this->register_alias(p + hf, layer, ours);
  }
  if (c.add_pooling_layer) {
    pooler_ = std::make_unique<layers::Linear<T>>(H, H);
    this->register_module("pooler.dense", *pooler_);
  }
}

template <class T>
void BertModel<T>::forward(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids,
                           int64_t N, int64_t L, T* hidden, T* pooled) const {
  const int64_t H = config_.hidden_size;
  if (L > config_.max_position_embeddings)
    throw std::invalid_argument("input_ids: sequence length " + to_string(L) + " exceeds max_position_embeddings (" +
                                to_string(config_.max_position_embeddings) + ")");
  // Every id is checked, padding's too (as Hugging Face's lookup, and the training forward), and
  // an error names its flat index in input_ids, not in the packed real tokens.
  embeddings_.check(input_ids, nullptr, token_type_ids, N * L);
  const bool pool = pooled != nullptr && pooler_ != nullptr;
  // Sequences that run padded (all L positions through the layers, the padding keys masked): those
  // whose position 0 is padding but that have a real token, when the pooler is computed. The pooler
  // reads position 0's hidden state, which Hugging Face computes as any other query's (its attention
  // over the sequence's real keys) even where it is padding; the packed rows below have no such row.
  // A sequence of padding only stays packed (no rows): it has no key to attend to.
  std::vector<uint8_t> run_padded(static_cast<size_t>(N), 0);
  std::vector<int64_t> padded_seqs;
  if (attention_mask != nullptr && pool) {
    for (int64_t n = 0; n < N; ++n) {
      if (attention_mask[n * L]) continue;
      if (std::any_of(attention_mask + n * L, attention_mask + (n + 1) * L, [](uint8_t m) { return m != 0; })) {
        run_padded[static_cast<size_t>(n)] = 1;
        padded_seqs.push_back(n);
      }
    }
  }
  // The packed tokens: all of them, or those attention_mask marks outside the padded sequences
  // (flat positions n · L + l).
  std::vector<int64_t> index;
  for (int64_t r = 0; r < N * L; ++r)
    if (attention_mask == nullptr || (attention_mask[r] && !run_padded[static_cast<size_t>(r / L)]))
      index.push_back(r);
  const int64_t count = static_cast<int64_t>(index.size());
  std::vector<int64_t> ids(static_cast<size_t>(count)), positions(ids.size()), types;
  for (int64_t t = 0; t < count; ++t) {
    ids[static_cast<size_t>(t)] = input_ids[index[static_cast<size_t>(t)]];
    positions[static_cast<size_t>(t)] = index[static_cast<size_t>(t)] % L;
  }
  if (token_type_ids != nullptr) {
    types.resize(ids.size());
    for (int64_t t = 0; t < count; ++t) types[static_cast<size_t>(t)] = token_type_ids[index[static_cast<size_t>(t)]];
  }
  const int64_t* tt = token_type_ids != nullptr ? types.data() : nullptr;

  // pooler input [N, H]: hidden[:, 0], or position 0's computed state for the padded sequences
  std::vector<T> cls(pool ? static_cast<size_t>(N * H) : 0);
  if (count == N * L) {
    embeddings_.forward(ids.data(), positions.data(), tt, count, hidden);
    for (const auto& layer : layers_) layer->forward(hidden, N, L, hidden, {});
  } else {
    // Packed: the layers see only the real tokens [count, H], each sequence's end to end, and each
    // token attends to the real tokens of its sequence (attention_mask masks the padding keys);
    // padding rows come back as zeros.
    std::fill(hidden, hidden + N * L * H, T(0));
    if (count > 0) {
      std::vector<int64_t> starts(static_cast<size_t>(N + 1), 0);  // sequence n: rows [starts[n], starts[n + 1])
      for (const int64_t r : index) ++starts[static_cast<size_t>(r / L + 1)];
      for (int64_t n = 0; n < N; ++n) starts[static_cast<size_t>(n + 1)] += starts[static_cast<size_t>(n)];
      const layers::PackedTokens tokens{N, count, starts.data()};
      std::vector<T> packed(static_cast<size_t>(count * H));
      embeddings_.forward(ids.data(), positions.data(), tt, count, packed.data());
      for (const auto& layer : layers_) layer->forward_packed(packed.data(), tokens, packed.data());
      for (int64_t t = 0; t < count; ++t)
        std::copy(packed.data() + t * H, packed.data() + (t + 1) * H, hidden + index[static_cast<size_t>(t)] * H);
    }
    if (!padded_seqs.empty()) {
      // The padded sequences [M, L] (embeddings of padding ids and positions too, as Hugging Face's),
      // attention over the real keys; their real rows are copied out, the padding rows stay zeros.
      const int64_t M = static_cast<int64_t>(padded_seqs.size());
      std::vector<int64_t> sub_ids(static_cast<size_t>(M * L)), sub_pos(sub_ids.size()), sub_types;
      std::vector<uint8_t> sub_mask(sub_ids.size());
      if (token_type_ids != nullptr) sub_types.resize(sub_ids.size());
      for (int64_t m = 0; m < M; ++m) {
        const int64_t n = padded_seqs[static_cast<size_t>(m)];
        for (int64_t l = 0; l < L; ++l) {
          const auto s = static_cast<size_t>(m * L + l);
          sub_ids[s] = input_ids[n * L + l];
          sub_pos[s] = l;
          sub_mask[s] = attention_mask[n * L + l] ? 1 : 0;
          if (token_type_ids != nullptr) sub_types[s] = token_type_ids[n * L + l];
        }
      }
      std::vector<T> x(static_cast<size_t>(M * L * H));
      embeddings_.forward(sub_ids.data(), sub_pos.data(), token_type_ids != nullptr ? sub_types.data() : nullptr,
                          M * L, x.data());
      layers::AttentionMasks<T> masks;
      masks.key_mask = sub_mask.data();
      masks.key_mask_stride_n = L;
      masks.key_mask_stride_s = 1;
      for (const auto& layer : layers_) layer->forward(x.data(), M, L, x.data(), masks);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t n = padded_seqs[static_cast<size_t>(m)];
        for (int64_t l = 0; l < L; ++l)
          if (sub_mask[static_cast<size_t>(m * L + l)])
            std::copy(x.data() + (m * L + l) * H, x.data() + (m * L + l + 1) * H, hidden + (n * L + l) * H);
        std::copy(x.data() + m * L * H, x.data() + m * L * H + H, cls.data() + n * H);
      }
    }
  }
  if (pool) {
    // pooler_output [N, H] = tanh(cls · Wᵀ + b)
    for (int64_t n = 0; n < N; ++n)
      if (!run_padded[static_cast<size_t>(n)]) std::copy(hidden + n * L * H, hidden + n * L * H + H, cls.data() + n * H);
    pooler_->forward(cls.data(), N, pooled, Activation::kTanh);
  }
}

template class BertModel<float>;
template class BertModel<double>;

}  // namespace transformer_core::models
