// Encoder and decoder layers: training forward and backward (transformer_layers.hpp has the forwards).
//
// The backward walks the forward's steps in reverse; every residual branch x + f(y) sends its
// gradient both ways (dx += dout, df = dout), every norm's backward reads the norm's saved input:
//   post-LN encoder:  s1 = src + drop1(SA(src)),  x = norm1(s1),  s2 = x + drop2(FFN(x)),  out = norm2(s2)
//   pre-LN encoder:   n1 = norm1(src),  x = src + drop1(SA(n1)),  n2 = norm2(x),  out = x + drop2(FFN(n2))
// (the decoder adds the cross-attention step between the two, see there). The training forward runs
// the forward's ops on the same values (post-LN: the forward's add_norm, and the sum it normalises
// kept beside; x + y into a kept buffer is the forward's in-place add), so without dropout its
// output equals forward's bit for bit.
#include <stdexcept>

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/layers/transformer_layers.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

using kernels::Scratch;

namespace {
// An attention's inputs in a training forward: its masks, and the dropout on its probabilities
// (drop.attn_p, with the seed of `site`).
template <class T>
AttentionInputs<T> train_inputs(const AttentionMasks<T>& masks, AttentionPath path, const Dropout& drop,
                                uint64_t site) {
  AttentionInputs<T> in;
  in.masks = masks;
  in.path = path;
  in.dropout = drop.attn_p;
  in.dropout_seed = drop.site(site);
  return in;
}

template <class T>
T* grad_buffer(Scratch tag, int64_t n) {
  return kernels::workspace<T>(tag, static_cast<size_t>(n));
}

// Dropout sites of a layer: one seed each.
enum Site : uint64_t { kDrop1 = 1, kDrop2 = 2, kDrop3 = 3, kFfn = 4, kSelfAttn = 5, kCrossAttn = 6 };
}  // namespace

// ---- encoder layer ---------------------------------------------------------------------------------

template <class T>
void TransformerEncoderLayer<T>::forward_train(const T* src, int64_t N, int64_t L, T* out,
                                               const AttentionMasks<T>& masks, AttentionPath path,
                                               const Dropout& drop) {
  const int64_t rows = N * L, E = d_model_, n = rows * E;
  Saved& s = saved_;
  s.valid = false;
  s.src = src, s.N = N, s.L = L, s.drop = drop;
  s.b1.resize(static_cast<size_t>(n));
  s.b2.resize(static_cast<size_t>(n));
  s.b3.resize(static_cast<size_t>(n));
  T* tmp = kernels::workspace<T>(Scratch::kLayerB, static_cast<size_t>(n));  // a branch's output
  const AttentionInputs<T> in = train_inputs(masks, path, drop, kSelfAttn);
  if (norm_first_) {
    norm1_.forward(src, rows, s.b1.data());                                       // n1 = norm1(src)
    self_attn_.forward_train(s.b1.data(), s.b1.data(), s.b1.data(), N, L, L, tmp, in);  // SA(n1)
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop1));
    ops::add(src, tmp, n, s.b2.data());                                           // x = src + SA(n1)
    norm2_.forward(s.b2.data(), rows, s.b3.data());                               // n2 = norm2(x)
    ff_.forward_train(s.b3.data(), rows, tmp, drop.ffn_p, drop.site(kFfn));       // FFN(n2)
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop2));
    ops::add(s.b2.data(), tmp, n, out);                                           // out = x + FFN(n2)
  } else {
    self_attn_.forward_train(src, src, src, N, L, L, tmp, in);                    // SA(src)
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop1));
    ops::add(src, tmp, n, s.b1.data());                                           // s1 = src + SA(src)
    norm1_.forward_add(src, tmp, rows, s.b2.data());                              // x = norm1(s1)
    ff_.forward_train(s.b2.data(), rows, tmp, drop.ffn_p, drop.site(kFfn));       // FFN(x)
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop2));
    ops::add(s.b2.data(), tmp, n, s.b3.data());                                   // s2 = x + FFN(x)
    norm2_.forward_add(s.b2.data(), tmp, rows, out);                              // out = norm2(s2)
  }
  s.valid = true;
}

template <class T>
void TransformerEncoderLayer<T>::backward(const T* dout, T* dsrc) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("TransformerEncoderLayer: backward without a training forward");
  s.valid = false;
  const int64_t rows = s.N * s.L, n = rows * d_model_;
  const Dropout& d = s.drop;
  T* A = grad_buffer<T>(Scratch::kGradLayerA, n);
  T* B = grad_buffer<T>(Scratch::kGradLayerB, n);
  T* C = grad_buffer<T>(Scratch::kGradLayerC, n);
  if (norm_first_) {
    ff_.backward(ops::dropout_grad(dout, A, n, d.p, d.site(kDrop2)), B);        // B = d n2
    norm2_.backward(s.b2.data(), B, rows, C);                           // C = d x (through norm2) ...
    ops::add(C, dout, n, C);                                            // ... + the residual's dout
    self_attn_.backward(ops::dropout_grad(C, A, n, d.p, d.site(kDrop1)), B, nullptr, nullptr);  // B = d n1
    norm1_.backward(s.src, B, rows, dsrc);                              // dsrc = d src through norm1 ...
    ops::add(dsrc, C, n, dsrc);                                         // ... + the residual's d x
  } else {
    norm2_.backward(s.b3.data(), dout, rows, A);                        // A = d s2
    ff_.backward(ops::dropout_grad(A, B, n, d.p, d.site(kDrop2)), C);           // C = d x through FFN ...
    ops::add(C, A, n, C);                                               // ... + the residual's d s2
    norm1_.backward(s.b1.data(), C, rows, A);                           // A = d s1
    self_attn_.backward(ops::dropout_grad(A, B, n, d.p, d.site(kDrop1)), dsrc, nullptr, nullptr);  // d src via SA
    ops::add(dsrc, A, n, dsrc);                                         // + the residual's d s1
  }
}

template <class T>
void TransformerEncoderLayer<T>::release_activations() {
  saved_ = Saved{};
  self_attn_.release_activations();
  ff_.release_activations();
}

// ---- decoder layer ---------------------------------------------------------------------------------
//   post-LN: s1 = tgt + drop1(SA(tgt)), x1 = norm1(s1), s2 = x1 + drop2(CA(x1, mem)), x2 = norm2(s2),
//            s3 = x2 + drop3(FFN(x2)), out = norm3(s3)
//   pre-LN:  n1 = norm1(tgt), x1 = tgt + drop1(SA(n1)), n2 = norm2(x1), x2 = x1 + drop2(CA(n2, mem)),
//            n3 = norm3(x2), out = x2 + drop3(FFN(n3))

template <class T>
void TransformerDecoderLayer<T>::forward_train(const T* tgt, int64_t N, int64_t Tq, const T* memory, int64_t S,
                                               T* out, const AttentionMasks<T>& self_masks,
                                               const AttentionMasks<T>& cross_masks, AttentionPath path,
                                               const Dropout& drop) {
  const int64_t rows = N * Tq, E = d_model_, n = rows * E;
  Saved& s = saved_;
  s.valid = false;
  s.tgt = tgt, s.memory = memory, s.N = N, s.T_ = Tq, s.S = S, s.drop = drop;
  for (auto* b : {&s.b1, &s.b2, &s.b3, &s.b4, &s.b5}) b->resize(static_cast<size_t>(n));
  T *b1 = s.b1.data(), *b2 = s.b2.data(), *b3 = s.b3.data(), *b4 = s.b4.data(), *b5 = s.b5.data();
  T* tmp = kernels::workspace<T>(Scratch::kLayerB, static_cast<size_t>(n));
  const AttentionInputs<T> self_in = train_inputs(self_masks, path, drop, kSelfAttn),
                           cross_in = train_inputs(cross_masks, path, drop, kCrossAttn);
  if (norm_first_) {
    norm1_.forward(tgt, rows, b1);                                        // n1
    self_attn_.forward_train(b1, b1, b1, N, Tq, Tq, tmp, self_in);
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop1));
    ops::add(tgt, tmp, n, b2);                                            // x1 = tgt + SA(n1)
    norm2_.forward(b2, rows, b3);                                         // n2
    cross_attn_.forward_train(b3, memory, memory, N, Tq, S, tmp, cross_in);
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop2));
    ops::add(b2, tmp, n, b4);                                             // x2 = x1 + CA(n2, mem)
    norm3_.forward(b4, rows, b5);                                         // n3
    ff_.forward_train(b5, rows, tmp, drop.ffn_p, drop.site(kFfn));
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop3));
    ops::add(b4, tmp, n, out);                                            // out = x2 + FFN(n3)
  } else {
    self_attn_.forward_train(tgt, tgt, tgt, N, Tq, Tq, tmp, self_in);
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop1));
    ops::add(tgt, tmp, n, b1);                                            // s1 = tgt + SA(tgt)
    norm1_.forward_add(tgt, tmp, rows, b2);                               // x1 = norm1(s1)
    cross_attn_.forward_train(b2, memory, memory, N, Tq, S, tmp, cross_in);
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop2));
    ops::add(b2, tmp, n, b3);                                             // s2 = x1 + CA(x1, mem)
    norm2_.forward_add(b2, tmp, rows, b4);                                // x2 = norm2(s2)
    ff_.forward_train(b4, rows, tmp, drop.ffn_p, drop.site(kFfn));
    ops::dropout_inplace(tmp, n, drop.p, drop.site(kDrop3));
    ops::add(b4, tmp, n, b5);                                             // s3 = x2 + FFN(x2)
    norm3_.forward_add(b4, tmp, rows, out);                               // out = norm3(s3)
  }
  s.valid = true;
}

template <class T>
void TransformerDecoderLayer<T>::backward(const T* dout, T* dtgt, T* dmemory) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("TransformerDecoderLayer: backward without a training forward");
  s.valid = false;
  const int64_t rows = s.N * s.T_, n = rows * d_model_;
  const Dropout& d = s.drop;
  T* A = grad_buffer<T>(Scratch::kGradLayerA, n);
  T* B = grad_buffer<T>(Scratch::kGradLayerB, n);
  T* C = grad_buffer<T>(Scratch::kGradLayerC, n);
  if (norm_first_) {
    ff_.backward(ops::dropout_grad(dout, A, n, d.p, d.site(kDrop3)), B);          // B = d n3
    norm3_.backward(s.b4.data(), B, rows, C);
    ops::add(C, dout, n, C);                                              // C = d x2
    cross_attn_.backward(ops::dropout_grad(C, A, n, d.p, d.site(kDrop2)), B, dmemory, dmemory);  // B = d n2
    norm2_.backward(s.b2.data(), B, rows, A);
    ops::add(C, A, n, C);                                                 // C = d x1
    self_attn_.backward(ops::dropout_grad(C, A, n, d.p, d.site(kDrop1)), B, nullptr, nullptr);   // B = d n1
    norm1_.backward(s.tgt, B, rows, dtgt);
    ops::add(dtgt, C, n, dtgt);                                           // d tgt
  } else {
    norm3_.backward(s.b5.data(), dout, rows, A);                          // A = d s3
    ff_.backward(ops::dropout_grad(A, B, n, d.p, d.site(kDrop3)), C);
    ops::add(C, A, n, C);                                                 // C = d x2
    norm2_.backward(s.b3.data(), C, rows, A);                             // A = d s2
    cross_attn_.backward(ops::dropout_grad(A, B, n, d.p, d.site(kDrop2)), C, dmemory, dmemory);
    ops::add(C, A, n, C);                                                 // C = d x1
    norm1_.backward(s.b1.data(), C, rows, A);                             // A = d s1
    self_attn_.backward(ops::dropout_grad(A, B, n, d.p, d.site(kDrop1)), dtgt, nullptr, nullptr);
    ops::add(dtgt, A, n, dtgt);                                           // d tgt
  }
}

template <class T>
void TransformerDecoderLayer<T>::release_activations() {
  saved_ = Saved{};
  self_attn_.release_activations();
  cross_attn_.release_activations();
  ff_.release_activations();
}

#define TC_INSTANTIATE(T)                                                                                      \
  template void TransformerEncoderLayer<T>::forward_train(const T*, int64_t, int64_t, T*, const AttentionMasks<T>&, \
                                                          AttentionPath, const Dropout&);                      \
  template void TransformerEncoderLayer<T>::backward(const T*, T*);                                            \
  template void TransformerEncoderLayer<T>::release_activations();                                             \
  template void TransformerDecoderLayer<T>::forward_train(const T*, int64_t, int64_t, const T*, int64_t, T*,     \
                                                          const AttentionMasks<T>&, const AttentionMasks<T>&,   \
                                                          AttentionPath, const Dropout&);                      \
  template void TransformerDecoderLayer<T>::backward(const T*, T*, T*);                                        \
  template void TransformerDecoderLayer<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::layers
