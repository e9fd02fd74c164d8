#include "transformer_core/layers/embedding.hpp"

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "transformer_core/ops/embedding.hpp"
#include "transformer_core/ops/linear.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

template <class T>
Embedding<T>::Embedding(int64_t num_embeddings, int64_t embedding_dim) : num_(num_embeddings), dim_(embedding_dim) {
  weight_ = allocate_weight<T, 2>({num_embeddings, embedding_dim}, "Embedding: (num_embeddings, embedding_dim)");
  this->register_parameter("weight", {num_, dim_}, weight_.data());
}

template <class T>
void Embedding<T>::check(const int64_t* ids, int64_t count, const std::string& name) const {
  ops::check_ids(ids, count, num_, name);
}

template <class T>
void Embedding<T>::forward(const int64_t* ids, int64_t rows, T* out) const {
  if (quantized_ != nullptr) {
    if constexpr (std::is_same_v<T, float>) quantized_->gather_rows(ids, rows, out);  // rows decoded
    return;
  }
  ops::embedding(ids, rows, weight_.data(), dim_, out);
}

template <class T>
void Embedding<T>::forward_add(const int64_t* ids, int64_t rows, T* out) const {
  if (quantized_ != nullptr) {
    std::vector<T> rows_of(static_cast<size_t>(rows * dim_));
    forward(ids, rows, rows_of.data());
    ops::add(out, rows_of.data(), rows * dim_, out);
    return;
  }
  ops::embedding_add(ids, rows, weight_.data(), dim_, out);
}

template <class T>
void Embedding<T>::project(const T* x, int64_t rows, T* out) const {
  if constexpr (std::is_same_v<T, float>) {
    const QuantizedMatrix* w = output_int8_ != nullptr ? output_int8_.get() : quantized_.get();
    if (w != nullptr) {
      w->forward(x, rows, out, nullptr, 0, num_);
      return;
    }
  }
  ops::linear(x, rows, dim_, weight_.data(), static_cast<const T*>(nullptr), num_, out);
}

template <class T>
void Embedding<T>::set_quantized(std::unique_ptr<QuantizedMatrix> table) {
  if constexpr (std::is_same_v<T, float>) {
    if (table == nullptr) throw std::invalid_argument("Embedding: set_quantized: expected a matrix, got null");
    if (table->out_features() != num_ || table->in_features() != dim_)
      throw std::invalid_argument("Embedding: quantized table: expected shape (" + std::to_string(num_) + ", " +
                                  std::to_string(dim_) + "), got (" + std::to_string(table->out_features()) + ", " +
                                  std::to_string(table->in_features()) + ")");
    quantized_ = std::move(table);
    output_int8_.reset();
    this->retire_storage("weight", weight_);  // frees the fp32 table (unless a numpy view holds it)
    this->set_parameter_data("weight", nullptr);
  } else {
    (void)table;
    throw std::invalid_argument("Embedding: quantized tables need a float32 layer, got float64");
  }
}

template <class T>
void Embedding<T>::quantize_output_int8() {
  if constexpr (std::is_same_v<T, float>) {
    if (quantized_ != nullptr)
      throw std::invalid_argument("Embedding: the table is already quantized (" + quantized_->format_name() + ")");
    output_int8_ = QuantizedMatrix::int8(weight_.data(), num_, dim_);
  } else {
    throw std::invalid_argument("Embedding: int8 weights need a float32 layer (the kernels compute in float32), "
                                "got float64");
  }
}

template <class T>
bool Embedding<T>::quantized(const std::string& name) const {
  return quantized_ != nullptr && name == "weight";
}

template <class T>
std::string Embedding<T>::storage(const std::string& name, int64_t row0, int64_t rows) const {
  return quantized(name) ? quantized_->format_name(row0, rows) : Module<T>::storage(name, row0, rows);
}

template <class T>
void Embedding<T>::dequantize_rows(const std::string& name, int64_t row0, int64_t rows, T* out) const {
  if (!quantized(name)) {
    Module<T>::dequantize_rows(name, row0, rows, out);
    return;
  }
  if constexpr (std::is_same_v<T, float>) quantized_->dequantize_rows(row0, rows, out);
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
    } else {  // no token types: + token_type[0] (looked up, so dequantized, while the table is quantized)
      const T* type0 = token_type_->weight();
      std::vector<T> row;
      if (type0 == nullptr) {
        const int64_t zero = 0;
        row.resize(static_cast<size_t>(config_.hidden_size));
        token_type_->forward(&zero, 1, row.data());
        type0 = row.data();
      }
      ops::add_bias(out, rows, config_.hidden_size, type0);
    }
  }
  if (norm_ != nullptr) norm_->forward(out, rows, out);
}

template class Embedding<float>;
template class Embedding<double>;
template class Embeddings<float>;
template class Embeddings<double>;

}  // namespace transformer_core::layers
