// Bindings of the training ops (ops/backward.hpp): numpy in, numpy out, the GIL released around
// compute. The Python layer (backward.py, functional_training.py) has validated shapes and dtypes
// and made the inputs contiguous; buffers that gradients are accumulated into are checked here too
// (dtype, shape, C-contiguous, writeable), since an in-place update of a silent copy would be lost.
#include "common.hpp"
#include "transformer_core/ops/activation.hpp"
#include "transformer_core/ops/attention.hpp"
#include "transformer_core/ops/backward.hpp"

namespace transformer_core::bindings {

namespace {

// A buffer to accumulate into, in place: None → nullptr; otherwise an array of T of exactly `shape`,
// C-contiguous and writeable.
template <class T>
T* inout_buffer(const py::object& o, const std::vector<int64_t>& shape, const std::string& name) {
  if (o.is_none()) return nullptr;
  require(py::isinstance<py::array>(o), name + ": expected a numpy array");
  py::array a = o.cast<py::array>();
  require(has_dtype<T>(a), name + ": expected dtype " + std::string(py::str(py::dtype::of<T>())) +
                                                ", got " + std::string(py::str(a.dtype())));
  require(a.flags() & py::array::c_style, name + ": expected a C-contiguous array");
  require(a.writeable(), name + ": expected a writeable array");
  bool same = static_cast<size_t>(a.ndim()) == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) same = a.shape(static_cast<py::ssize_t>(i)) == shape[i];
  require(same, name + ": wrong shape");
  return static_cast<T*>(a.mutable_data());
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  // x [rows, in], weight [out, in] (or [in, out] with w_in_out), grad_output [rows, out]
  // -> (grad_x [rows, in] or None, grad_weight, grad_bias [out] or None)
  m.def(("linear_backward" + sfx).c_str(),
        [](const CArray<T>& x, const CArray<T>& weight, const CArray<T>& grad_output, bool need_grad_input,
           bool bias, const py::object& grad_weight, const py::object& grad_bias, bool w_in_out) {
          require(x.ndim() == 2 && weight.ndim() == 2 && grad_output.ndim() == 2,
                  "linear_backward: x, weight and grad_output must be 2-D");
          const int64_t rows = x.shape(0), in = x.shape(1), out = grad_output.shape(1);
          const std::vector<int64_t> wshape = w_in_out ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in};
          require(grad_output.shape(0) == rows && weight.shape(0) == wshape[0] && weight.shape(1) == wshape[1],
                  "linear_backward: inconsistent shapes of x, weight and grad_output");
          // Accumulate when the caller hands over a buffer; a missing partner buffer starts at zeros.
          const bool accumulate = !grad_weight.is_none() || (bias && !grad_bias.is_none());
          py::object gw = grad_weight, gb = grad_bias;
          if (gw.is_none()) gw = py::array_t<T>(wshape);
          if (bias && gb.is_none()) gb = py::array_t<T>(std::vector<int64_t>{out});
          T* dw = inout_buffer<T>(gw, wshape, "grad_weight");
          T* db = bias ? inout_buffer<T>(gb, {out}, "grad_bias") : nullptr;
          if (accumulate && grad_weight.is_none()) std::fill(dw, dw + out * in, T(0));
          if (accumulate && bias && grad_bias.is_none()) std::fill(db, db + out, T(0));
          py::object gx = py::none();
          T* dx = nullptr;
          if (need_grad_input) {
            py::array_t<T> a({rows, in});
            dx = a.mutable_data();
            gx = a;
          }
          {
            CoreCall release;
            ops::linear_backward(x.data(), grad_output.data(), weight.data(), rows, in, out, dx, dw, db, accumulate,
                                 w_in_out);
          }
          return py::make_tuple(gx, gw, bias ? gb : py::none());
        },
        py::arg("x"), py::arg("weight"), py::arg("grad_output"), py::arg("need_grad_input"), py::arg("bias"),
        py::arg("grad_weight"), py::arg("grad_bias"), py::arg("w_in_out"));

  // x, grad_output [rows, n], weight [n] or None -> (grad_x, grad_weight or None, grad_bias or None)
  m.def(("layer_norm_backward" + sfx).c_str(),
        [](const CArray<T>& x, const py::object& weight, const CArray<T>& grad_output, double eps, bool bias,
           const py::object& grad_weight, const py::object& grad_bias) {
          const int64_t rows = x.shape(0), n = x.shape(1);
          const T* w = optional_data<T>(weight);
          const bool affine = w != nullptr;
          const bool accumulate = !grad_weight.is_none() || !grad_bias.is_none();
          py::object gw = affine ? (grad_weight.is_none() ? py::object(py::array_t<T>(n)) : grad_weight) : py::none();
          py::object gb = affine && bias ? (grad_bias.is_none() ? py::object(py::array_t<T>(n)) : grad_bias) : py::none();
          T* dw = inout_buffer<T>(gw, {n}, "grad_weight");
          T* db = inout_buffer<T>(gb, {n}, "grad_bias");
          if (accumulate && dw != nullptr && grad_weight.is_none()) std::fill(dw, dw + n, T(0));
          if (accumulate && db != nullptr && grad_bias.is_none()) std::fill(db, db + n, T(0));
          py::array_t<T> gx({rows, n});
          T* dx = gx.mutable_data();
          {
            CoreCall release;
            ops::layer_norm_backward(x.data(), grad_output.data(), w, rows, n, eps, dx, dw, db, accumulate);
          }
          return py::make_tuple(gx, gw, gb);
        },
        py::arg("x"), py::arg("weight"), py::arg("grad_output"), py::arg("eps"), py::arg("bias"),
        py::arg("grad_weight"), py::arg("grad_bias"));

  // x, grad_output [rows, n], weight [n] or None -> (grad_x, grad_weight or None)
  m.def(("rms_norm_backward" + sfx).c_str(),
        [](const CArray<T>& x, const py::object& weight, const CArray<T>& grad_output, double eps,
           const py::object& grad_weight) {
          const int64_t rows = x.shape(0), n = x.shape(1);
          const T* w = optional_data<T>(weight);
          const bool accumulate = !grad_weight.is_none();
          py::object gw = w != nullptr ? (accumulate ? grad_weight : py::object(py::array_t<T>(n))) : py::none();
          T* dw = inout_buffer<T>(gw, {n}, "grad_weight");
          py::array_t<T> gx({rows, n});
          T* dx = gx.mutable_data();
          {
            CoreCall release;
            ops::rms_norm_backward(x.data(), grad_output.data(), w, rows, n, eps, dx, dw, accumulate);
          }
          return py::make_tuple(gx, gw);
        },
        py::arg("x"), py::arg("weight"), py::arg("grad_output"), py::arg("eps"), py::arg("grad_weight"));

  // x, grad_output (same shape) -> grad_x
  m.def(("activation_backward" + sfx).c_str(),
        [](const CArray<T>& x, const CArray<T>& grad_output, const std::string& activation) {
          const auto act = ops::parse_activation(activation);
          require(x.size() == grad_output.size(), "activation_backward: x and grad_output differ in size");
          py::array_t<T> dx(x.request().shape);
          T* dxp = dx.mutable_data();
          {
            CoreCall release;
            ops::activation_backward(x.data(), grad_output.data(), static_cast<int64_t>(x.size()), act, dxp);
          }
          return dx;
        },
        py::arg("x"), py::arg("grad_output"), py::arg("activation"));

  // gate, up, grad_output (same shape) -> (grad_gate, grad_up)
  m.def(("glu_backward" + sfx).c_str(),
        [](const CArray<T>& gate, const CArray<T>& up, const CArray<T>& grad_output, const std::string& activation) {
          const auto act = ops::parse_activation(activation);
          require(gate.size() == up.size() && gate.size() == grad_output.size(),
                  "glu_backward: gate, up and grad_output differ in size");
          py::array_t<T> dg(gate.request().shape), du(gate.request().shape);
          T* dgp = dg.mutable_data();
          T* dup = du.mutable_data();
          {
            CoreCall release;
            ops::glu_backward(gate.data(), up.data(), grad_output.data(), static_cast<int64_t>(gate.size()), act, dgp,
                              dup);
          }
          return py::make_tuple(dg, du);
        },
        py::arg("gate"), py::arg("up"), py::arg("grad_output"), py::arg("activation"));

  // output, grad_output [rows, n] -> grad_input [rows, n]
  m.def(("softmax_backward" + sfx).c_str(),
        [](const CArray<T>& output, const CArray<T>& grad_output) {
          require(output.ndim() == 2 && grad_output.ndim() == 2 && output.shape(0) == grad_output.shape(0) &&
                      output.shape(1) == grad_output.shape(1),
                  "softmax_backward: output and grad_output must be 2-D of the same shape");
          py::array_t<T> dx({output.shape(0), output.shape(1)});
          T* dxp = dx.mutable_data();
          {
            CoreCall release;
            ops::softmax_backward(output.data(), grad_output.data(), output.shape(0), output.shape(1), dxp);
          }
          return dx;
        },
        py::arg("output"), py::arg("grad_output"));

  // ids [rows] int64, grad_output [rows, H] -> grad_weight [num_embeddings, H] (or added into grad_weight)
  m.def(("embedding_backward" + sfx).c_str(),
        [](const CArray<int64_t>& ids, const CArray<T>& grad_output, int64_t num_embeddings, int64_t padding_idx,
           const py::object& grad_weight) -> py::object {
          require(grad_output.ndim() == 2 && ids.ndim() == 1 && ids.shape(0) == grad_output.shape(0),
                  "embedding_backward: expected ids [rows] and grad_output [rows, H]");
          require(num_embeddings >= 0, "embedding_backward: num_embeddings must be >= 0");
          const int64_t rows = ids.shape(0), H = grad_output.shape(1);
          const bool accumulate = !grad_weight.is_none();
          py::object gw = accumulate ? grad_weight
                                    : py::object(new_array<T>({num_embeddings, H},
                                                              "num_embeddings: grad_weight (num_embeddings, H)"));
          T* dw = inout_buffer<T>(gw, {num_embeddings, H}, "grad_weight");
          {
            CoreCall release;
            ops::embedding_backward(ids.data(), grad_output.data(), rows, num_embeddings, H, padding_idx, dw,
                                    accumulate);
          }
          return gw;
        },
        py::arg("ids"), py::arg("grad_output"), py::arg("num_embeddings"), py::arg("padding_idx"),
        py::arg("grad_weight"));

  // grad_output [..., D], cos/sin [table_rows, W] -> grad_input, same shape (see apply_rotary)
  m.def(("rotary_backward" + sfx).c_str(),
        [](const CArray<T>& grad_output, const CArray<T>& cos, const CArray<T>& sin, const std::string& layout_name) {
          const auto layout = ops::parse_rotary_layout(layout_name);
          require(grad_output.ndim() >= 1, "rotary_backward: grad_output must have at least one dim");
          const int64_t D = grad_output.shape(grad_output.ndim() - 1);
          require(D >= 2 && D % 2 == 0, "rotary_backward: head_dim must be even and >= 2, got " + std::to_string(D));
          const int64_t W = layout == ops::RotaryLayout::kHalf ? D : D / 2;
          require(cos.ndim() == 2 && sin.ndim() == 2 && cos.shape(1) == W && sin.shape(1) == W &&
                      sin.shape(0) == cos.shape(0),
                  "rotary_backward: cos and sin must both be [table_rows, " + std::to_string(W) + "]");
          const int64_t rows = static_cast<int64_t>(grad_output.size()) / D;
          py::array_t<T> dx(grad_output.request().shape);
          std::copy(grad_output.data(), grad_output.data() + grad_output.size(), dx.mutable_data());
          T* dxp = dx.mutable_data();
          const int64_t table_rows = cos.shape(0);
          {
            CoreCall release;
            ops::rotary_backward(dxp, rows, D, cos.data(), sin.data(), table_rows, layout);
          }
          return dx;
        },
        py::arg("grad_output"), py::arg("cos"), py::arg("sin"), py::arg("layout"));

  // x (any shape) -> dropout(x), same shape; the backward is the same call on grad_output
  m.def(("dropout" + sfx).c_str(),
        [](const CArray<T>& x, double p, uint64_t seed) {
          py::array_t<T> y(x.request().shape);
          T* yp = y.mutable_data();
          {
            CoreCall release;
            ops::dropout(x.data(), yp, static_cast<int64_t>(x.size()), p, seed);
          }
          return y;
        },
        py::arg("x"), py::arg("p"), py::arg("seed"));

  // logits [rows, V], target [rows] int64
  // -> (loss: float (mean / sum) or [rows] array (none), num_valid, grad_logits [rows, V] or None)
  m.def(("cross_entropy" + sfx).c_str(),
        [](const CArray<T>& logits, const CArray<int64_t>& target, int64_t ignore_index, double label_smoothing,
           const std::string& reduction_name, double grad_scale, const py::object& grad_rows, bool compute_grad) {
          const auto reduction = ops::parse_reduction(reduction_name);
          require(logits.ndim() == 2 && target.ndim() == 1 && target.shape(0) == logits.shape(0),
                  "cross_entropy: expected logits [rows, V] and target [rows]");
          const int64_t rows = logits.shape(0), V = logits.shape(1);
          const T* gr = nullptr;
          if (!grad_rows.is_none()) {
            gr = optional_data<T>(grad_rows);  // the caller's own array: no temporary to outlive
            const auto g = grad_rows.cast<py::array>();
            require(g.ndim() == 1 && g.shape(0) == rows, "cross_entropy: grad_output must be [rows]");
          }
          py::object loss_rows = py::none();
          T* lr = nullptr;
          if (reduction == ops::Reduction::kNone) {
            py::array_t<T> a(rows);
            lr = a.mutable_data();
            loss_rows = a;
          }
          py::object grad = py::none();
          T* dx = nullptr;
          if (compute_grad) {
            py::array_t<T> a({rows, V});
            dx = a.mutable_data();
            grad = a;
          }
          double loss = 0;
          int64_t valid = 0;
          {
            CoreCall release;
            loss = ops::cross_entropy(logits.data(), target.data(), rows, V, ignore_index, label_smoothing, reduction,
                                      grad_scale, gr, lr, dx, &valid);
          }
          py::object l = reduction == ops::Reduction::kNone ? loss_rows : py::object(py::float_(loss));
          return py::make_tuple(l, valid, grad);
        },
        py::arg("logits"), py::arg("target"), py::arg("ignore_index"), py::arg("label_smoothing"),
        py::arg("reduction"), py::arg("grad_scale"), py::arg("grad_rows"), py::arg("compute_grad"));

  // query [N, H, L, D], key [N, H_kv, S, D], value [N, H_kv, S, Dv], out, grad_out [N, H, L, Dv],
  // lse [N, H, L] (all with a contiguous last dim; lse contiguous) -> (grad_query, grad_key, grad_value)
  m.def(("scaled_dot_product_attention_backward" + sfx).c_str(),
        [](const py::array& query, const py::array& key, const py::array& value, const py::array& out,
           const py::array& grad_out, const CArray<T>& lse, const py::object& bool_mask, const py::object& float_mask,
           const py::object& key_mask, bool is_causal, int64_t causal_offset, double scale, double dropout_p,
           uint64_t seed) {
          const auto q = view4<T>(query, "query"), k = view4<T>(key, "key"), v = view4<T>(value, "value");
          const auto o = view4<T>(out, "out"), d = view4<T>(grad_out, "grad_out");
          const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, causal_offset);
          const int64_t N = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
          const int64_t Hkv = k.shape[1], S = k.shape[2], Dv = v.shape[3];
          require(k.shape[0] == N && v.shape[0] == N && v.shape[1] == Hkv && v.shape[2] == S && k.shape[3] == D,
                  "scaled_dot_product_attention_backward: inconsistent query/key/value shapes");
          for (const auto* t : {&o, &d})
            require(t->shape[0] == N && t->shape[1] == H && t->shape[2] == L && t->shape[3] == Dv,
                    "scaled_dot_product_attention_backward: out and grad_out must be [N, H, L, Dv]");
          require(lse.ndim() == 3 && lse.shape(0) == N && lse.shape(1) == H && lse.shape(2) == L,
                  "scaled_dot_product_attention_backward: lse must be [N, H, L]");
          py::array_t<T> dq({N, H, L, D}), dk({N, Hkv, S, D}), dv({N, Hkv, S, Dv});
          kernels::AttentionBackwardArgs<T> b;
          auto& a = b.fwd;
          a.q = q.data;
          a.q_stride_n = q.stride[0], a.q_stride_h = q.stride[1], a.q_stride_l = q.stride[2];
          a.k = k.data;
          a.k_stride_n = k.stride[0], a.k_stride_h = k.stride[1], a.k_stride_s = k.stride[2];
          a.v = v.data;
          a.v_stride_n = v.stride[0], a.v_stride_h = v.stride[1], a.v_stride_s = v.stride[2];
          a.out = const_cast<T*>(o.data);  // read only
          a.o_stride_n = o.stride[0], a.o_stride_h = o.stride[1], a.o_stride_l = o.stride[2];
          a.batch = N, a.num_heads = H, a.num_kv_heads = Hkv, a.q_len = L, a.kv_len = S;
          a.head_dim = D, a.v_head_dim = Dv;
          a.scale = static_cast<T>(scale);
          static_cast<kernels::AttentionMasks<T>&>(a) = masks;
          ops::set_attention_dropout(a, dropout_p, seed);
          b.dout = d.data;
          b.do_stride_n = d.stride[0], b.do_stride_h = d.stride[1], b.do_stride_l = d.stride[2];
          b.lse = lse.data();
          b.dq = dq.mutable_data();
          b.dq_stride_n = H * L * D, b.dq_stride_h = L * D, b.dq_stride_l = D;
          b.dk = dk.mutable_data();
          b.dk_stride_n = Hkv * S * D, b.dk_stride_h = S * D, b.dk_stride_s = D;
          b.dv = dv.mutable_data();
          b.dv_stride_n = Hkv * S * Dv, b.dv_stride_h = S * Dv, b.dv_stride_s = Dv;
          {
            CoreCall release;
            ops::scaled_dot_product_attention_backward(b);
          }
          return py::make_tuple(dq, dk, dv);
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("grad_out"), py::arg("lse"),
        py::arg("bool_mask"), py::arg("float_mask"), py::arg("key_mask"), py::arg("is_causal"),
        py::arg("causal_offset"), py::arg("scale"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0);
}

}  // namespace

void register_backward(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
