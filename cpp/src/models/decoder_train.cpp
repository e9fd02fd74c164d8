// The decoder stack's training: forward keeping the activations, the LM head fused with the
// next-token cross-entropy, and the backward pass (llm.c's gpt2_forward / gpt2_backward; nanoGPT's
// model.py for the structure).
//
//   x_0 = drop(wte[ids] (+ wpe[pos]))            x_{i+1} = block_i(x_i)          hidden = final_norm(x_n)
//   loss = mean over counted rows r of  CE(hidden_r · Wᵀ, target_r)   (W: lm_head, or wte when tied)
//
// The head and the loss are fused, a chunk of rows at a time (llm.c's fused classifier): logits
// [chunk, V] = rows · Wᵀ, then cross-entropy's forward and backward in one pass over them, in place
// (dlogits = softmax - onehot, scaled by 1 / #counted), then d rows = dlogits · W and dW (+)= dlogitsᵀ
// · rows. The whole [N·L, V] logits never exist, and rows whose target is ignored get no logits.
//
// The loss touches no gradient (the module's contract: only backward adds). The head's dW [V, E] is
// staged in the training state (head_stage, kept allocated across steps) and added into the head's
// gradient by backward(); a new loss, a non-finite one or release_activations drops it. Staging dW
// rather than dlogits keeps V·E values, not count·V (count > E in any real batch), and no GEMM is
// redone in backward.
#include <cmath>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/models/decoder.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/checks.hpp"
#include "transformer_core/ops/embedding.hpp"
#include "transformer_core/ops/linear.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::models {

using kernels::Scratch;
using ops::to_string;

namespace {
// Logits of one chunk of the fused head: at most this many values (128 MiB of float).
constexpr int64_t kHeadChunkValues = int64_t(1) << 25;

enum Site : uint64_t { kDropAttn = 1, kDropMlp = 2, kDropEmbed = 3, kDropProbs = 4 };
}  // namespace

// ---- block -------------------------------------------------------------------------------------------

template <class T>
void DecoderBlock<T>::forward_train(const T* x, T* y, int64_t N, int64_t L, const layers::AttentionInputs<T>& in,
                                    const layers::Dropout& drop) {
  const int64_t rows = N * L, n = rows * attn_norm_->size();
  Saved& s = saved_;
  s.valid = false;
  s.x = x, s.rows = rows, s.drop = drop;
  for (auto* b : {&s.a, &s.h, &s.m}) b->resize(static_cast<size_t>(n));
  T* tmp = kernels::workspace<T>(Scratch::kLayerB, static_cast<size_t>(n));
  attn_norm_->forward(x, rows, s.a.data());                                    // a = attn_norm(x)
  layers::AttentionInputs<T> attn_in = in;  // + the dropout on its probabilities
  attn_in.dropout = drop.attn_p, attn_in.dropout_seed = drop.site(kDropProbs);
  attn_.forward_train(s.a.data(), s.a.data(), s.a.data(), N, L, L, tmp, attn_in);  // attn(a)
  ops::dropout_inplace(tmp, n, drop.p, drop.site(kDropAttn));
  ops::add(x, tmp, n, s.h.data());                                             // h = x + attn(a)
  mlp_norm_->forward(s.h.data(), rows, s.m.data());                            // m = mlp_norm(h)
  mlp_->forward_train(s.m.data(), rows, tmp);                                  // mlp(m)
  ops::dropout_inplace(tmp, n, drop.p, drop.site(kDropMlp));
  ops::add(s.h.data(), tmp, n, y);                                             // y = h + mlp(m)
  s.valid = true;
}

template <class T>
void DecoderBlock<T>::backward(const T* dy, T* dx) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("DecoderBlock: backward without a training forward");
  s.valid = false;
  const int64_t rows = s.rows, n = rows * attn_norm_->size();
  const layers::Dropout& d = s.drop;
  T* A = kernels::workspace<T>(Scratch::kGradLayerA, static_cast<size_t>(n));
  T* B = kernels::workspace<T>(Scratch::kGradLayerB, static_cast<size_t>(n));
  T* C = kernels::workspace<T>(Scratch::kGradLayerC, static_cast<size_t>(n));
  mlp_->backward(ops::dropout_grad(dy, A, n, d.p, d.site(kDropMlp)), B);     // B = d m
  mlp_norm_->backward(s.h.data(), B, rows, C);
  ops::add(C, dy, n, C);                                              // C = d h
  attn_.backward(ops::dropout_grad(C, A, n, d.p, d.site(kDropAttn)), B, nullptr, nullptr);  // B = d a
  attn_norm_->backward(s.x, B, rows, dx);
  ops::add(dx, C, n, dx);                                             // d x
}

template <class T>
void DecoderBlock<T>::release_activations() {
  saved_ = Saved{};
  attn_.release_activations();
  mlp_->release_activations();
}

// ---- model -------------------------------------------------------------------------------------------

template <class T>
layers::Module<T>& DecoderModel<T>::head_owner() {
  if (lm_head_ != nullptr) return *lm_head_;
  return embed_tokens_;
}

template <class T>
const T* DecoderModel<T>::head_weight() const {
  return lm_head_ != nullptr ? lm_head_->weight() : embed_tokens_.weight();
}

template <class T>
std::vector<int64_t> DecoderModel<T>::check_targets(const int64_t* targets, int64_t rows, int64_t ignore_index) const {
  const int64_t V = config_.vocab_size;
  std::vector<int64_t> counted;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= V)
      throw std::invalid_argument("labels: expected values in [0, " + to_string(V) + ") or ignore_index (" +
                                  to_string(ignore_index) + "), got " + to_string(t) + " at flat position " +
                                  to_string(r));
    counted.push_back(r);
  }
  return counted;
}

template <class T>
double DecoderModel<T>::head_loss(const T* hidden, const int64_t* targets, int64_t rows, int64_t ignore_index,
                                  const std::vector<int64_t>& counted, double grad_scale, T* dhidden,
                                  T* dweight) const {
  const int64_t V = config_.vocab_size, E = config_.hidden_size;
  const int64_t count = static_cast<int64_t>(counted.size());
  if (dhidden != nullptr) std::fill(dhidden, dhidden + rows * E, T(0));
  if (count == 0) return 0.0;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(count, kHeadChunkValues / V));
  T* rows_buf = kernels::workspace<T>(Scratch::kHeadRows, static_cast<size_t>(chunk * E));    // [chunk, E]
  T* chunk_logits = kernels::workspace<T>(Scratch::kHeadLogits, static_cast<size_t>(chunk * V));  // [chunk, V]
  T* drows = dhidden != nullptr ? kernels::workspace<T>(Scratch::kHeadGradRows, static_cast<size_t>(chunk * E))
                                : nullptr;
  std::vector<int64_t> chunk_targets(static_cast<size_t>(chunk));
  // Without a gradient the logits are forward's (logits(): the fp32 head, its int8 copy or its GGUF
  // blocks); a gradient needs the fp32 head (train() refuses quantized weights).
  const T* W = head_weight();  // [V, E], nullptr while the head is quantized
  if (dhidden != nullptr && W == nullptr)
    throw std::invalid_argument("loss: the LM head is quantized; only float weights train");
  double total = 0;
  for (int64_t c0 = 0; c0 < count; c0 += chunk) {
    const int64_t c = std::min(chunk, count - c0);
    for (int64_t t = 0; t < c; ++t) {  // gather the counted rows
      const int64_t r = counted[static_cast<size_t>(c0 + t)];
      std::copy(hidden + r * E, hidden + (r + 1) * E, rows_buf + t * E);
      chunk_targets[static_cast<size_t>(t)] = targets[r];
    }
    if (dhidden == nullptr)
      logits(rows_buf, c, chunk_logits);
    else
      ops::linear(rows_buf, c, E, W, static_cast<const T*>(nullptr), V, chunk_logits);  // logits = rows · Wᵀ
    // loss of the chunk; with a gradient, dlogits (× grad_scale) replaces the logits in place
    total += ops::cross_entropy(chunk_logits, chunk_targets.data(), c, V, ignore_index, 0.0, ops::Reduction::kSum,
                                grad_scale, static_cast<const T*>(nullptr), static_cast<T*>(nullptr),
                                dhidden != nullptr ? chunk_logits : nullptr, nullptr);
    if (dhidden == nullptr) continue;
    if (!std::isfinite(total)) break;  // nothing more to learn: the caller drops dweight
    // d rows = dlogits · W,   dW = dlogitsᵀ · rows (the first chunk), then dW += dlogitsᵀ · rows
    ops::linear_backward(rows_buf, chunk_logits, W, c, E, V, drows, dweight, static_cast<T*>(nullptr), c0 > 0, false);
    for (int64_t t = 0; t < c; ++t) {
      const int64_t r = counted[static_cast<size_t>(c0 + t)];
      std::copy(drows + t * E, drows + (t + 1) * E, dhidden + r * E);
    }
  }
  return total;
}

template <class T>
LossResult DecoderModel<T>::loss(const int64_t* input_ids, const int64_t* targets, int64_t N, int64_t L,
                                 const int64_t* positions, const uint8_t* attention_mask, int64_t ignore_index) const {
  const int64_t rows = N * L;
  const std::vector<int64_t> counted = check_targets(targets, rows, ignore_index);
  layers::KVCache<T> cache(config_.num_layers, N, config_.num_kv_heads > 0 ? config_.num_kv_heads : config_.num_heads,
                           head_dim(), std::max<int64_t>(L, 1));
  std::vector<T> hidden(static_cast<size_t>(ops::checked_product({rows, config_.hidden_size}, "input_ids")));
  forward(input_ids, N, L, positions, attention_mask, cache, hidden.data());
  LossResult r;
  r.num_tokens = static_cast<int64_t>(counted.size());
  const double total = head_loss(hidden.data(), targets, rows, ignore_index, counted, 1.0, nullptr, nullptr);
  r.loss = r.num_tokens > 0 ? total / static_cast<double>(r.num_tokens) : 0.0;
  r.finite = std::isfinite(r.loss);
  return r;
}

template <class T>
LossResult DecoderModel<T>::loss_train(const int64_t* input_ids, const int64_t* targets, int64_t N, int64_t L,
                                       const int64_t* positions, const uint8_t* attention_mask, int64_t ignore_index,
                                       const layers::Dropout& drop) {
  const int64_t rows = N * L, E = config_.hidden_size, V = config_.vocab_size, P = config_.max_positions;
  const int64_t n = ops::checked_product({rows, E}, "input_ids");
  TrainState& s = train_;
  s.valid = false;
  if (L > P)
    throw std::invalid_argument("input_ids: length " + to_string(L) + " exceeds the context (max_position_embeddings = " +
                                to_string(P) + ")");
  embed_tokens_.check(input_ids, rows, "input_ids");
  const std::vector<int64_t> counted = check_targets(targets, rows, ignore_index);
  s.N = N, s.L = L, s.drop = drop;
  s.ids.assign(input_ids, input_ids + rows);
  s.positions.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) s.positions[static_cast<size_t>(r)] = positions != nullptr ? positions[r] : r % L;
  ops::check_ids(s.positions.data(), rows, P, "position_ids");
  if (attention_mask != nullptr) s.mask.assign(attention_mask, attention_mask + rows);
  else s.mask.clear();
  s.stream.resize(static_cast<size_t>(config_.num_layers + 1));
  for (auto& x : s.stream) x.resize(static_cast<size_t>(n));

  T* x0 = s.stream[0].data();
  embed_tokens_.forward(s.ids.data(), rows, x0);                                            // wte[ids]
  if (embed_positions_ != nullptr) embed_positions_->forward_add(s.positions.data(), rows, x0);  // + wpe[pos]
  ops::dropout_inplace(x0, n, drop.embed_p, drop.site(kDropEmbed));
  layers::AttentionInputs<T> in;
  in.masks.is_causal = true;
  if (!s.mask.empty()) {
    in.masks.key_mask = s.mask.data();
    in.masks.key_mask_stride_n = L;
    in.masks.key_mask_stride_s = 1;
  }
  in.rotary = rotary_.get();
  in.positions = s.positions.data();
  for (size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->forward_train(s.stream[i].data(), s.stream[i + 1].data(), N, L, in, drop.child(i));
  s.hidden.resize(static_cast<size_t>(n));
  final_norm_->forward(s.stream.back().data(), rows, s.hidden.data());

  // The fused head: d hidden, and the head's dW staged for backward (see the top).
  s.head_stage.resize(static_cast<size_t>(V * E));  // [V, E], overwritten by head_loss (kept across steps)
  s.dhidden.resize(static_cast<size_t>(n));
  LossResult r;
  r.num_tokens = static_cast<int64_t>(counted.size());
  const double scale = r.num_tokens > 0 ? 1.0 / static_cast<double>(r.num_tokens) : 0.0;
  const double total =
      head_loss(s.hidden.data(), targets, rows, ignore_index, counted, scale, s.dhidden.data(), s.head_stage.data());
  r.loss = r.num_tokens > 0 ? total / static_cast<double>(r.num_tokens) : 0.0;
  r.finite = std::isfinite(r.loss);
  if (!r.finite) {  // report it; no gradient was touched, keep nothing
    release_activations();
    return r;
  }
  s.head_staged = r.num_tokens > 0;  // no counted row: no logits, dW = 0 (backward marks it written)
  s.valid = true;
  return r;
}

template <class T>
void DecoderModel<T>::backward() {
  TrainState& s = train_;
  if (!s.valid)
    throw std::logic_error("backward: no training forward to differentiate (call loss in training mode first; "
                           "each loss has one backward)");
  s.valid = false;
  const int64_t rows = s.N * s.L, n = rows * config_.hidden_size;
  if (s.head_staged) {  // the head's dW of the loss, staged by loss_train
    layers::Module<T>& owner = head_owner();
    const int64_t size = config_.vocab_size * config_.hidden_size;
    const T* dW = s.head_stage.data();
    const bool written = owner.gradient_written("weight");
    T* grad = owner.accumulate_gradient("weight");             // [V, E], marked written
    if (written) ops::add(grad, dW, size, grad);
    else std::copy(dW, dW + size, grad);                       // unwritten: zero, so a copy adds
    s.head_staged = false;
  } else {  // no counted row: the head's dW is zero, and written as torch's is (a zero, not None)
    head_owner().accumulate_gradient("weight");  // an unwritten gradient is all zeros already
  }
  s.grad_a.resize(static_cast<size_t>(n));
  s.grad_b.resize(static_cast<size_t>(n));
  T* g = s.grad_a.data();
  T* g_next = s.grad_b.data();
  final_norm_->backward(s.stream.back().data(), s.dhidden.data(), rows, g);  // d x_n
  for (size_t i = blocks_.size(); i-- > 0;) {
    blocks_[i]->backward(g, g_next);                                         // d x_i
    std::swap(g, g_next);
  }
  if (s.drop.embed_p > 0) ops::dropout(g, g, n, s.drop.embed_p, s.drop.site(kDropEmbed));
  embed_tokens_.backward(s.ids.data(), g, rows, config_.padding_idx);
  if (embed_positions_ != nullptr) embed_positions_->backward(s.positions.data(), g, rows);
}

template <class T>
void DecoderModel<T>::release_activations() {
  train_ = TrainState{};
  for (auto& b : blocks_) b->release_activations();
}

#define TC_INSTANTIATE(T)                                                                                         \
  template void DecoderBlock<T>::forward_train(const T*, T*, int64_t, int64_t, const layers::AttentionInputs<T>&, \
                                               const layers::Dropout&);                                           \
  template void DecoderBlock<T>::backward(const T*, T*);                                                          \
  template void DecoderBlock<T>::release_activations();                                                           \
  template layers::Module<T>& DecoderModel<T>::head_owner();                                                      \
  template const T* DecoderModel<T>::head_weight() const;                                                         \
  template std::vector<int64_t> DecoderModel<T>::check_targets(const int64_t*, int64_t, int64_t) const;           \
  template double DecoderModel<T>::head_loss(const T*, const int64_t*, int64_t, int64_t,                          \
                                             const std::vector<int64_t>&, double, T*, T*) const;                  \
  template LossResult DecoderModel<T>::loss(const int64_t*, const int64_t*, int64_t, int64_t, const int64_t*,     \
                                            const uint8_t*, int64_t) const;                                       \
  template LossResult DecoderModel<T>::loss_train(const int64_t*, const int64_t*, int64_t, int64_t,               \
                                                  const int64_t*, const uint8_t*, int64_t, const layers::Dropout&); \
  template void DecoderModel<T>::backward();                                                                      \
  template void DecoderModel<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::models
