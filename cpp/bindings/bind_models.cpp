// Bindings of the models: their config structs as classes, BertModel and the decoder models per dtype.
#include "common.hpp"
#include "transformer_core/models/bert.hpp"
#include "transformer_core/models/gpt2.hpp"
#include "transformer_core/models/llama.hpp"

namespace transformer_core::bindings {

namespace {

using layers::Module;
using models::BertConfig;
using models::GPT2Config;
using models::LlamaConfig;

void register_configs(py::module_& m) {
  py::class_<BertConfig>(m, "BertConfig")
      .def(py::init<>())
      .def_readwrite("vocab_size", &BertConfig::vocab_size)
      .def_readwrite("hidden_size", &BertConfig::hidden_size)
      .def_readwrite("num_hidden_layers", &BertConfig::num_hidden_layers)
      .def_readwrite("num_attention_heads", &BertConfig::num_attention_heads)
      .def_readwrite("intermediate_size", &BertConfig::intermediate_size)
      .def_readwrite("max_position_embeddings", &BertConfig::max_position_embeddings)
      .def_readwrite("type_vocab_size", &BertConfig::type_vocab_size)
      .def_readwrite("hidden_act", &BertConfig::hidden_act)
      .def_readwrite("layer_norm_eps", &BertConfig::layer_norm_eps)
      .def_readwrite("add_pooling_layer", &BertConfig::add_pooling_layer)
      .def_readwrite("pad_token_id", &BertConfig::pad_token_id);
  py::class_<GPT2Config>(m, "GPT2Config")
      .def(py::init<>())
      .def_readwrite("vocab_size", &GPT2Config::vocab_size)
      .def_readwrite("n_positions", &GPT2Config::n_positions)
      .def_readwrite("n_embd", &GPT2Config::n_embd)
      .def_readwrite("n_layer", &GPT2Config::n_layer)
      .def_readwrite("n_head", &GPT2Config::n_head)
      .def_readwrite("n_inner", &GPT2Config::n_inner)
      .def_readwrite("activation_function", &GPT2Config::activation_function)
      .def_readwrite("layer_norm_epsilon", &GPT2Config::layer_norm_epsilon);
  py::class_<LlamaConfig>(m, "LlamaConfig")
      .def(py::init<>())
      .def_readwrite("vocab_size", &LlamaConfig::vocab_size)
      .def_readwrite("hidden_size", &LlamaConfig::hidden_size)
      .def_readwrite("intermediate_size", &LlamaConfig::intermediate_size)
      .def_readwrite("num_hidden_layers", &LlamaConfig::num_hidden_layers)
      .def_readwrite("num_attention_heads", &LlamaConfig::num_attention_heads)
      .def_readwrite("num_key_value_heads", &LlamaConfig::num_key_value_heads)
      .def_readwrite("head_dim", &LlamaConfig::head_dim)
      .def_readwrite("max_position_embeddings", &LlamaConfig::max_position_embeddings)
      .def_readwrite("rms_norm_eps", &LlamaConfig::rms_norm_eps)
      .def_readwrite("rope_theta", &LlamaConfig::rope_theta)
      .def_readwrite("attention_bias", &LlamaConfig::attention_bias)
      .def_readwrite("mlp_bias", &LlamaConfig::mlp_bias)
      .def_readwrite("tie_word_embeddings", &LlamaConfig::tie_word_embeddings)
      .def_readwrite("pad_token_id", &LlamaConfig::pad_token_id)
      .def_readwrite("hidden_act", &LlamaConfig::hidden_act)
      .def_property(
          "rope_layout",
          [](const LlamaConfig& c) { return std::string(c.rope_layout == ops::RotaryLayout::kHalf ? "half" : "interleaved"); },
          [](LlamaConfig& c, const std::string& name) { c.rope_layout = ops::parse_rotary_layout(name); });
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();
  using Bert = models::BertModel<T>;
  using Decoder = models::DecoderModel<T>;

  py::class_<Bert, Module<T>>(m, ("BertModel" + sfx).c_str())
      .def(py::init<const BertConfig&>(), py::arg("config"))
      // input_ids [N, L] int64, attention_mask [N, L] bool or None, token_type_ids [N, L] int64 or None
      // -> (last_hidden_state [N, L, H], pooler_output [N, H] or None: None without a pooler, or
      // with pooler false, which skips its product (a sentence encoder pools the hidden states;
      // rows whose position 0 is padding then run packed, as without a pooler: other rounding)
      .def(
          "forward",
          [](const Bert& self, const CArray<int64_t>& input_ids, const py::object& attention_mask,
             const py::object& token_type_ids, bool pooler) {
            const int64_t N = input_ids.shape(0), L = input_ids.shape(1), H = self.config().hidden_size;
            const uint8_t* mask = attention_mask.is_none()
                                      ? nullptr
                                      : static_cast<const uint8_t*>(attention_mask.cast<py::array>().data());
            const int64_t* tt = optional_data<int64_t>(token_type_ids);
            auto hidden = new_array<T>({N, L, H}, "input_ids: the hidden states (N, L, hidden_size)");
            py::object pooled = py::none();
            T* pp = nullptr;
            if (pooler && self.config().add_pooling_layer) {
              auto p = new_array<T>({N, H}, "input_ids: the pooler output (N, hidden_size)");
              pp = p.mutable_data();
              pooled = p;
            }
            T* hp = hidden.mutable_data();
            {
              ModuleCall call;
              self.forward(input_ids.data(), mask, tt, N, L, hp, pp);
            }
            return py::make_tuple(hidden, pooled);
          },
          py::arg("input_ids"), py::arg("attention_mask"), py::arg("token_type_ids"), py::arg("pooler") = true);

  py::class_<Decoder, Module<T>>(m, ("DecoderModel" + sfx).c_str())
      .def_property_readonly("head_dim", &Decoder::head_dim)
      // input_ids [N, L] int64, attention_mask [N, past + L] bool or None, position_ids [N, L] int64 or
      // None, cache (updated in place) -> hidden [N, L, E] (after the final norm)
      .def(
          "forward",
          [](const Decoder& self, const CArray<int64_t>& input_ids, const py::object& attention_mask,
             const py::object& position_ids, layers::KVCache<T>& cache) {
            const int64_t N = input_ids.shape(0), L = input_ids.shape(1), E = self.config().hidden_size;
            const uint8_t* mask = attention_mask.is_none()
                                      ? nullptr
                                      : static_cast<const uint8_t*>(attention_mask.cast<py::array>().data());
            const int64_t* positions = optional_data<int64_t>(position_ids);
            auto hidden = new_array<T>({N, L, E}, "input_ids: the hidden states (N, L, hidden_size)");
            T* hp = hidden.mutable_data();
            typename layers::KVCache<T>::Use use(&cache);
            // the mask was checked in Python against the length the cache had then
            require(attention_mask.is_none() || attention_mask.cast<py::array>().shape(1) == cache.length() + L,
                    "past_key_values: its length changed after attention_mask was checked (another call on the "
                    "cache; a cache holds one sequence of calls at a time)");
            {
              ModuleCall call;
              self.forward(input_ids.data(), N, L, positions, mask, cache, hp);
            }
            return hidden;
          },
          py::arg("input_ids"), py::arg("attention_mask"), py::arg("position_ids"), py::arg("cache"))
      // hidden [rows, E] -> logits [rows, vocab_size]
      .def(
          "logits",
          [](const Decoder& self, const CArray<T>& hidden) {
            auto logits = new_array<T>({hidden.shape(0), self.config().vocab_size}, "logits (rows, vocab_size)");
            T* lp = logits.mutable_data();
            {
              ModuleCall call;
              self.logits(hidden.data(), hidden.shape(0), lp);
            }
            return logits;
          },
          py::arg("hidden"));

  py::class_<models::GPT2Model<T>, Decoder>(m, ("GPT2Model" + sfx).c_str())
      .def(py::init<const GPT2Config&>(), py::arg("config"));
  py::class_<models::LlamaModel<T>, Decoder>(m, ("LlamaModel" + sfx).c_str())
      .def(py::init<const LlamaConfig&>(), py::arg("config"));
}

}  // namespace

void register_models(py::module_& m) {
  register_configs(m);
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
