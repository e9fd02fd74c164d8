// Bindings of the models: BertModel per dtype, built from a config dict.
#include "common.hpp"
#include "transformer_core/models/bert.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::bindings {

namespace {

using layers::Module;
using models::BertConfig;
using models::BertModel;

BertConfig bert_config_from_dict(const py::dict& d) {
  BertConfig c;
  c.vocab_size = d["vocab_size"].cast<int64_t>();
  c.hidden_size = d["hidden_size"].cast<int64_t>();
  c.num_hidden_layers = d["num_hidden_layers"].cast<int64_t>();
  c.num_attention_heads = d["num_attention_heads"].cast<int64_t>();
  c.intermediate_size = d["intermediate_size"].cast<int64_t>();
  c.max_position_embeddings = d["max_position_embeddings"].cast<int64_t>();
  c.type_vocab_size = d["type_vocab_size"].cast<int64_t>();
  c.hidden_act = ops::parse_activation(d["hidden_act"].cast<std::string>());
  c.layer_norm_eps = d["layer_norm_eps"].cast<double>();
  c.add_pooling_layer = d["add_pooling_layer"].cast<bool>();
  return c;
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();
  py::class_<BertModel<T>, Module<T>>(m, ("BertModel" + sfx).c_str())
      .def(py::init([](const py::dict& config) { return std::make_unique<BertModel<T>>(bert_config_from_dict(config)); }),
           py::arg("config"))
      // input_ids [N, L] int64, attention_mask [N, L] bool or None, token_type_ids [N, L] int64 or None
      // -> (last_hidden_state [N, L, H], pooler_output [N, H] or None)
      .def("forward", [](const BertModel<T>& self, const CArray<int64_t>& input_ids, const py::object& attention_mask,
                         const py::object& token_type_ids) {
        const int64_t N = input_ids.shape(0), L = input_ids.shape(1), H = self.config().hidden_size;
        const uint8_t* mask = nullptr;
        CArray<bool> mask_arr;
        if (!attention_mask.is_none()) {
          mask_arr = attention_mask.cast<CArray<bool>>();
          mask = reinterpret_cast<const uint8_t*>(mask_arr.data());
        }
        const int64_t* tt = nullptr;
        CArray<int64_t> tt_arr;
        if (!token_type_ids.is_none()) {
          tt_arr = token_type_ids.cast<CArray<int64_t>>();
          tt = tt_arr.data();
        }
        py::array_t<T> hidden({N, L, H});
        py::object pooled = py::none();
        T* pp = nullptr;
        if (self.config().add_pooling_layer) {
          py::array_t<T> p({N, H});
          pp = p.mutable_data();
          pooled = p;
        }
        T* hp = hidden.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(input_ids.data(), mask, tt, N, L, hp, pp);
        }
        return py::make_tuple(hidden, pooled);
      });
}

}  // namespace

void register_models(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
