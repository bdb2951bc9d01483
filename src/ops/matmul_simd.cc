// Per-target MatMul kernels, compiled once per SIMD target by Highway's
// foreach_target and chosen at run time by HWY_DYNAMIC_DISPATCH (the build
// stays baseline x86-64). Targets (see CMakeLists.txt):
//   AVX3_DL  AVX-512 (F/BW/DQ/VL) + VNNI: 512-bit kernels, vpdpbusd int8 dots;
//   AVX2     256-bit kernels, pmaddubsw int8 dots;
//   the baseline (SCALAR with gcc, EMU128 with clang) and any non-x86
//            target: the scalar reference (matmul_scalar.cc).
// Highway 1.0 has no int8 dot-product op, so the x86 kernels use intrinsics
// inside Highway's per-target regions; every kernel computes exactly what
// matmul_internal.h specifies (same integer lanes, same float operations in
// the same order), so all targets agree bit for bit.
//
// Blocking. Rows are split between threads by the caller (matmul.cc). A
// thread computes its rows in groups of kRows and tokens in tiles that keep
// the activations in L2; a micro-kernel ("tile") holds kRows x kTokens
// accumulators of 16 lanes in registers over the whole row length.
// Integer path: for one token (decode) the weights are decoded straight into
// registers; for several tokens, each group of rows is first decoded once per
// token tile into canonical chunks in an L1-resident panel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cstring>

#include "ops/matmul_internal.h"
#include "ops/quant_blocks.h"
#include "util/check.h"

#ifndef KVX_OPS_MATMUL_SIMD_ONCE
#define KVX_OPS_MATMUL_SIMD_ONCE
namespace kvx::ops::internal {
namespace {
thread_local ScratchBuffer tls_panel;

// Tokens per tile such that the tile's activations (bytes_per_token each)
// stay within ~384 KiB of L2; a multiple of 4, at least 4.
inline int64_t TokenTile(int64_t bytes_per_token) {
  const int64_t t = (384 << 10) / std::max<int64_t>(bytes_per_token, 1);
  return std::clamp<int64_t>(t / 4 * 4, 4, 256);
}

// Prefetch plans of the repacked Q8_0 kernels. A repacked matrix is one
// sequential stream of units, so the kernel that streams it from memory asks
// for its lines ahead (the hardware prefetcher alone left ~30% of the read
// bandwidth unused on Zen 5): at chunk c a tile requests `lines` lines from
// from + 64 * lines * c.
struct Prefetch {
  static constexpr int kUnitLines = Interleaved16::kUnitBytes / 64;
  const uint8_t* from = nullptr;
  int lines = 0;
  // Always inlined: as a call inside a tile, it cost the tile its vector
  // registers (the ABI's calls clobber them all): 8-row steps ran 15% slower.
  __attribute__((always_inline)) void Chunk(int64_t c) const {
    const uint8_t* p = from + 64 * lines * c;
    if (lines == kUnitLines) {  // decode's whole unit, unrolled (as a loop, decode ran ~5% slower)
#pragma GCC unroll 17
      for (int l = 0; l < kUnitLines; ++l) __builtin_prefetch(p + 64 * l, 0, 3);
      return;
    }
    for (int l = 0; l < lines; ++l) __builtin_prefetch(p + 64 * l, 0, 3);
  }
  // The plan of the next tile over the same groups (n_chunks chunks each).
  Prefetch NextTile(int64_t n_chunks) const { return {from + 64 * lines * n_chunks, lines}; }
};

// One pass over a group (decode, a step of a few rows): its own stream,
// kStreamAheadBytes ahead, a unit per chunk. 8 KiB, not 4: with two threads
// streaming, 4 KiB ahead left each short of requests in flight (AMD EPYC
// Zen 5 VM, idle; the same binary with either distance in 10 ABBA rounds of
// kvx bench --seqs 1,4,8: 4 and 8 sequences per step 1.05x and 1.04x in the
// median, 0.99-1.14x by round, in both of the machine's bandwidth states; one
// sequence 1.01x; ops_bench DecodeSweep/q8_0_repacked/thr2 4.2 -> 3.6 ms in
// the slow state, one thread unchanged). 16 KiB made one thread 5-10%
// slower; 6 and 12 KiB were within the noise of 8.
constexpr int64_t kStreamAheadBytes = 8192;
inline Prefetch StreamAhead(const Interleaved16& g, int64_t group) {
  return {g.Unit(group, 0) + kStreamAheadBytes, Prefetch::kUnitLines};
}

// n_tiles tiles of tokens over `groups` groups from `group` (a step of many
// rows, a prompt): while they compute from cache, they prefetch the next
// `groups` groups (the bytes that follow in the stream), each tile an equal
// share, so the memory reads overlap the arithmetic instead of stalling the
// first tile. Each tile gets the NextTile of the one before. Before, a 16-row
// step (4 tiles of 4 tokens) cost 2x a prompt's CPU time per token (ops_bench
// StepGemm/q8_0_repacked, 1 thread, AVX3_DL); after, 1.1x.
inline Prefetch SpreadOverTiles(const Interleaved16& g, int64_t group, int groups, int64_t n_tiles) {
  const int64_t lines = groups * Prefetch::kUnitLines;
  return {g.Unit(group + groups, 0), static_cast<int>((lines + n_tiles - 1) / std::max<int64_t>(n_tiles, 1))};
}
}  // namespace
}  // namespace kvx::ops::internal
#endif

HWY_BEFORE_NAMESPACE();
namespace kvx::ops::internal {
namespace HWY_NAMESPACE {

using gguf::TensorType;

#define KVX_UNROLL _Pragma("GCC unroll 16")

#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
#if HWY_TARGET == HWY_AVX3_DL
#include "ops/matmul_avx512-inl.h"
#else
#include "ops/matmul_avx2-inl.h"
#endif
// Each x86 target's file defines FloatRows<type>, IntRowsTyped<type> (GGUF
// rows) and InterleavedRows (repacked Q8_0); the dispatch is the same.
void MatMulRowsFloat(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  switch (w.type) {
    case TensorType::kF32: return FloatRows<TensorType::kF32>(w, x, n_tokens, y, r0, r1);
    case TensorType::kF16: return FloatRows<TensorType::kF16>(w, x, n_tokens, y, r0, r1);
    case TensorType::kBF16: return FloatRows<TensorType::kBF16>(w, x, n_tokens, y, r0, r1);
    default: KVX_CHECK_MSG(false, "MatMulRowsFloat: not a float type");
  }
}
void MatMulRowsInt(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  switch (w.type) {
    case TensorType::kQ8_0:
      if (w.layout == WeightLayout::kInterleaved16) return InterleavedRows(w, a, y, r0, r1);
      return IntRowsTyped<TensorType::kQ8_0>(w, a, y, r0, r1);
    case TensorType::kQ4_0: return IntRowsTyped<TensorType::kQ4_0>(w, a, y, r0, r1);
    case TensorType::kQ4_K: return IntRowsTyped<TensorType::kQ4_K>(w, a, y, r0, r1);
    case TensorType::kQ5_K: return IntRowsTyped<TensorType::kQ5_K>(w, a, y, r0, r1);
    case TensorType::kQ6_K: return IntRowsTyped<TensorType::kQ6_K>(w, a, y, r0, r1);
    default: KVX_CHECK_MSG(false, "MatMulRowsInt: not an integer-path type");
  }
}
#else
// ===========================================================================
// Scalar (and targets without dedicated kernels).
// ===========================================================================
void QuantizeActs(const float* x, int64_t t0, int64_t t1, QuantizedActs* a) { QuantizeActsScalar(x, t0, t1, a); }
void MatMulRowsFloat(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  MatMulRowsFloatScalar(w, x, n_tokens, y, r0, r1);
}
void MatMulRowsInt(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  MatMulRowsIntScalar(w, a, y, r0, r1);
}
#endif

#undef KVX_UNROLL

// The string this pass compiled with: what its kernels may use.
const char* TargetFeatures() {
#ifdef HWY_TARGET_STR
  return HWY_TARGET_STR;
#else
  return "";
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kvx::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvx::ops::internal {
HWY_EXPORT(QuantizeActs);
HWY_EXPORT(MatMulRowsFloat);
HWY_EXPORT(MatMulRowsInt);

void QuantizeActsBest(const float* x, int64_t t0, int64_t t1, QuantizedActs* a) {
  HWY_DYNAMIC_DISPATCH(QuantizeActs)(x, t0, t1, a);
}
void MatMulRowsFloatBest(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsFloat)(w, x, n_tokens, y, r0, r1);
}
void MatMulRowsIntBest(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsInt)(w, a, y, r0, r1);
}

// nn_simd.cc is compiled with the same definitions, so these strings hold
// for its kernels too.
std::vector<CompiledTarget> CompiledTargets() {
  std::vector<CompiledTarget> out;
#if HWY_TARGETS & HWY_AVX3_DL
  out.push_back({HWY_AVX3_DL, N_AVX3_DL::TargetFeatures()});
#endif
#if HWY_TARGETS & HWY_AVX2
  out.push_back({HWY_AVX2, N_AVX2::TargetFeatures()});
#endif
  if (out.empty() || (out.back().bit != HWY_STATIC_TARGET && out.front().bit != HWY_STATIC_TARGET)) {
    out.push_back({HWY_STATIC_TARGET, HWY_STATIC_DISPATCH(TargetFeatures)()});
  }
  return out;
}
}  // namespace kvx::ops::internal
#endif
