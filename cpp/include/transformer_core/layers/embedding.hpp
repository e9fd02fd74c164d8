// Embedding layers.
//
//   Embedding (nn.Embedding):   out[r] = weight[ids[r]]                weight: [num_embeddings, H]
//   Embeddings (BERT's and the tutorials' input embeddings; GPT-2's wte + wpe):
//       out[r] = norm(word[ids[r]] + position[positions[r]] + token_type[token_type_ids[r]])
//   each of position, token_type and the LayerNorm optional.
//
// The table of an Embedding<float> may be held quantized (layers/quantized_matrix.hpp: GGUF blocks,
// read in place): lookups dequantize the rows they need, and project() — the LM head of a model
// whose head is tied to the table — multiplies by the blocks. Or it stays fp32 with an int8 copy
// used only by project() (quantize_output_int8: torch's quantize_dynamic quantizes a tied LM head,
// an nn.Linear, and leaves the embedding in float).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/layers/quantized_matrix.hpp"

namespace transformer_core::layers {

template <class T>
class Embedding : public Module<T> {
 public:
  // Parameter: weight [num_embeddings, embedding_dim].
  Embedding(int64_t num_embeddings, int64_t embedding_dim);

  // Throws std::invalid_argument naming `name` for an id outside [0, num_embeddings).
  void check(const int64_t* ids, int64_t count, const std::string& name) const;
  // out[rows, H] = weight[ids]  (ids already checked)
  void forward(const int64_t* ids, int64_t rows, T* out) const;
  // out[rows, H] += weight[ids]
  void forward_add(const int64_t* ids, int64_t rows, T* out) const;

  // ---- training (embedding_backward.cpp) ----
  // weight.grad[ids[r]] += dy[r] for r < rows (a deterministic scatter-add), except rows whose id is
  // padding_idx (torch's nn.Embedding(padding_idx=...): that row gets no gradient; < 0: none).
  // dy: [rows, H]
  void backward(const int64_t* ids, const T* dy, int64_t rows, int64_t padding_idx = -1);

  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }
  // weight [num_embeddings, H]: the output layer of a model whose LM head is tied to it (nullptr
  // while the table is quantized: use project()).
  const T* weight() const { return quantized_ != nullptr ? nullptr : weight_.data(); }

  // The tied LM head: out [rows, num_embeddings] = x [rows, H] · weightᵀ, through the int8 copy or
  // the quantized table when there is one.
  void project(const T* x, int64_t rows, T* out) const;

  // Quantized tables (Embedding<float> only; Embedding<double> throws std::invalid_argument):
  // set_quantized() replaces the table by a matrix [num_embeddings, H] and frees the fp32 one;
  // quantize_output_int8() keeps the fp32 table for lookups and adds an int8 copy for project().
  void set_quantized(std::unique_ptr<QuantizedMatrix> table);
  void quantize_output_int8();
  const QuantizedMatrix* quantized_weight() const { return quantized_.get(); }
  QuantizedMatrix* quantized_weight() { return quantized_.get(); }
  const QuantizedMatrix* output_int8() const { return output_int8_.get(); }
  QuantizedMatrix* output_int8() { return output_int8_.get(); }

  bool quantized(const std::string& name) const override;
  std::string storage(const std::string& name, int64_t row0 = 0, int64_t rows = -1) const override;
  void dequantize_rows(const std::string& name, int64_t row0, int64_t rows, T* out) const override;

 private:
  int64_t num_, dim_;
  xt::xtensor<T, 2> weight_;
  std::unique_ptr<QuantizedMatrix> quantized_;    // non-null: replaces weight_ (then empty)
  std::unique_ptr<QuantizedMatrix> output_int8_;  // non-null: project() multiplies by it
};

struct EmbeddingsConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t max_position_embeddings = 0;  // 0: no learned positions
  int64_t type_vocab_size = 0;          // 0: no token types
  bool layer_norm = true;
  double layer_norm_eps = 1e-12;
  int64_t padding_idx = -1;             // training: the word row that gets no gradient (< 0: none)
};

template <class T>
class Embeddings : public Module<T> {
 public:
  // Parameters (Hugging Face BertEmbeddings' names): word_embeddings.weight [V, H],
  // position_embeddings.weight [P, H], token_type_embeddings.weight [T, H], LayerNorm.weight [H],
  // LayerNorm.bias [H] — those the config asks for.
  explicit Embeddings(const EmbeddingsConfig& config);

  // Checks ids against the tables (std::invalid_argument naming input_ids / position_ids /
  // token_type_ids). positions / token_type_ids may be nullptr (none, or all zeros).
  void check(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids, int64_t rows) const;
  // out [rows, H] for `rows` tokens given by flat arrays of length rows (already checked).
  void forward(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids, int64_t rows,
               T* out) const;

  const Embedding<T>& word_embeddings() const { return word_; }
  const EmbeddingsConfig& config() const { return config_; }

  // ---- training (embedding_backward.cpp) ----
  // As forward, keeping the sum before the LayerNorm and POINTERS to the ids (kept alive by the
  // caller until backward); then the dropout of p (seed) on the output (HF's BertEmbeddings.dropout).
  void forward_train(const int64_t* ids, const int64_t* positions, const int64_t* token_type_ids, int64_t rows,
                     T* out, double dropout_p = 0, uint64_t dropout_seed = 0);
  // dout [rows, H] (overwritten as scratch) -> the tables' and the LayerNorm's gradients.
  void backward(T* dout);
  void release_activations() override;

 private:
  EmbeddingsConfig config_;
  struct Saved {
    const int64_t *ids = nullptr, *positions = nullptr, *token_type_ids = nullptr;
    int64_t rows = 0;
    std::vector<T> sum;  // [rows, H] before the LayerNorm
    double dropout_p = 0;
    uint64_t dropout_seed = 0;
    bool valid = false;
  } saved_;
  Embedding<T> word_;
  std::unique_ptr<Embedding<T>> position_, token_type_;
  std::unique_ptr<LayerNorm<T>> norm_;
};

}  // namespace transformer_core::layers
