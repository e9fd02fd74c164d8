#include "transformer_core/models/gpt2.hpp"

#include <string>

#include "transformer_core/ops/checks.hpp"

namespace transformer_core::models {

namespace {
DecoderConfig decoder_config(const GPT2Config& c) {
  DecoderConfig d;
  d.vocab_size = c.vocab_size;
  d.hidden_size = c.n_embd;
  d.num_layers = c.n_layer;
  d.num_heads = c.n_head;
  d.intermediate_size = c.n_inner > 0 ? c.n_inner : ops::checked_product({4, c.n_embd}, "n_embd");
  d.max_positions = c.n_positions;
  d.norm = ops::NormKind::kLayerNorm;
  d.norm_eps = c.layer_norm_epsilon;
  d.activation = c.activation_function;
  d.learned_positions = true;
  d.tie_word_embeddings = true;
  return d;
}
}  // namespace

template <class T>
GPT2Model<T>::GPT2Model(const GPT2Config& c) : DecoderModel<T>(decoder_config(c)) {
  this->register_module("wte", this->embed_tokens());
  this->register_module("wpe", *this->embed_positions());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const DecoderBlock<T>& b = this->block(i);
    this->register_module(p + "ln_1", b.attn_norm());
    this->register_alias(p + "attn.c_attn.weight", b.attn(), "in_proj_weight");
    this->register_alias(p + "attn.c_attn.bias", b.attn(), "in_proj_bias");
    this->register_alias(p + "attn.c_proj.weight", b.attn(), "out_proj.weight");
    this->register_alias(p + "attn.c_proj.bias", b.attn(), "out_proj.bias");
    this->register_module(p + "ln_2", b.mlp_norm());
    this->register_alias(p + "mlp.c_fc.weight", b.mlp(), "linear1.weight");
    this->register_alias(p + "mlp.c_fc.bias", b.mlp(), "linear1.bias");
    this->register_alias(p + "mlp.c_proj.weight", b.mlp(), "linear2.weight");
    this->register_alias(p + "mlp.c_proj.bias", b.mlp(), "linear2.bias");
  }
  this->register_module("ln_f", this->final_norm());
}

template class GPT2Model<float>;
template class GPT2Model<double>;

}  // namespace transformer_core::models
