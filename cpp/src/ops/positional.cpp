// Positional encodings (placeholder; filled in by the positional-encoding work).
#include "transformer_core/ops/functional.hpp"
