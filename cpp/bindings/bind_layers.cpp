// Bindings of the layers: each C++ layer class, per dtype, with its forward. Their weights are
// reached through the Module base (common.hpp): parameter_shapes / get / set / view, torch's names.
#include "common.hpp"
#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/kv_cache.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/layers/rotary.hpp"
#include "transformer_core/layers/transformer_layers.hpp"

namespace transformer_core::bindings {

namespace {

using layers::Module;

// The last check before a layer reads x: its rank and its feature size are the layer's own. The
// Python side checks them first with the user's names; this one holds if a Python attribute was
// changed after the layer was built (a size the C++ layer never had would read past x).
template <class T>
void require_features(const CArray<T>& x, py::ssize_t ndim, int64_t features, const char* name) {
  std::string got = "(";
  for (py::ssize_t i = 0; i < x.ndim(); ++i) got += (i ? ", " : "") + std::to_string(x.shape(i));
  got += ")";
  require(x.ndim() == ndim && x.shape(ndim - 1) == features,
          std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, the last of " +
              std::to_string(features) + " (the layer's size), got shape " + got);
}

// x [rows, in] -> forward(x) [rows, out] for a layer whose forward(x, rows, y) writes out values per row.
template <class T, class Layer>
py::array_t<T> rows_forward(const Layer& layer, const CArray<T>& x, int64_t in_features, int64_t out_features) {
  require_features<T>(x, 2, in_features, "x");
  auto y = new_array<T>({x.shape(0), out_features}, "x: the output (rows, out_features)");
  T* yp = y.mutable_data();
  {
    ModuleCall call;
    layer.forward(x.data(), x.shape(0), yp);
  }
  return y;
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();
  using Linear = layers::Linear<T>;
  using Norm = layers::Norm<T>;
  using KVCache = layers::KVCache<T>;
  using Rotary = layers::RotaryEmbedding<T>;
  using MHA = layers::MultiheadAttention<T>;

  py::class_<Linear, Module<T>>(m, ("Linear" + sfx).c_str())
      .def(py::init<int64_t, int64_t, bool>(), py::arg("in_features"), py::arg("out_features"), py::arg("bias"))
      // x [rows, in] -> [rows, out]
      .def("forward", [](const Linear& self, const CArray<T>& x) { return rows_forward<T>(self, x, self.in_features(), self.out_features()); },
           py::arg("x"));

  py::class_<Norm, Module<T>>(m, ("Norm" + sfx).c_str())
      // x [rows, E] -> [rows, E]
      .def("forward", [](const Norm& self, const CArray<T>& x) { return rows_forward<T>(self, x, self.size(), self.size()); },
           py::arg("x"));
  py::class_<layers::LayerNorm<T>, Norm>(m, ("LayerNorm" + sfx).c_str())
      .def(py::init([](int64_t n, double eps, bool bias) { return std::make_unique<layers::LayerNorm<T>>(n, static_cast<T>(eps), bias); }),
           py::arg("normalized_size"), py::arg("eps"), py::arg("bias"));
  py::class_<layers::RMSNorm<T>, Norm>(m, ("RMSNorm" + sfx).c_str())
      .def(py::init([](int64_t n, double eps) { return std::make_unique<layers::RMSNorm<T>>(n, static_cast<T>(eps)); }),
           py::arg("normalized_size"), py::arg("eps"));

  py::class_<layers::Embedding<T>, Module<T>>(m, ("Embedding" + sfx).c_str())
      .def(py::init<int64_t, int64_t>(), py::arg("num_embeddings"), py::arg("embedding_dim"))
      // ids [rows] int64 -> [rows, H]
      .def(
          "forward",
          [](const layers::Embedding<T>& self, const CArray<int64_t>& ids) {
            const int64_t rows = static_cast<int64_t>(ids.size());
            self.check(ids.data(), rows, "input_ids");
            auto out = new_array<T>({rows, self.embedding_dim()}, "input_ids: the output (ids, embedding_dim)");
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward(ids.data(), rows, op);
            }
            return out;
          },
          py::arg("ids"));

  py::class_<layers::Embeddings<T>, Module<T>>(m, ("Embeddings" + sfx).c_str())
      .def(py::init<const layers::EmbeddingsConfig&>(), py::arg("config"))
      // input_ids, position_ids, token_type_ids: [rows] int64 (the latter two or None) -> [rows, H]
      .def(
          "forward",
          [](const layers::Embeddings<T>& self, const CArray<int64_t>& input_ids, const py::object& position_ids,
             const py::object& token_type_ids) {
            const int64_t rows = static_cast<int64_t>(input_ids.size());
            const int64_t* pos = optional_data<int64_t>(position_ids);
            const int64_t* tt = optional_data<int64_t>(token_type_ids);
            self.check(input_ids.data(), pos, tt, rows);
            auto out = new_array<T>({rows, self.config().hidden_size}, "input_ids: the output (ids, hidden_size)");
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward(input_ids.data(), pos, tt, rows, op);
            }
            return out;
          },
          py::arg("input_ids"), py::arg("position_ids"), py::arg("token_type_ids"));

  py::class_<layers::Mlp<T>, Module<T>>(m, ("Mlp" + sfx).c_str())
      // x [rows, d_model] -> [rows, d_model]
      .def(
          "forward",
          [](const layers::Mlp<T>& self, const CArray<T>& x) { return rows_forward<T>(self, x, self.d_model(), self.d_model()); },
          py::arg("x"));
  py::class_<layers::FeedForward<T>, layers::Mlp<T>>(m, ("FeedForward" + sfx).c_str())
      .def(py::init([](int64_t d_model, int64_t dff, const std::string& act, bool bias) {
             return std::make_unique<layers::FeedForward<T>>(d_model, dff, ops::parse_activation(act), bias);
           }),
           py::arg("d_model"), py::arg("dim_feedforward"), py::arg("activation"), py::arg("bias"));
  py::class_<layers::GatedFeedForward<T>, layers::Mlp<T>>(m, ("GatedFeedForward" + sfx).c_str())
      .def(py::init([](int64_t d_model, int64_t dff, const std::string& act, bool bias) {
             return std::make_unique<layers::GatedFeedForward<T>>(d_model, dff, ops::parse_activation(act), bias);
           }),
           py::arg("d_model"), py::arg("dim_feedforward"), py::arg("activation"), py::arg("bias"));

  py::class_<KVCache>(m, ("KVCache" + sfx).c_str())
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t>(), py::arg("num_layers"), py::arg("batch"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("capacity"))
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("num_layers", &KVCache::num_layers)
      .def_property_readonly("batch", &KVCache::batch)
      .def_property_readonly("num_kv_heads", &KVCache::num_kv_heads)
      .def_property_readonly("head_dim", &KVCache::head_dim)
      // (keys, values) of one layer, each a copy [N, H_kv, length, D]
      .def(
          "get",
          [](const KVCache& c, int64_t layer) {
            c.require_idle();
            require(layer >= 0 && layer < c.num_layers(), "layer: expected an index in [0, " +
                                                              std::to_string(c.num_layers()) + "), got " +
                                                              std::to_string(layer));
            const int64_t N = c.batch(), H = c.num_kv_heads(), S = c.length(), D = c.head_dim(), cap = c.capacity();
            py::array_t<T> k({N, H, S, D}), v({N, H, S, D});
            for (int64_t nh = 0; nh < N * H; ++nh) {
              std::copy(c.keys(layer) + nh * cap * D, c.keys(layer) + nh * cap * D + S * D, k.mutable_data() + nh * S * D);
              std::copy(c.values(layer) + nh * cap * D, c.values(layer) + nh * cap * D + S * D, v.mutable_data() + nh * S * D);
            }
            return py::make_tuple(k, v);
          },
          py::arg("layer"))
      // Fills the cache from per-layer (keys, values) [N, H_kv, S, D] (shapes validated in Python).
      .def(
          "load",
          [](KVCache& c, const std::vector<std::pair<CArray<T>, CArray<T>>>& kv) {
            c.require_idle();
            const int64_t N = c.batch(), H = c.num_kv_heads(), D = c.head_dim();
            const int64_t S = kv.empty() ? 0 : kv[0].first.shape(2);
            c.crop(0);
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
          },
          py::arg("pairs"))
      .def(
          "crop",
          [](KVCache& c, int64_t length) {
            c.require_idle();
            c.crop(length);
          },
          py::arg("length"))
      .def(
          "reserve",
          [](KVCache& c, int64_t total) {
            c.require_idle();
            c.reserve(total);
          },
          py::arg("total"));

  py::class_<Rotary>(m, ("RotaryEmbedding" + sfx).c_str())
      .def(py::init([](int64_t head_dim, int64_t max_positions, double base, const std::string& layout) {
             return std::make_unique<Rotary>(head_dim, max_positions, base, ops::parse_rotary_layout(layout));
           }),
           py::arg("head_dim"), py::arg("max_positions"), py::arg("base"), py::arg("layout"))
      .def_property_readonly("built_positions", &Rotary::built_positions);

  py::class_<MHA, Module<T>>(m, ("MultiheadAttention" + sfx).c_str())
      .def(py::init<int64_t, int64_t, bool, int64_t, int64_t, int64_t, int64_t>(), py::arg("embed_dim"),
           py::arg("num_heads"), py::arg("bias"), py::arg("kdim"), py::arg("vdim"), py::arg("num_kv_heads"),
           py::arg("head_dim"))
      .def_property_readonly("head_dim", &MHA::head_dim)
      .def_property_readonly("packed", &MHA::packed)
      // query [N, L, E], key [N, S, kdim], value [N, S, vdim] -> out [N, L, E] (, weights [N, H, L, S_total],
      // or [N, L, S_total] averaged over the heads). cache (+ layer), rotary (+ position_ids [N, L]):
      // self-attention only (key and value None).
      .def(
          "forward",
          [](const MHA& self, const CArray<T>& query, const py::object& key, const py::object& value,
             const py::object& bool_mask, const py::object& float_mask, const py::object& key_mask, bool is_causal,
             int64_t causal_offset, bool need_weights, bool average_weights, const std::string& path, KVCache* cache,
             int64_t layer, const Rotary* rotary, const py::object& position_ids) -> py::object {
            const bool self_attention = key.is_none();
            CArray<T> k = self_attention ? query : key.cast<CArray<T>>();
            CArray<T> v = self_attention ? query : value.cast<CArray<T>>();
            require_features<T>(query, 3, self.embed_dim(), "query");
            require_features<T>(k, 3, self.kdim(), "key");
            require_features<T>(v, 3, self.vdim(), "value");
            require(k.shape(0) == query.shape(0) && v.shape(0) == query.shape(0) && v.shape(1) == k.shape(1),
                    "key, value: expected (N, S, ·) with query's N and one S");
            const int64_t N = query.shape(0), L = query.shape(1), S = k.shape(1);
            layers::AttentionInputs<T> in;
            in.masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, causal_offset);
            in.path = ops::parse_attention_path(path);
            in.cache = cache;
            in.layer = layer;
            in.rotary = rotary;
            in.positions = optional_data<int64_t>(position_ids);
            typename KVCache::Use use(cache);
            const int64_t S_total = S + (cache != nullptr ? cache->length() : 0);
            if (cache != nullptr)  // the masks were built in Python for the length the cache had then
              for (const py::object* mask : {&bool_mask, &float_mask, &key_mask}) {
                if (mask->is_none()) continue;
                const py::array a = mask->cast<py::array>();
                require(a.shape(a.ndim() - 1) == S_total,
                        "past_key_values: its length changed after the masks were checked (another call on the "
                        "cache; a cache holds one sequence of calls at a time)");
              }
            auto out = new_array<T>({N, L, self.embed_dim()}, "query: the output (N, L, embed_dim)");
            py::array_t<T> weights;
            if (need_weights) {
              weights = average_weights ? new_array<T>({N, L, S_total}, "need_weights: the averaged weights (N, L, S)")
                                        : new_array<T>({N, self.num_heads(), L, S_total},
                                                       "need_weights: the weights (N, num_heads, L, S)");
              in.weights = weights.mutable_data();
              in.average_weights = average_weights;
            }
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward(query.data(), k.data(), v.data(), N, L, S, op, in);
              // the step's last layer advances the length (nn.py calls the layers of a step in order)
              if (cache != nullptr && layer == cache->num_layers() - 1) cache->set_length(cache->length() + L);
            }
            if (need_weights) return py::make_tuple(out, weights);
            return std::move(out);
          },
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("bool_mask"), py::arg("float_mask"),
          py::arg("key_mask"), py::arg("is_causal"), py::arg("causal_offset"), py::arg("need_weights"),
          py::arg("average_weights"), py::arg("path"), py::arg("cache"), py::arg("layer"), py::arg("rotary"),
          py::arg("position_ids"));

  py::class_<layers::TransformerEncoderLayer<T>, Module<T>>(m, ("TransformerEncoderLayer" + sfx).c_str())
      .def(py::init([](int64_t d_model, int64_t nhead, int64_t dff, const std::string& act, double eps, bool norm_first,
                       bool bias) {
             return std::make_unique<layers::TransformerEncoderLayer<T>>(d_model, nhead, dff, ops::parse_activation(act),
                                                                         static_cast<T>(eps), norm_first, bias);
           }),
           py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward"), py::arg("activation"),
           py::arg("layer_norm_eps"), py::arg("norm_first"), py::arg("bias"))
      // src [N, L, E] -> [N, L, E]
      .def(
          "forward",
          [](const layers::TransformerEncoderLayer<T>& self, const CArray<T>& src, const py::object& bool_mask,
             const py::object& float_mask, const py::object& key_mask, bool is_causal, const std::string& path) {
            require_features<T>(src, 3, self.d_model(), "src");
            const int64_t N = src.shape(0), L = src.shape(1);
            const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, 0);
            const auto p = ops::parse_attention_path(path);
            auto out = new_array<T>({N, L, self.d_model()}, "src: the output (N, L, d_model)");
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward(src.data(), N, L, op, masks, p);
            }
            return out;
          },
          py::arg("src"), py::arg("bool_mask"), py::arg("float_mask"), py::arg("key_mask"), py::arg("is_causal"),
          py::arg("path"));

  py::class_<layers::TransformerDecoderLayer<T>, Module<T>>(m, ("TransformerDecoderLayer" + sfx).c_str())
      .def(py::init([](int64_t d_model, int64_t nhead, int64_t dff, const std::string& act, double eps, bool norm_first,
                       bool bias) {
             return std::make_unique<layers::TransformerDecoderLayer<T>>(d_model, nhead, dff, ops::parse_activation(act),
                                                                         static_cast<T>(eps), norm_first, bias);
           }),
           py::arg("d_model"), py::arg("nhead"), py::arg("dim_feedforward"), py::arg("activation"),
           py::arg("layer_norm_eps"), py::arg("norm_first"), py::arg("bias"))
      // tgt [N, T, E], memory [N, S, E] -> [N, T, E]; self_* and cross_* masks as in MultiheadAttention.forward
      .def(
          "forward",
          [](const layers::TransformerDecoderLayer<T>& self, const CArray<T>& tgt, const CArray<T>& memory,
             const py::object& self_bool_mask, const py::object& self_float_mask, const py::object& self_key_mask,
             bool tgt_is_causal, const py::object& cross_bool_mask, const py::object& cross_float_mask,
             const py::object& cross_key_mask, const std::string& path) {
            require_features<T>(tgt, 3, self.d_model(), "tgt");
            require_features<T>(memory, 3, self.d_model(), "memory");
            require(memory.shape(0) == tgt.shape(0), "memory: expected tgt's batch size");
            const int64_t N = tgt.shape(0), Tq = tgt.shape(1), S = memory.shape(1);
            const auto self_masks = make_masks<T>(self_bool_mask, self_float_mask, self_key_mask, tgt_is_causal, 0);
            const auto cross_masks = make_masks<T>(cross_bool_mask, cross_float_mask, cross_key_mask, false, 0);
            const auto p = ops::parse_attention_path(path);
            auto out = new_array<T>({N, Tq, self.d_model()}, "tgt: the output (N, T, d_model)");
            T* op = out.mutable_data();
            {
              ModuleCall call;
              self.forward(tgt.data(), N, Tq, memory.data(), S, op, self_masks, cross_masks, p);
            }
            return out;
          },
          py::arg("tgt"), py::arg("memory"), py::arg("self_bool_mask"), py::arg("self_float_mask"),
          py::arg("self_key_mask"), py::arg("tgt_is_causal"), py::arg("cross_bool_mask"), py::arg("cross_float_mask"),
          py::arg("cross_key_mask"), py::arg("path"));
}

}  // namespace

void register_layers(py::module_& m) {
  py::class_<layers::EmbeddingsConfig>(m, "EmbeddingsConfig")
      .def(py::init<>())
      .def_readwrite("vocab_size", &layers::EmbeddingsConfig::vocab_size)
      .def_readwrite("hidden_size", &layers::EmbeddingsConfig::hidden_size)
      .def_readwrite("max_position_embeddings", &layers::EmbeddingsConfig::max_position_embeddings)
      .def_readwrite("type_vocab_size", &layers::EmbeddingsConfig::type_vocab_size)
      .def_readwrite("layer_norm", &layers::EmbeddingsConfig::layer_norm)
      .def_readwrite("layer_norm_eps", &layers::EmbeddingsConfig::layer_norm_eps);
  register_module_base<float>(m);
  register_module_base<double>(m);
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
