// kvx's correction of Highway 1.0's per-target compile strings, found before
// the real header by the include path (CMakeLists.txt, kvx_ops only) and
// included again on every foreach_target pass, like the header it wraps
// (hence no include guard).
//
// Why: Highway 1.0.3 (Debian bookworm) compiles its AVX3_DL target with
// "avxvnni" (AVX-VNNI, the VEX-encoded vpdpbusd of Alder Lake) but selects that
// target at run time on AVX512-VNNI alone. With both enabled the compiler
// prefers the shorter VEX form for 256-bit dot products, so the AVX-512
// kernels raised SIGILL on every AVX-512 CPU without AVX-VNNI (Zen 4, Ice
// Lake-SP, Cascade Lake). AVX3_DL's string here names avx512vnni instead,
// which Highway does check; ops/simd_target.cc additionally verifies every
// feature of each compiled target's string against CPUID before dispatching
// to it, and tests/isa_guard.sh checks the instructions in the objects.
// Highway 1.1 and later have their own fix; the override applies to 1.0 only.
#include_next <hwy/ops/set_macros-inl.h>

#if HWY_MAJOR == 1 && HWY_MINOR == 0 && defined(HWY_TARGET) && HWY_TARGET == HWY_AVX3_DL
#undef HWY_TARGET_STR
#define HWY_TARGET_STR                                                \
  HWY_TARGET_STR_AVX3                                                 \
  ",vpclmulqdq,avx512vbmi,avx512vbmi2,vaes,avx512vnni,avx512bitalg," \
  "avx512vpopcntdq"
#endif
