// Position-wise feed-forward networks, x [rows, d_model] -> [rows, d_model], hidden width F:
//
//   FeedForward (Vaswani et al. 2017, eq. 2; the tutorials' FeedForward):
//       FFN(x) = linear2(act(linear1(x)))            act = ReLU (the paper) or GELU (BERT, GPT-2)
//   GatedFeedForward (Shazeer 2020, "GLU variants"; Llama's MLP):
//       FFN(x) = down_proj(act(gate_proj(x)) · up_proj(x))    act = SiLU (SwiGLU) or GELU (GeGLU)
//
// Both implement Mlp, so a decoder block holds either one.
#pragma once

#include <cstdint>
#include <vector>

#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

template <class T>
class Mlp : public Module<T> {
 public:
  // x [rows, d_model] -> out [rows, d_model]; out must not alias x.
  virtual void forward(const T* x, int64_t rows, T* out) const = 0;
  // The feature size E of x and out.
  virtual int64_t d_model() const = 0;

  // ---- training (feed_forward_backward.cpp) ----
  // As forward (the same outputs, bitwise), keeping the hidden activations and a POINTER to x (kept
  // alive and unchanged by the caller until backward). hidden_dropout (with its seed): dropout on the
  // hidden activations, between the two products (torch's TransformerEncoderLayer; 0 = none).
  virtual void forward_train(const T* x, int64_t rows, T* out, double hidden_dropout = 0, uint64_t seed = 0);
  // dout [rows, d_model] -> dx [rows, d_model] (overwritten; must not alias dout) and the parameters'
  // gradients (added). Throws std::logic_error without a training forward since the last backward.
  virtual void backward(const T* dout, T* dx);
};

template <class T>
class FeedForward : public Mlp<T> {
 public:
  // Parameters (torch's names): linear1.weight [F, E], linear1.bias [F], linear2.weight [E, F],
  // linear2.bias [E].
  FeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias = true);

  void forward(const T* x, int64_t rows, T* out) const override;

  const Linear<T>& linear1() const { return linear1_; }
  const Linear<T>& linear2() const { return linear2_; }
  int64_t d_model() const override { return linear1_.in_features(); }
  int64_t dim_feedforward() const { return linear1_.out_features(); }

  void forward_train(const T* x, int64_t rows, T* out, double hidden_dropout = 0, uint64_t seed = 0) override;
  void backward(const T* dout, T* dx) override;
  void release_activations() override;

 private:
  ops::WeightsCheck weights_check_;  // first: the sizes are checked before linear1_ allocates
  Linear<T> linear1_, linear2_;
  Activation activation_;
  struct Saved {
    const T* x = nullptr;
    int64_t rows = 0;
    std::vector<T> pre, hidden;  // [rows, F]: linear1's output; act of it (after the dropout)
    double dropout = 0;
    uint64_t seed = 0;
    bool valid = false;
  } saved_;
};

template <class T>
class GatedFeedForward : public Mlp<T> {
 public:
  // Parameters (Hugging Face's LlamaMLP names): gate_proj.weight [F, E], up_proj.weight [F, E],
  // down_proj.weight [E, F] (+ .bias with bias). gate and up are stored as one [2F, E] matrix
  // (gate rows first), so both projections are one product.
  GatedFeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias = false);

  void forward(const T* x, int64_t rows, T* out) const override;

  int64_t d_model() const override { return down_proj_.out_features(); }
  int64_t dim_feedforward() const { return down_proj_.in_features(); }

  void forward_train(const T* x, int64_t rows, T* out, double hidden_dropout = 0, uint64_t seed = 0) override;
  void backward(const T* dout, T* dx) override;
  void release_activations() override;

 private:
  ops::WeightsCheck weights_check_;  // first: the sizes are checked before gate_up_proj_ allocates
  Linear<T> gate_up_proj_, down_proj_;
  Activation activation_;
  struct Saved {
    const T* x = nullptr;
    int64_t rows = 0;
    std::vector<T> gate_up, hidden;  // [rows, 2F] (gate | up); [rows, F] act(gate) · up (after the dropout)
    double dropout = 0;
    uint64_t seed = 0;
    bool valid = false;
  } saved_;
};

}  // namespace transformer_core::layers
