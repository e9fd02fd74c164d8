// Bindings of the layers: each C++ layer class, per dtype, with its state (torch names) and forward.
#include "common.hpp"
#include "transformer_core/layers/transformer_layers.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::bindings {

namespace {

using layers::FeedForward;
using layers::Module;
using layers::MultiheadAttention;
using layers::LayerNorm;
using layers::TransformerDecoderLayer;
using layers::TransformerEncoderLayer;

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  auto mha = py::class_<MultiheadAttention<T>, Module<T>>(m, ("MultiheadAttention" + sfx).c_str());
  mha.def(py::init<int64_t, int64_t, bool, int64_t, int64_t, int64_t>(), py::arg("embed_dim"), py::arg("num_heads"),
          py::arg("bias"), py::arg("kdim"), py::arg("vdim"), py::arg("num_kv_heads"))
      .def_property_readonly("head_dim", &MultiheadAttention<T>::head_dim)
      .def_property_readonly("packed", &MultiheadAttention<T>::packed)
      // query [N, L, E], key [N, S, kdim], value [N, S, vdim] -> out [N, L, E] (, weights [N, H, L, S])
      .def("forward",
           [](const MultiheadAttention<T>& self, const CArray<T>& query, const CArray<T>& key,
              const CArray<T>& value, const py::object& bool_mask, const py::object& float_mask,
              const py::object& key_mask, bool is_causal, int64_t causal_offset, bool need_weights,
              const std::string& path) -> py::object {
             const int64_t N = query.shape(0), L = query.shape(1), S = key.shape(1);
             const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, causal_offset);
             const auto p = ops::parse_attention_path(path);
             py::array_t<T> out({N, L, self.embed_dim()});
             py::array_t<T> weights;
             T* wp = nullptr;
             if (need_weights) {
               weights = py::array_t<T>({N, self.num_heads(), L, S});
               wp = weights.mutable_data();
             }
             T* op = out.mutable_data();
             {
               py::gil_scoped_release release;
               self.forward(query.data(), key.data(), value.data(), N, L, S, op, masks, wp, p);
             }
             if (need_weights) return py::make_tuple(out, weights);
             return std::move(out);
           });

  auto ff = py::class_<FeedForward<T>, Module<T>>(m, ("FeedForward" + sfx).c_str());
  ff.def(py::init([](int64_t d_model, int64_t dff, const std::string& act, bool bias) {
           return std::make_unique<FeedForward<T>>(d_model, dff, ops::parse_activation(act), bias);
         }),
         py::arg("d_model"), py::arg("dim_feedforward"), py::arg("activation"), py::arg("bias"))
      .def("forward", [](const FeedForward<T>& self, const CArray<T>& x) {
        // x [rows, d_model] -> [rows, d_model]
        py::array_t<T> out({x.shape(0), self.d_model()});
        T* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(x.data(), x.shape(0), op);
        }
        return out;
      });

  auto enc = py::class_<TransformerEncoderLayer<T>, Module<T>>(m, ("TransformerEncoderLayer" + sfx).c_str());
  enc.def(py::init([](int64_t d_model, int64_t nhead, int64_t dff, const std::string& act, double eps,
                      bool norm_first, bool bias) {
            return std::make_unique<TransformerEncoderLayer<T>>(d_model, nhead, dff, ops::parse_activation(act),
                                                                static_cast<T>(eps), norm_first, bias);
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward"), py::arg("activation"),
          py::arg("layer_norm_eps"), py::arg("norm_first"), py::arg("bias"))
      // src [N, L, E] -> [N, L, E]
      .def("forward", [](const TransformerEncoderLayer<T>& self, const CArray<T>& src, const py::object& bool_mask,
                         const py::object& float_mask, const py::object& key_mask, bool is_causal,
                         const std::string& path) {
        const int64_t N = src.shape(0), L = src.shape(1);
        const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, 0);
        const auto p = ops::parse_attention_path(path);
        py::array_t<T> out({N, L, self.d_model()});
        T* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(src.data(), N, L, op, masks, p);
        }
        return out;
      });

  auto dec = py::class_<TransformerDecoderLayer<T>, Module<T>>(m, ("TransformerDecoderLayer" + sfx).c_str());
  dec.def(py::init([](int64_t d_model, int64_t nhead, int64_t dff, const std::string& act, double eps,
                      bool norm_first, bool bias) {
            return std::make_unique<TransformerDecoderLayer<T>>(d_model, nhead, dff, ops::parse_activation(act),
                                                                static_cast<T>(eps), norm_first, bias);
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward"), py::arg("activation"),
          py::arg("layer_norm_eps"), py::arg("norm_first"), py::arg("bias"))
      // tgt [N, T, E], memory [N, S, E] -> [N, T, E]; self_masks and cross_masks are
      // (bool_mask, float_mask, key_mask) triples as in MultiheadAttention.forward
      .def("forward", [](const TransformerDecoderLayer<T>& self, const CArray<T>& tgt, const CArray<T>& memory,
                         const py::object& sb, const py::object& sf, const py::object& sk, bool tgt_is_causal,
                         const py::object& cb, const py::object& cf, const py::object& ck, const std::string& path) {
        const int64_t N = tgt.shape(0), Tq = tgt.shape(1), S = memory.shape(1);
        const auto self_masks = make_masks<T>(sb, sf, sk, tgt_is_causal, 0);
        const auto cross_masks = make_masks<T>(cb, cf, ck, false, 0);
        const auto p = ops::parse_attention_path(path);
        py::array_t<T> out({N, Tq, self.d_model()});
        T* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(tgt.data(), N, Tq, memory.data(), S, op, self_masks, cross_masks, p);
        }
        return out;
      });

  auto ln = py::class_<LayerNorm<T>, Module<T>>(m, ("LayerNorm" + sfx).c_str());
  ln.def(py::init([](int64_t n, double eps, bool bias) { return std::make_unique<LayerNorm<T>>(n, static_cast<T>(eps), bias); }),
         py::arg("normalized_size"), py::arg("eps"), py::arg("bias"))
      .def("forward", [](const LayerNorm<T>& self, const CArray<T>& x) {
        // x [rows, E] -> [rows, E]
        py::array_t<T> out({x.shape(0), x.shape(1)});
        T* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          self.forward(x.data(), x.shape(0), op);
        }
        return out;
      });
}

}  // namespace

void register_layers(py::module_& m) {
  // The base class carries the state_dict plumbing for every layer and model.
  auto base32 = py::class_<Module<float>>(m, "Module_f32");
  def_state<float>(base32);
  auto base64 = py::class_<Module<double>>(m, "Module_f64");
  def_state<double>(base64);
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
