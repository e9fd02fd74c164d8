// Bindings of the models: BertModel per dtype, built from a config dict.
#include "common.hpp"
#include "transformer_core/models/bert.hpp"
#include "transformer_core/models/gpt2.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::bindings {

namespace {

using layers::Module;
using models::BertConfig;
using models::BertModel;
using models::GPT2Config;
using models::GPT2Model;
using models::KVCache;

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

GPT2Config gpt2_config_from_dict(const py::dict& d) {
  GPT2Config c;
  c.vocab_size = d["vocab_size"].cast<int64_t>();
  c.n_positions = d["n_positions"].cast<int64_t>();
  c.n_embd = d["n_embd"].cast<int64_t>();
  c.n_layer = d["n_layer"].cast<int64_t>();
  c.n_head = d["n_head"].cast<int64_t>();
  c.n_inner = d["n_inner"].is_none() ? 0 : d["n_inner"].cast<int64_t>();
  c.activation = ops::parse_activation(d["activation_function"].cast<std::string>());
  c.layer_norm_epsilon = d["layer_norm_epsilon"].cast<double>();
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

  py::class_<KVCache<T>>(m, ("KVCache" + sfx).c_str())
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t>(), py::arg("num_layers"), py::arg("batch"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("capacity"))
      .def_property_readonly("length", &KVCache<T>::length)
      .def_property_readonly("capacity", &KVCache<T>::capacity)
      .def_property_readonly("num_layers", &KVCache<T>::num_layers)
      .def_property_readonly("batch", &KVCache<T>::batch)
      .def_property_readonly("num_kv_heads", &KVCache<T>::num_kv_heads)
      .def_property_readonly("head_dim", &KVCache<T>::head_dim)
      // (keys, values) of one layer, each a copy [N, H_kv, length, D]
      .def("get", [](const KVCache<T>& c, int64_t layer) {
        require(layer >= 0 && layer < c.num_layers(), "layer: out of range");
        const int64_t N = c.batch(), H = c.num_kv_heads(), S = c.length(), D = c.head_dim(), cap = c.capacity();
        py::array_t<T> k({N, H, S, D}), v({N, H, S, D});
        for (int64_t nh = 0; nh < N * H; ++nh) {
          std::copy(c.keys(layer) + nh * cap * D, c.keys(layer) + nh * cap * D + S * D, k.mutable_data() + nh * S * D);
          std::copy(c.values(layer) + nh * cap * D, c.values(layer) + nh * cap * D + S * D, v.mutable_data() + nh * S * D);
        }
        return py::make_tuple(k, v);
      })
      // Fills the cache from per-layer (keys, values) [N, H_kv, S, D] (already validated).
      .def("load", [](KVCache<T>& c, const std::vector<std::pair<CArray<T>, CArray<T>>>& kv) {
        const int64_t N = c.batch(), H = c.num_kv_heads(), D = c.head_dim();
        const int64_t S = kv.empty() ? 0 : kv[0].first.shape(2);
        c.set_length(0);
        c.reserve(S);
        const int64_t cap = c.capacity();
        for (size_t layer = 0; layer < kv.size(); ++layer)
          for (int64_t nh = 0; nh < N * H; ++nh) {
            std::copy(kv[layer].first.data() + nh * S * D, kv[layer].first.data() + (nh + 1) * S * D,
                      c.keys(static_cast<int64_t>(layer)) + nh * cap * D);
            std::copy(kv[layer].second.data() + nh * S * D, kv[layer].second.data() + (nh + 1) * S * D,
                      c.values(static_cast<int64_t>(layer)) + nh * cap * D);
          }
        c.set_length(S);
      })
      .def("crop", [](KVCache<T>& c, int64_t length) {
        require(length >= 0 && length <= c.length(), "length: expected 0 <= length <= cache length");
        c.set_length(length);
      });

  py::class_<GPT2Model<T>, Module<T>>(m, ("GPT2Model" + sfx).c_str())
      .def(py::init([](const py::dict& config) { return std::make_unique<GPT2Model<T>>(gpt2_config_from_dict(config)); }),
           py::arg("config"))
      // input_ids [N, L] int64, attention_mask [N, past + L] bool or None, cache (updated in place)
      // -> hidden [N, L, E] (after ln_f)
      .def("forward", [](const GPT2Model<T>& self, const CArray<int64_t>& input_ids, const py::object& attention_mask,
                         KVCache<T>& cache) {
        const int64_t N = input_ids.shape(0), L = input_ids.shape(1), E = self.config().n_embd;
        const uint8_t* mask = nullptr;
        CArray<bool> mask_arr;
        if (!attention_mask.is_none()) {
          mask_arr = attention_mask.cast<CArray<bool>>();
          require(mask_arr.ndim() == 2 && mask_arr.shape(0) == N && mask_arr.shape(1) == cache.length() + L,
                  "attention_mask: expected shape (batch, past + new length)");
          mask = reinterpret_cast<const uint8_t*>(mask_arr.data());
        }
        py::array_t<T> hidden({N, L, E});
        T* hp = hidden.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(input_ids.data(), N, L, mask, cache, hp);
        }
        return hidden;
      })
      // hidden [rows, E] -> logits [rows, vocab]
      .def("lm_head", [](const GPT2Model<T>& self, const CArray<T>& hidden) {
        py::array_t<T> logits({hidden.shape(0), self.config().vocab_size});
        T* lp = logits.mutable_data();
        {
          py::gil_scoped_release release;
          self.lm_head(hidden.data(), hidden.shape(0), lp);
        }
        return logits;
      });
}

}  // namespace

void register_models(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
