#include "common.hpp"
namespace transformer_core::bindings {
void register_positional(py::module_& m) {}
}  // namespace transformer_core::bindings
