// Run-time choice of the quantized kernels' ISA (isa.hpp). Compiled for the baseline x86-64 (no
// -march=native): it runs before anything knows what the CPU has.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/quant/formats.hpp"
#include "transformer_core/kernels/quant/isa.hpp"
#include "transformer_core/kernels/quant/kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define TC_QUANT_X86 1
#endif
#if defined(TC_QUANT_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace transformer_core::kernels::quant {

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
  }
  return "?";
}

GgmlType parse_ggml_type(const std::string& name) {
  if (name == "Q8_0") return GgmlType::kQ8_0;
  if (name == "Q4_0") return GgmlType::kQ4_0;
  if (name == "Q4_1") return GgmlType::kQ4_1;
  throw std::invalid_argument("ggml_type: expected one of \"Q8_0\", \"Q4_0\", \"Q4_1\", got \"" + name + "\"");
}

namespace {

struct CpuFeatures {
  bool avx2 = false;        // AVX2 + FMA + F16C, with the YMM state enabled by the OS
  bool avx512vnni = false;  // the above + AVX-512 F/BW/VL/DQ/VNNI, with the opmask and ZMM state enabled
  bool amx = false;         // the above + AVX512-BF16, AMX-TILE/INT8/BF16, with the tile state enabled and granted
};

#ifdef TC_QUANT_X86
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
// Linux hands the AMX tile data (8 KiB of register state per thread) only to a process that asks
// for it: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once, for all its threads.
bool request_amx_state() {
#ifdef __linux__
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef TC_QUANT_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;     // XMM and YMM registers saved by the OS
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;   // + opmask, ZMM0-15 upper halves, ZMM16-31
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31), avx512vnni = c & (1u << 11);
  f.avx2 = ymm_state && avx2 && fma && f16c;
  f.avx512vnni = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
  const bool avx512bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));  // vcvtneps2bf16
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  f.amx = f.avx512vnni && avx512bf16 && amx_tile && amx_int8 && amx_bf16 && tile_state && request_amx_state();
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

// The ISA set_active_isa() chose (>= 0), or -1: not chosen yet, TC_ISA or the best one decides.
std::atomic<int> g_chosen{-1};

struct EnvChoice {
  Isa isa = Isa::kScalar;
  std::string error;  // non-empty: TC_ISA is unusable, and says why
};

const EnvChoice& env_choice() {
  static const EnvChoice choice = [] {
    EnvChoice c;
    c.isa = best_isa();
    const char* env = std::getenv("TC_ISA");
    if (env == nullptr || *env == '\0') return c;
    try {
      const Isa isa = parse_isa(env);
      if (!isa_supported(isa)) {
        c.error = std::string("TC_ISA=") + env + ": this CPU (or build) lacks it; supported here:";
        for (Isa s : supported_isas()) c.error += std::string(" ") + isa_name(s);
      } else {
        c.isa = isa;
      }
    } catch (const std::invalid_argument&) {
      c.error = std::string("TC_ISA=") + env + ": expected one of scalar, avx2, avx512vnni, amx";
    }
    return c;
  }();
  return choice;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512vnni") return Isa::kAvx512Vnni;
  if (name == "amx") return Isa::kAmx;
  throw std::invalid_argument("name: expected one of \"scalar\", \"avx2\", \"avx512vnni\", \"amx\", got \"" + name +
                              "\"");
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
#ifdef TC_QUANT_X86
    case Isa::kAvx2: return features().avx2;
    case Isa::kAvx512Vnni: return features().avx512vnni;
    case Isa::kAmx: return features().amx;
#endif
    default: return false;
  }
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmx})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa best_isa() { return supported_isas().back(); }

Isa active_isa() {
  const int chosen = g_chosen.load(std::memory_order_relaxed);
  if (chosen >= 0) return static_cast<Isa>(chosen);
  const EnvChoice& env = env_choice();
  if (!env.error.empty()) throw std::invalid_argument(env.error);
  return env.isa;
}

void set_active_isa(Isa isa) {
  if (!isa_supported(isa)) {
    std::string msg = std::string("name: \"") + isa_name(isa) + "\" is not supported by this CPU (or build); supported:";
    for (Isa s : supported_isas()) msg += std::string(" ") + isa_name(s);
    throw std::invalid_argument(msg);
  }
  g_chosen.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
#ifdef TC_QUANT_X86
    case Isa::kAvx2: return avx2_kernels();
    case Isa::kAvx512Vnni: return avx512vnni_kernels();
    case Isa::kAmx: return amx_kernels();
#endif
    default: return scalar_kernels();
  }
}

const KernelTable& active_kernels() { return kernel_table(active_isa()); }

}  // namespace transformer_core::kernels::quant
