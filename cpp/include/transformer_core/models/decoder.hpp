// The decoder-only stack every causal language model here is built from (the tutorials' "BERT vs
// GPT", GPT-2, Llama): nanoGPT's Block, llama.cpp's build_norm / build_attn / build_ffn.
//
//   h = embed_tokens[input_ids] (+ embed_positions[positions])          (learned positions: GPT-2)
//   block i:  h = h + attn(attn_norm(h))       attention: causal, GQA, KV cache, RoPE (Llama)
//             h = h + mlp(mlp_norm(h))         mlp: FeedForward (GPT-2) or GatedFeedForward (SwiGLU)
//   hidden = final_norm(h);   logits = hidden · lm_headᵀ   (lm_head tied to embed_tokens, or its own)
//
// input_ids, positions: [N, L] int64   attention_mask: [N, past + L] uint8 (1 = real token)
// hidden: [N, L, E]   logits: [rows, vocab_size]
//
// An architecture is a DecoderConfig plus the names of its weights (gpt2.hpp, llama.hpp).
//
// Training (decoder_train.cpp, llm.c's gpt2_forward / gpt2_backward): loss_train runs the forward
// keeping every block's activations, then the LM head fused with the next-token cross-entropy, a
// chunk of rows at a time (the [rows, vocab] logits are never whole), keeping d hidden and the head's
// weight gradient [vocab, E]; backward adds that into the head's gradient and runs the blocks'
// backward passes down to the embeddings. Only backward touches a gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/kv_cache.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/layers/rotary.hpp"

namespace transformer_core::models {

using ops::Activation;

struct DecoderConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;       // 0 = num_heads
  int64_t head_dim = 0;           // 0 = hidden_size / num_heads
  int64_t intermediate_size = 0;
  int64_t max_positions = 0;      // the context length
  ops::NormKind norm = ops::NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  bool gated_mlp = false;         // GatedFeedForward (SwiGLU / GeGLU) instead of FeedForward
  Activation activation = Activation::kGeluTanh;
  bool attention_bias = true;
  bool mlp_bias = true;
  bool learned_positions = true;  // false: RoPE
  double rope_theta = 10000.0;
  ops::RotaryLayout rope_layout = ops::RotaryLayout::kHalf;
  bool tie_word_embeddings = true;
  int64_t padding_idx = -1;       // training: the embedding row that gets no gradient from the input side (< 0: none)
};

template <class T>
class DecoderBlock : public layers::Module<T> {
 public:
  explicit DecoderBlock(const DecoderConfig& c);

  // h [N, L, E] updated in place; in.masks must be causal; in.cache receives this layer's keys/values.
  void forward(T* h, int64_t N, int64_t L, const layers::AttentionInputs<T>& in) const;

  const layers::Norm<T>& attn_norm() const { return *attn_norm_; }
  const layers::MultiheadAttention<T>& attn() const { return attn_; }
  const layers::Norm<T>& mlp_norm() const { return *mlp_norm_; }
  const layers::Mlp<T>& mlp() const { return *mlp_; }

  // ---- training (decoder_train.cpp) ----
  // y = block(x) (x [N, L, E] kept by the caller until backward; y must not alias x), with the
  // residual dropout drop.p on both branches (GPT-2's resid_pdrop):
  //   h = x + drop(attn(attn_norm(x)));   y = h + drop(mlp(mlp_norm(h)))
  void forward_train(const T* x, T* y, int64_t N, int64_t L, const layers::AttentionInputs<T>& in,
                     const layers::Dropout& drop);
  // dy [N, L, E] -> dx [N, L, E] (overwritten; must not alias dy), the parameters' gradients added.
  void backward(const T* dy, T* dx);
  void release_activations() override;

 private:
  std::unique_ptr<layers::Norm<T>> attn_norm_;
  layers::MultiheadAttention<T> attn_;
  std::unique_ptr<layers::Norm<T>> mlp_norm_;
  std::unique_ptr<layers::Mlp<T>> mlp_;
  struct Saved {
    const T* x = nullptr;
    int64_t rows = 0;
    std::vector<T> a, h, m;  // attn_norm(x), x + attn(a), mlp_norm(h)   [rows, E]
    layers::Dropout drop;
    bool valid = false;
  } saved_;
};

// What a model's training forward and its fused loss report.
struct LossResult {
  double loss = 0;         // the mean cross-entropy over the counted rows (0 if none); NaN/inf reported here
  int64_t num_tokens = 0;  // rows whose target is not ignore_index
  bool finite = true;      // false: the loss is NaN or inf and no gradient was touched
};

template <class T>
class DecoderModel : public layers::Module<T> {
 public:
  // Throws std::invalid_argument naming the field for invalid sizes (see DecoderConfig).
  explicit DecoderModel(const DecoderConfig& c);

  // input_ids [N, L]; positions [N, L] or nullptr (past + l); attention_mask [N, past + L] (1 = real)
  // or nullptr; the cache holds `past` positions and gains L. hidden [N, L, E] (after final_norm).
  // Throws std::invalid_argument for ids outside the vocabulary, positions outside the context, or
  // a cache that does not fit.
  void forward(const int64_t* input_ids, int64_t N, int64_t L, const int64_t* positions,
               const uint8_t* attention_mask, layers::KVCache<T>& cache, T* hidden) const;

  // logits [rows, vocab_size] = hidden [rows, E] · lm_headᵀ
  void logits(const T* hidden, int64_t rows, T* logits) const;

  // A tied LM head in int8 (DecoderModel<float> only): an int8 per-channel copy of embed_tokens
  // that logits() multiplies by, the lookups staying in fp32 (as torch's quantize_dynamic treats a
  // tied nn.Linear head). Does nothing when the head is untied (its Linear is quantized with the
  // others) or the table is itself quantized (GGUF blocks: logits() uses them).
  void quantize_tied_lm_head_int8();

  const DecoderConfig& config() const { return config_; }
  int64_t head_dim() const {
    return config_.head_dim > 0 ? config_.head_dim : config_.hidden_size / config_.num_heads;
  }

  // ---- training (decoder_train.cpp) ----
  // The next-token loss: targets [N, L] (the label of each position's next token, already shifted;
  // ignore_index: no loss there), mean cross-entropy over the counted positions (torch's
  // reduction="mean"). input_ids, positions, attention_mask as forward (no cache). The eval form
  // (loss) keeps nothing and touches no gradient. loss_train keeps every activation the backward
  // needs and, fused with the LM head (logits made a chunk of rows at a time), computes d hidden
  // and the head's weight gradient, which it keeps (a [vocab, E] buffer of the training state) for
  // backward to add: like the eval form it touches no gradient, and a second loss_train replaces the
  // first's state whole. A non-finite loss (LossResult::finite false) keeps nothing. drop: embd_pdrop
  // (drop.embed_p) on the embeddings' output, resid_pdrop (drop.p) on every residual branch.
  // Throws std::invalid_argument for ids, positions or targets out of range.
  LossResult loss(const int64_t* input_ids, const int64_t* targets, int64_t N, int64_t L, const int64_t* positions,
                  const uint8_t* attention_mask, int64_t ignore_index) const;
  LossResult loss_train(const int64_t* input_ids, const int64_t* targets, int64_t N, int64_t L,
                        const int64_t* positions, const uint8_t* attention_mask, int64_t ignore_index,
                        const layers::Dropout& drop = {});
  // The backward of the last loss_train: every parameter's gradient added (the head's, tied to the
  // embedding or not, included). Throws std::logic_error without one since the last backward.
  void backward();
  // Whether a loss_train waits for its backward.
  bool has_training_state() const { return train_.valid; }
  void release_activations() override;

 protected:
  // The parts, for an architecture's constructor to register under its own weight names.
  const layers::Embedding<T>& embed_tokens() const { return embed_tokens_; }
  const layers::Embedding<T>* embed_positions() const { return embed_positions_.get(); }
  const DecoderBlock<T>& block(int64_t i) const { return *blocks_[static_cast<size_t>(i)]; }
  const layers::Norm<T>& final_norm() const { return *final_norm_; }
  const layers::Linear<T>* lm_head() const { return lm_head_.get(); }

 private:
  DecoderConfig config_;
  layers::Embedding<T> embed_tokens_;
  std::unique_ptr<layers::Embedding<T>> embed_positions_;
  std::unique_ptr<layers::RotaryEmbedding<T>> rotary_;
  std::vector<std::unique_ptr<DecoderBlock<T>>> blocks_;
  std::unique_ptr<layers::Norm<T>> final_norm_;
  std::unique_ptr<layers::Linear<T>> lm_head_;  // nullptr: tied to embed_tokens

  // What loss_train keeps for backward.
  struct TrainState {
    int64_t N = 0, L = 0;
    std::vector<int64_t> ids, positions;
    std::vector<uint8_t> mask;           // [N, L] or empty
    std::vector<std::vector<T>> stream;  // num_layers + 1 residual streams [N·L, E]: block i reads i, writes i + 1
    std::vector<T> hidden, dhidden;      // final_norm(stream.back()) and its gradient  [N·L, E]
    std::vector<T> grad_a, grad_b;       // backward's residual gradients  [N·L, E]
    std::vector<T> head_stage;           // the head's weight gradient [V, E], for backward to add (kept allocated)
    bool head_staged = false;            // head_stage holds the last loss_train's (some target counted)
    layers::Dropout drop;
    bool valid = false;
  } train_;
  // The fused LM head and cross-entropy over the rows of hidden [N·L, E] whose target counts:
  // returns the summed loss; with dhidden, writes d hidden (rows that do not count: 0) and the
  // head's weight gradient into dweight [V, E] (overwritten; untouched when no row counts), both
  // scaled by grad_scale.
  double head_loss(const T* hidden, const int64_t* targets, int64_t rows, int64_t ignore_index,
                   const std::vector<int64_t>& counted, double grad_scale, T* dhidden, T* dweight) const;
  // input_ids, positions, mask, targets checked; the rows whose target counts.
  std::vector<int64_t> check_targets(const int64_t* targets, int64_t rows, int64_t ignore_index) const;
  layers::Module<T>& head_owner();  // the module whose "weight" the LM head multiplies by
  const T* head_weight() const;
};

}  // namespace transformer_core::models
