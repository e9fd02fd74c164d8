// The embeddings' backward: a scatter-add of the output gradient into the rows the ids picked
// (ops::embedding_backward, deterministic), after BERT's LayerNorm and dropout.
#include <stdexcept>
#include <vector>

#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

template <class T>
void Embedding<T>::backward(const int64_t* ids, const T* dy, int64_t rows, int64_t padding_idx) {
  ops::embedding_backward(ids, dy, rows, num_, dim_, padding_idx, this->accumulate_gradient("weight"),
                          /*accumulate=*/true);
}

template <class T>
void Embeddings<T>::forward_train(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids,
                                  int64_t rows, T* out, double dropout_p, uint64_t dropout_seed) {
  const int64_t H = config_.hidden_size;
  Saved& s = saved_;
  s.valid = false;
  s.ids = ids, s.positions = positions, s.token_type_ids = token_type_ids, s.rows = rows;
  s.dropout_p = dropout_p, s.dropout_seed = dropout_seed;
  // The same ops as forward: out = word[ids] (+ position) (+ token type), then the LayerNorm.
  word_.forward(ids, rows, out);
  if (position_ != nullptr && positions != nullptr) position_->forward_add(positions, rows, out);
  if (token_type_ != nullptr) {
    if (token_type_ids != nullptr) {
      token_type_->forward_add(token_type_ids, rows, out);
    } else {
      const std::vector<int64_t> zeros(static_cast<size_t>(rows), 0);
      token_type_->forward_add(zeros.data(), rows, out);
    }
  }
  if (norm_ != nullptr) {
    s.sum.assign(out, out + rows * H);  // the LayerNorm's input
    norm_->forward(out, rows, out);
  }
  if (dropout_p > 0) ops::dropout(out, out, rows * H, dropout_p, dropout_seed);
  s.valid = true;
}

template <class T>
void Embeddings<T>::backward(T* dout) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("Embeddings: backward without a training forward");
  s.valid = false;
  const int64_t H = config_.hidden_size, rows = s.rows;
  if (s.dropout_p > 0) ops::dropout(dout, dout, rows * H, s.dropout_p, s.dropout_seed);
  const T* d = dout;
  std::vector<T> dsum;
  if (norm_ != nullptr) {
    dsum.resize(static_cast<size_t>(rows * H));
    norm_->backward(s.sum.data(), dout, rows, dsum.data());
    d = dsum.data();
  }
  word_.backward(s.ids, d, rows, config_.padding_idx);
  if (position_ != nullptr && s.positions != nullptr) position_->backward(s.positions, d, rows);
  if (token_type_ != nullptr) {
    if (s.token_type_ids != nullptr) {
      token_type_->backward(s.token_type_ids, d, rows);
    } else {
      const std::vector<int64_t> zeros(static_cast<size_t>(rows), 0);
      token_type_->backward(zeros.data(), d, rows);
    }
  }
}

template <class T>
void Embeddings<T>::release_activations() {
  saved_ = Saved{};
}

#define TC_INSTANTIATE(T)                                                                                   \
  template void Embedding<T>::backward(const int64_t*, const T*, int64_t, int64_t);                         \
  template void Embeddings<T>::forward_train(const int64_t*, const int64_t*, const int64_t*, int64_t, T*,    \
                                             double, uint64_t);                                             \
  template void Embeddings<T>::backward(T*);                                                                \
  template void Embeddings<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::layers
