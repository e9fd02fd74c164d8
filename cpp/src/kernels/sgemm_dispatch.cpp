// Which fp32 GEMM kernels run (sgemm.hpp): the active ISA's (quant/isa.hpp). Compiled for the
// baseline x86-64, like quant_dispatch.cpp.
#include <stdexcept>

#include "transformer_core/kernels/quant/isa.hpp"
#include "transformer_core/kernels/sgemm.hpp"

namespace transformer_core::kernels::sgemm {

const Kernels* active() {
#if defined(__x86_64__) || defined(_M_X64)
  using quant::Isa;
  Isa isa = Isa::kScalar;
  try {
    isa = quant::active_isa();
  } catch (const std::invalid_argument&) {  // a bad TC_ISA: the quantized ops say so; fp32 runs on
    isa = quant::best_isa();
  }
  if (isa == Isa::kAvx512Vnni || isa == Isa::kAmx) return &avx512_kernels();
  if (quant::isa_supported(Isa::kAvx2)) return &avx2_kernels();  // "avx2", and "scalar": the same bits
#endif
  return nullptr;
}

}  // namespace transformer_core::kernels::sgemm
