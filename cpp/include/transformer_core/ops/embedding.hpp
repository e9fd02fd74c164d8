// Embedding lookups (nn.Embedding): rows of a table picked by integer ids.
//
//   gather:  out[r, :]  = table[ids[r], :]        ids: [rows] int64   table: [V, H]   out: [rows, H]
//   add:     out[r, :] += table[ids[r], :]
#pragma once

#include <cstdint>
#include <string>

namespace transformer_core::ops {

// Throws std::invalid_argument naming `name` ("input_ids", "position_ids", ...) and the first id
// outside [0, V) with its flat index.
void check_ids(const int64_t* ids, int64_t count, int64_t V, const std::string& name);

// Both take ids already checked with check_ids.
template <class T>
void embedding(const int64_t* ids, int64_t rows, const T* table, int64_t H, T* out);

template <class T>
void embedding_add(const int64_t* ids, int64_t rows, const T* table, int64_t H, T* out);

}  // namespace transformer_core::ops
