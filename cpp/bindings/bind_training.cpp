// Bindings of training: the gradients of every module (Module base), each layer's training forward
// and backward, the models' fused losses and backward passes. They are added to the classes that
// bind_layers.cpp and bind_models.cpp registered (looked up by name on the module). A training
// forward keeps POINTERS to its inputs: those arrays are taken without conversion (noconvert), and
// the Python face keeps them alive until the backward.
#include "common.hpp"
#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/layers/rotary.hpp"
#include "transformer_core/layers/transformer_layers.hpp"
#ifndef TC_OPS_LAYERS_ONLY
#include "transformer_core/models/bert.hpp"
#include "transformer_core/models/decoder.hpp"
#endif

namespace transformer_core::bindings {

namespace {

using layers::Dropout;
using layers::Module;

// The class `name` + dtype suffix registered earlier, to add methods to.
template <class C>
py::class_<C> bound_class(py::module_& m, const std::string& name) {
  return py::reinterpret_borrow<py::class_<C>>(m.attr(name.c_str()));
}

template <class T>
py::array_t<T> like(const std::vector<int64_t>& shape) {
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();
  using MHA = layers::MultiheadAttention<T>;
  using Encoder = layers::TransformerEncoderLayer<T>;
  using Decoder = layers::TransformerDecoderLayer<T>;

  // ---- every module: its gradients ----
  bound_class<Module<T>>(m, "Module" + sfx)
      // The gradient of `name` as a zero-copy view (allocated and zeroed on first use; it lives with the module)
      .def(
          "gradient_view",
          [](py::object self, const std::string& name) {
            auto& mod = self.cast<Module<T>&>();
            const auto& p = mod.parameter(name);
            T* g = mod.gradient(name);
            return py::array_t<T>(std::vector<py::ssize_t>(p.shape.begin(), p.shape.end()), g, self);
          },
          py::arg("name"))
      .def("gradient_written", &Module<T>::gradient_written, py::arg("name"))
      .def("set_gradient_written", &Module<T>::set_gradient_written, py::arg("name"), py::arg("written"))
      .def("clear_gradient", &Module<T>::clear_gradient, py::arg("name"))
      .def("zero_grad", &Module<T>::zero_grad)
      .def("release_activations", &Module<T>::release_activations);

  // ---- layers ----
  bound_class<layers::Linear<T>>(m, "Linear" + sfx)
      // x [rows, in], dy [rows, out] -> dx [rows, in]; weight.grad, bias.grad added
      .def(
          "backward",
          [](layers::Linear<T>& self, const CArray<T>& x, const CArray<T>& dy) {
            const int64_t rows = x.shape(0);
            require(x.ndim() == 2 && x.shape(1) == self.in_features() && dy.ndim() == 2 && dy.shape(0) == rows &&
                        dy.shape(1) == self.out_features(),
                    "Linear.backward: expected x (rows, in_features) and grad_output (rows, out_features)");
            auto dx = like<T>({rows, self.in_features()});
            T* dp = dx.mutable_data();
            {
              ModuleCall call;
              self.backward(x.data(), dy.data(), rows, dp);
            }
            return dx;
          },
          py::arg("x"), py::arg("grad_output"));

  bound_class<layers::Norm<T>>(m, "Norm" + sfx)
      // x [rows, E] (the forward's input), dy [rows, E] -> dx [rows, E]
      .def(
          "backward",
          [](layers::Norm<T>& self, const CArray<T>& x, const CArray<T>& dy) {
            const int64_t rows = x.shape(0);
            require(x.ndim() == 2 && x.shape(1) == self.size() && dy.ndim() == 2 && dy.shape(0) == rows &&
                        dy.shape(1) == self.size(),
                    "Norm.backward: expected x and grad_output of shape (rows, normalized_size)");
            auto dx = like<T>({rows, self.size()});
            T* dp = dx.mutable_data();
            {
              ModuleCall call;
              self.backward(x.data(), dy.data(), rows, dp);
            }
            return dx;
          },
          py::arg("x"), py::arg("grad_output"));

  bound_class<layers::Embedding<T>>(m, "Embedding" + sfx)
      // ids [rows] int64, dy [rows, H]: weight.grad[ids] += dy
      .def(
          "backward",
          [](layers::Embedding<T>& self, const CArray<int64_t>& ids, const CArray<T>& dy, int64_t padding_idx) {
            const int64_t rows = static_cast<int64_t>(ids.size());
            require(dy.ndim() == 2 && dy.shape(0) == rows && dy.shape(1) == self.embedding_dim(),
                    "Embedding.backward: expected grad_output (rows, embedding_dim)");
            self.check(ids.data(), rows, "input_ids");
            ModuleCall call;
            self.backward(ids.data(), dy.data(), rows, padding_idx);
          },
          py::arg("ids"), py::arg("grad_output"), py::arg("padding_idx"));

  bound_class<layers::Embeddings<T>>(m, "Embeddings" + sfx)
      // As forward (input_ids, position_ids, token_type_ids: [rows] int64, the latter two or None), keeping
      // pointers to the ids: the caller keeps them alive until backward
      .def(
          "forward_train",
          [](layers::Embeddings<T>& self, const CArray<int64_t>& input_ids, const py::object& position_ids,
             const py::object& token_type_ids, double dropout, uint64_t seed) {
            const int64_t rows = static_cast<int64_t>(input_ids.size());
            const int64_t* pos = optional_data<int64_t>(position_ids);
            const int64_t* tt = optional_data<int64_t>(token_type_ids);
            self.check(input_ids.data(), pos, tt, rows);
            auto out = like<T>({rows, self.config().hidden_size});
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward_train(input_ids.data(), pos, tt, rows, op, dropout, seed);
            }
            return out;
          },
          py::arg("input_ids").noconvert(), py::arg("position_ids"), py::arg("token_type_ids"), py::arg("dropout"),
          py::arg("seed"))
      // dout [rows, H]: the tables' and the LayerNorm's gradients added
      .def(
          "backward",
          [](layers::Embeddings<T>& self, const CArray<T>& dout) {
            std::vector<T> d(dout.data(), dout.data() + dout.size());  // backward uses it as scratch
            ModuleCall call;
            self.backward(d.data());
          },
          py::arg("grad_output"));

  bound_class<layers::Mlp<T>>(m, "Mlp" + sfx)
      // x [rows, d_model] -> out [rows, d_model], keeping a pointer to x
      .def(
          "forward_train",
          [](layers::Mlp<T>& self, const CArray<T>& x, double hidden_dropout, uint64_t seed) {
            auto out = like<T>({x.shape(0), x.shape(1)});
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward_train(x.data(), x.shape(0), op, hidden_dropout, seed);
            }
            return out;
          },
          py::arg("x").noconvert(), py::arg("hidden_dropout"), py::arg("seed"))
      // dout [rows, d_model] -> dx [rows, d_model]
      .def(
          "backward",
          [](layers::Mlp<T>& self, const CArray<T>& dout) {
            auto dx = like<T>({dout.shape(0), dout.shape(1)});
            T* dp = dx.mutable_data();
            {
              ModuleCall call;
              self.backward(dout.data(), dp);
            }
            return dx;
          },
          py::arg("grad_output"));

  bound_class<MHA>(m, "MultiheadAttention" + sfx)
      // As forward (no cache, no weights); key, value None: self-attention
      .def(
          "forward_train",
          [](MHA& self, const CArray<T>& query, const py::object& key, const py::object& value,
             const py::object& bool_mask, const py::object& float_mask, const py::object& key_mask, bool is_causal,
             const std::string& path, const layers::RotaryEmbedding<T>* rotary, const py::object& position_ids,
             double dropout, uint64_t seed) {
            const bool self_attention = key.is_none();
            const T* kp = self_attention ? query.data() : optional_data<T>(key);
            const T* vp = self_attention ? query.data() : optional_data<T>(value);
            const int64_t N = query.shape(0), L = query.shape(1);
            const int64_t S = self_attention ? L : key.cast<py::array>().shape(1);
            layers::AttentionInputs<T> in;
            in.masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, 0);
            in.path = ops::parse_attention_path(path);
            in.rotary = rotary;
            in.positions = optional_data<int64_t>(position_ids);
            in.dropout = dropout, in.dropout_seed = seed;
            auto out = like<T>({N, L, self.embed_dim()});
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward_train(query.data(), kp, vp, N, L, S, op, in);
            }
            return out;
          },
          py::arg("query").noconvert(), py::arg("key").noconvert(), py::arg("value").noconvert(),
          py::arg("bool_mask"), py::arg("float_mask"), py::arg("key_mask"), py::arg("is_causal"), py::arg("path"),
          py::arg("rotary"), py::arg("position_ids"), py::arg("dropout") = 0.0, py::arg("seed") = 0)
      // dout [N, L, E] -> dquery, or (dquery, dkey, dvalue) with key_shape / value_shape given
      .def(
          "backward",
          [](MHA& self, const CArray<T>& dout, const py::object& key_shape, const py::object& value_shape) -> py::object {
            auto dq = like<T>({dout.shape(0), dout.shape(1), self.embed_dim()});
            T* dqp = dq.mutable_data();
            if (key_shape.is_none()) {
              {
                ModuleCall call;
                self.backward(dout.data(), dqp, nullptr, nullptr);
              }
              return std::move(dq);
            }
            auto dk = like<T>(key_shape.cast<std::vector<int64_t>>());
            auto dv = like<T>(value_shape.cast<std::vector<int64_t>>());
            std::fill(dk.mutable_data(), dk.mutable_data() + dk.size(), T(0));
            std::fill(dv.mutable_data(), dv.mutable_data() + dv.size(), T(0));
            T *dkp = dk.mutable_data(), *dvp = dv.mutable_data();
            {
              ModuleCall call;
              self.backward(dout.data(), dqp, dkp, dvp);
            }
            return py::make_tuple(dq, dk, dv);
          },
          py::arg("grad_output"), py::arg("key_shape"), py::arg("value_shape"));

  bound_class<Encoder>(m, "TransformerEncoderLayer" + sfx)
      .def(
          "forward_train",
          [](Encoder& self, const CArray<T>& src, const py::object& bool_mask, const py::object& float_mask,
             const py::object& key_mask, bool is_causal, const std::string& path, double p, double ffn_p,
             uint64_t seed, double attn_p) {
            const int64_t N = src.shape(0), L = src.shape(1);
            const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, 0);
            const auto ap = ops::parse_attention_path(path);
            auto out = like<T>({N, L, self.d_model()});
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward_train(src.data(), N, L, op, masks, ap, Dropout{p, ffn_p, 0, seed, attn_p});
            }
            return out;
          },
          py::arg("src").noconvert(), py::arg("bool_mask"), py::arg("float_mask"), py::arg("key_mask"),
          py::arg("is_causal"), py::arg("path"), py::arg("dropout"), py::arg("ffn_dropout"), py::arg("seed"),
          py::arg("attn_dropout") = 0.0)
      .def(
          "backward",
          [](Encoder& self, const CArray<T>& dout) {
            auto dsrc = like<T>({dout.shape(0), dout.shape(1), dout.shape(2)});
            T* dp = dsrc.mutable_data();
            {
              ModuleCall call;
              self.backward(dout.data(), dp);
            }
            return dsrc;
          },
          py::arg("grad_output"));

  bound_class<Decoder>(m, "TransformerDecoderLayer" + sfx)
      .def(
          "forward_train",
          [](Decoder& self, const CArray<T>& tgt, const CArray<T>& memory, const py::object& self_bool_mask,
             const py::object& self_float_mask, const py::object& self_key_mask, bool tgt_is_causal,
             const py::object& cross_bool_mask, const py::object& cross_float_mask, const py::object& cross_key_mask,
             const std::string& path, double p, double ffn_p, uint64_t seed, double attn_p) {
            const int64_t N = tgt.shape(0), Tq = tgt.shape(1), S = memory.shape(1);
            const auto self_masks = make_masks<T>(self_bool_mask, self_float_mask, self_key_mask, tgt_is_causal, 0);
            const auto cross_masks = make_masks<T>(cross_bool_mask, cross_float_mask, cross_key_mask, false, 0);
            const auto ap = ops::parse_attention_path(path);
            auto out = like<T>({N, Tq, self.d_model()});
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward_train(tgt.data(), N, Tq, memory.data(), S, op, self_masks, cross_masks, ap,
                                 Dropout{p, ffn_p, 0, seed, attn_p});
            }
            return out;
          },
          py::arg("tgt").noconvert(), py::arg("memory").noconvert(), py::arg("self_bool_mask"),
          py::arg("self_float_mask"), py::arg("self_key_mask"), py::arg("tgt_is_causal"), py::arg("cross_bool_mask"),
          py::arg("cross_float_mask"), py::arg("cross_key_mask"), py::arg("path"), py::arg("dropout"),
          py::arg("ffn_dropout"), py::arg("seed"), py::arg("attn_dropout") = 0.0)
      // dout [N, T, E] -> (dtgt [N, T, E], dmemory [N, S, E])
      .def(
          "backward",
          [](Decoder& self, const CArray<T>& dout, int64_t S) {
            const int64_t N = dout.shape(0), Tq = dout.shape(1), E = dout.shape(2);
            auto dtgt = like<T>({N, Tq, E});
            auto dmem = like<T>({N, S, E});
            std::fill(dmem.mutable_data(), dmem.mutable_data() + dmem.size(), T(0));
            T *dtp = dtgt.mutable_data(), *dmp = dmem.mutable_data();
            {
              ModuleCall call;
              self.backward(dout.data(), dtp, dmp);
            }
            return py::make_tuple(dtgt, dmem);
          },
          py::arg("grad_output"), py::arg("memory_length"));

#ifndef TC_OPS_LAYERS_ONLY  // the reduced core of .ci/sanitize has no models
  // ---- models ----
  bound_class<models::DecoderModel<T>>(m, "DecoderModel" + sfx)
      // input_ids [N, L], targets [N, L] (shifted labels), attention_mask [N, L] bool or None,
      // position_ids [N, L] or None -> (loss, num_tokens, finite); training: keeps the activations
      .def(
          "loss",
          [](models::DecoderModel<T>& self, const CArray<int64_t>& input_ids, const CArray<int64_t>& targets,
             const py::object& attention_mask, const py::object& position_ids, int64_t ignore_index, bool training,
             double resid_dropout, double embed_dropout, uint64_t seed, double attn_dropout) {
            const int64_t N = input_ids.shape(0), L = input_ids.shape(1);
            const uint8_t* mask = attention_mask.is_none()
                                      ? nullptr
                                      : static_cast<const uint8_t*>(attention_mask.cast<py::array>().data());
            const int64_t* positions = optional_data<int64_t>(position_ids);
            models::LossResult r;
            {
              ModuleCall call;
              if (training)
                r = self.loss_train(input_ids.data(), targets.data(), N, L, positions, mask, ignore_index,
                                    Dropout{resid_dropout, 0, embed_dropout, seed, attn_dropout});
              else
                r = self.loss(input_ids.data(), targets.data(), N, L, positions, mask, ignore_index);
            }
            return py::make_tuple(r.loss, r.num_tokens, r.finite);
          },
          py::arg("input_ids"), py::arg("targets"), py::arg("attention_mask"), py::arg("position_ids"),
          py::arg("ignore_index"), py::arg("training"), py::arg("resid_dropout"), py::arg("embed_dropout"),
          py::arg("seed"), py::arg("attn_dropout") = 0.0)
      .def(
          "backward",
          [](models::DecoderModel<T>& self) {
            ModuleCall call;
            self.backward();
          })
      .def_property_readonly("has_training_state", &models::DecoderModel<T>::has_training_state);

  bound_class<models::BertModel<T>>(m, "BertModel" + sfx)
      // As forward, keeping the activations: (last_hidden_state, pooler_output or None)
      .def(
          "forward_train",
          [](models::BertModel<T>& self, const CArray<int64_t>& input_ids, const py::object& attention_mask,
             const py::object& token_type_ids, double hidden_dropout, uint64_t seed, double attn_dropout) {
            const int64_t N = input_ids.shape(0), L = input_ids.shape(1), H = self.config().hidden_size;
            const uint8_t* mask = attention_mask.is_none()
                                      ? nullptr
                                      : static_cast<const uint8_t*>(attention_mask.cast<py::array>().data());
            const int64_t* tt = optional_data<int64_t>(token_type_ids);
            auto hidden = like<T>({N, L, H});
            py::object pooled = py::none();
            T* pp = nullptr;
            if (self.config().add_pooling_layer) {
              auto p = like<T>({N, H});
              pp = p.mutable_data();
              pooled = p;
            }
            T* hp = hidden.mutable_data();
            {
              ModuleCall call;
              self.forward_train(input_ids.data(), mask, tt, N, L, hp, pp, Dropout{hidden_dropout, 0, 0, seed, attn_dropout});
            }
            return py::make_tuple(hidden, pooled);
          },
          py::arg("input_ids"), py::arg("attention_mask"), py::arg("token_type_ids"), py::arg("hidden_dropout"),
          py::arg("seed"), py::arg("attn_dropout") = 0.0)
      .def(
          "backward",
          [](models::BertModel<T>& self, const CArray<T>& d_hidden, const py::object& d_pooled) {
            const T* dp = optional_data<T>(d_pooled);
            ModuleCall call;
            self.backward(d_hidden.data(), dp);
          },
          py::arg("grad_last_hidden_state"), py::arg("grad_pooler_output"))
      .def_property_readonly("has_training_state", &models::BertModel<T>::has_training_state);
#endif
}

}  // namespace

void register_training(py::module_& m) {
  bound_class<layers::EmbeddingsConfig>(m, "EmbeddingsConfig")
      .def_readwrite("padding_idx", &layers::EmbeddingsConfig::padding_idx);
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
