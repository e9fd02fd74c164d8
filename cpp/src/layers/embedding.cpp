#include "transformer_core/layers/embedding.hpp"

#include "transformer_core/ops/embedding.hpp"
#include "transformer_core/ops/linear.hpp"

namespace transformer_core::layers {

template <class T>
Embedding<T>::Embedding(int64_t num_embeddings, int64_t embedding_dim) : num_(num_embeddings), dim_(embedding_dim) {
  weight_ = allocate<T, 2>({num_embeddings, embedding_dim}, "Embedding: (num_embeddings, embedding_dim)");
  this->register_parameter("weight", {num_, dim_}, weight_.data());
}

template <class T>
void Embedding<T>::check(const int64_t* ids, int64_t count, const std::string& name) const {
  ops::check_ids(ids, count, num_, name);
}

template <class T>
void Embedding<T>::forward(const int64_t* ids, int64_t rows, T* out) const {
  ops::embedding(ids, rows, weight_.data(), dim_, out);
}

template <class T>
void Embedding<T>::forward_add(const int64_t* ids, int64_t rows, T* out) const {
  ops::embedding_add(ids, rows, weight_.data(), dim_, out);
}

template <class T>
Embeddings<T>::Embeddings(const EmbeddingsConfig& c) : config_(c), word_(c.vocab_size, c.hidden_size) {
  this->register_module("word_embeddings", word_);
  if (c.max_position_embeddings > 0) {
    position_ = std::make_unique<Embedding<T>>(c.max_position_embeddings, c.hidden_size);
    this->register_module("position_embeddings", *position_);
  }
  if (c.type_vocab_size > 0) {
    token_type_ = std::make_unique<Embedding<T>>(c.type_vocab_size, c.hidden_size);
    this->register_module("token_type_embeddings", *token_type_);
  }
  if (c.layer_norm) {
    norm_ = std::make_unique<LayerNorm<T>>(c.hidden_size, static_cast<T>(c.layer_norm_eps));
    this->register_module("LayerNorm", *norm_);
  }
}

template <class T>
void Embeddings<T>::check(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids,
                          int64_t rows) const {
  word_.check(ids, rows, "input_ids");
  if (position_ != nullptr && positions != nullptr) position_->check(positions, rows, "position_ids");
  if (token_type_ != nullptr && token_type_ids != nullptr) token_type_->check(token_type_ids, rows, "token_type_ids");
}

template <class T>
void Embeddings<T>::forward(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids, int64_t rows,
                            T* out) const {
  word_.forward(ids, rows, out);                                              // out = word[ids]
  if (position_ != nullptr && positions != nullptr) position_->forward_add(positions, rows, out);
  if (token_type_ != nullptr) {
    if (token_type_ids != nullptr) {
      token_type_->forward_add(token_type_ids, rows, out);                   // + token_type[tt]
    } else {
      ops::add_bias(out, rows, config_.hidden_size, token_type_->weight());  // no token types: type 0
    }
  }
  if (norm_ != nullptr) norm_->forward(out, rows, out);
}

template class Embedding<float>;
template class Embedding<double>;
template class Embeddings<float>;
template class Embeddings<double>;

}  // namespace transformer_core::layers
