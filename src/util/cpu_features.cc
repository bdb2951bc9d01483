#include "util/cpu_features.h"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KVX_CPUID_X86 1
#endif

namespace kvx::util {
namespace {

// Where a feature's bit lives: CPUID leaf/subleaf, register, bit, and the
// register state the OS must save for it.
enum class Reg { kEax, kEbx, kEcx, kEdx };
enum class State { kNone, kYmm, kZmm };
struct FeatureBit {
  const char* name;  // as in target attributes
  unsigned leaf, subleaf;
  Reg reg;
  int bit;
  State state;
};

// Every feature a kvx target string may name (Highway's AVX2 and AVX3_DL
// strings, the kernels' own attributes, the roofline probes), in the order
// CpuFeatureList prints them.
constexpr FeatureBit kFeatures[] = {
    {"sse2", 1, 0, Reg::kEdx, 26, State::kNone},
    {"ssse3", 1, 0, Reg::kEcx, 9, State::kNone},
    {"sse4.1", 1, 0, Reg::kEcx, 19, State::kNone},
    {"sse4.2", 1, 0, Reg::kEcx, 20, State::kNone},
    {"popcnt", 1, 0, Reg::kEcx, 23, State::kNone},
    {"pclmul", 1, 0, Reg::kEcx, 1, State::kNone},
    {"aes", 1, 0, Reg::kEcx, 25, State::kNone},
    {"avx", 1, 0, Reg::kEcx, 28, State::kYmm},
    {"fma", 1, 0, Reg::kEcx, 12, State::kYmm},
    {"f16c", 1, 0, Reg::kEcx, 29, State::kYmm},
    {"bmi", 7, 0, Reg::kEbx, 3, State::kNone},
    {"avx2", 7, 0, Reg::kEbx, 5, State::kYmm},
    {"bmi2", 7, 0, Reg::kEbx, 8, State::kNone},
    {"lzcnt", 0x80000001u, 0, Reg::kEcx, 5, State::kNone},
    {"avx512f", 7, 0, Reg::kEbx, 16, State::kZmm},
    {"avx512dq", 7, 0, Reg::kEbx, 17, State::kZmm},
    {"avx512cd", 7, 0, Reg::kEbx, 28, State::kZmm},
    {"avx512bw", 7, 0, Reg::kEbx, 30, State::kZmm},
    {"avx512vl", 7, 0, Reg::kEbx, 31, State::kZmm},
    {"avx512vbmi", 7, 0, Reg::kEcx, 1, State::kZmm},
    {"avx512vbmi2", 7, 0, Reg::kEcx, 6, State::kZmm},
    {"gfni", 7, 0, Reg::kEcx, 8, State::kNone},
    {"vaes", 7, 0, Reg::kEcx, 9, State::kYmm},
    {"vpclmulqdq", 7, 0, Reg::kEcx, 10, State::kYmm},
    {"avx512vnni", 7, 0, Reg::kEcx, 11, State::kZmm},
    {"avx512bitalg", 7, 0, Reg::kEcx, 12, State::kZmm},
    {"avx512vpopcntdq", 7, 0, Reg::kEcx, 14, State::kZmm},
    {"avxvnni", 7, 1, Reg::kEax, 4, State::kYmm},
    {"avx512bf16", 7, 1, Reg::kEax, 5, State::kZmm},
};
constexpr int kNumFeatures = static_cast<int>(sizeof(kFeatures) / sizeof(kFeatures[0]));

struct Cpu {
  std::array<bool, kNumFeatures> has{};
  std::string brand = "unknown";
};

#ifdef KVX_CPUID_X86
// CPUID through the compiler's helper, which checks the leaf is in range
// (returns zeros when it is not).
std::array<unsigned, 4> Cpuid(unsigned leaf, unsigned subleaf) {
  std::array<unsigned, 4> r{};
  if (__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) r = {};
  return r;
}

// XCR0, the register states the OS saves; 0 without OSXSAVE. volatile: a
// plain asm counts as pure, and this must run where it is written.
uint64_t Xcr0() {
  if (((Cpuid(1, 0)[2] >> 27) & 1u) == 0) return 0;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

Cpu Detect() {
  Cpu cpu;
#ifdef KVX_CPUID_X86
  const uint64_t xcr0 = Xcr0();
  const bool ymm = (xcr0 & 0x6u) == 0x6u;     // SSE and AVX state
  const bool zmm = (xcr0 & 0xE6u) == 0xE6u;   // + opmask, ZMM_Hi256, Hi16_ZMM
  for (int i = 0; i < kNumFeatures; ++i) {
    const FeatureBit& f = kFeatures[i];
    const auto regs = Cpuid(f.leaf, f.subleaf);
    const bool bit = ((regs[static_cast<int>(f.reg)] >> f.bit) & 1u) != 0;
    const bool state = f.state == State::kNone || (f.state == State::kYmm ? ymm : zmm);
    cpu.has[i] = bit && state;
  }
  if (Cpuid(0x80000000u, 0)[0] >= 0x80000004u) {
    char text[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const auto regs = Cpuid(0x80000002u + i, 0);
      std::memcpy(text + 16 * i, regs.data(), 16);
    }
    std::string brand(text);
    const size_t first = brand.find_first_not_of(' '), last = brand.find_last_not_of(' ');
    if (first != std::string::npos) cpu.brand = brand.substr(first, last - first + 1);
  }
#endif
  return cpu;
}

const Cpu& TheCpu() {
  static const Cpu cpu = Detect();
  return cpu;
}

int IndexOf(std::string_view name) {
  for (int i = 0; i < kNumFeatures; ++i) {
    if (name == kFeatures[i].name) return i;
  }
  return -1;
}

}  // namespace

bool IsKnownCpuFeature(std::string_view gcc_name) { return IndexOf(gcc_name) >= 0; }

bool CpuHasFeature(std::string_view gcc_name) {
  const int i = IndexOf(gcc_name);
  return i >= 0 && TheCpu().has[i];
}

std::vector<std::string> MissingCpuFeatures(std::string_view target_string) {
  std::vector<std::string> missing;
  while (!target_string.empty()) {
    const size_t comma = target_string.find(',');
    const std::string_view name = target_string.substr(0, comma);
    if (!name.empty() && !CpuHasFeature(name)) missing.emplace_back(name);
    target_string = comma == std::string_view::npos ? std::string_view() : target_string.substr(comma + 1);
  }
  return missing;
}

std::string CpuFeatureList() {
  std::string out;
  for (int i = 0; i < kNumFeatures; ++i) {
    if (!TheCpu().has[i]) continue;
    if (!out.empty()) out += ' ';
    out += kFeatures[i].name;
  }
  return out;
}

std::string CpuBrand() { return TheCpu().brand; }

}  // namespace kvx::util
