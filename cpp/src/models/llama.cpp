#include "transformer_core/models/llama.hpp"

#include <string>

namespace transformer_core::models {

namespace {
DecoderConfig decoder_config(const LlamaConfig& c) {
  DecoderConfig d;
  d.vocab_size = c.vocab_size;
  d.hidden_size = c.hidden_size;
  d.num_layers = c.num_hidden_layers;
  d.num_heads = c.num_attention_heads;
  d.num_kv_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  d.intermediate_size = c.intermediate_size;
  d.max_positions = c.max_position_embeddings;
  d.norm = ops::NormKind::kRMSNorm;
  d.norm_eps = c.rms_norm_eps;
  d.gated_mlp = true;
  d.activation = c.hidden_act;
  d.attention_bias = c.attention_bias;
  d.mlp_bias = c.mlp_bias;
  d.learned_positions = false;
  d.rope_theta = c.rope_theta;
  d.rope_layout = c.rope_layout;
  d.tie_word_embeddings = c.tie_word_embeddings;
  d.padding_idx = c.pad_token_id;
  return d;
}
}  // namespace

template <class T>
LlamaModel<T>::LlamaModel(const LlamaConfig& c) : DecoderModel<T>(decoder_config(c)) {
  this->register_module("embed_tokens", this->embed_tokens());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const DecoderBlock<T>& b = this->block(i);
    const auto& attn = b.attn();
    const int64_t q = attn.num_heads() * attn.head_dim(), kv = attn.num_kv_heads() * attn.head_dim();
    // Hugging Face's order (LlamaDecoderLayer's modules as created): self_attn's q, k, v, o (each
    // weight then its bias), mlp, then the two norms. q, k, v are row blocks of the packed in_proj
    // [q + 2·kv, E] (one QKV product).
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    const int64_t starts[3] = {0, q, q + kv}, rows[3] = {q, kv, kv};
    for (int j = 0; j < 3; ++j) {
      const std::string name = p + "self_attn." + names[j];
      this->register_slice(name + ".weight", attn, "in_proj_weight", starts[j], rows[j]);
      if (c.attention_bias) this->register_slice(name + ".bias", attn, "in_proj_bias", starts[j], rows[j]);
    }
    this->register_alias(p + "self_attn.o_proj.weight", attn, "out_proj.weight");
    if (c.attention_bias) this->register_alias(p + "self_attn.o_proj.bias", attn, "out_proj.bias");
    this->register_module(p + "mlp", b.mlp());
    this->register_module(p + "input_layernorm", b.attn_norm());
    this->register_module(p + "post_attention_layernorm", b.mlp_norm());
  }
  this->register_module("norm", this->final_norm());
  if (this->lm_head() != nullptr) this->register_module("lm_head", *this->lm_head());
}

template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace transformer_core::models
