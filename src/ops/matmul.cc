// MatMul entry points: argument checks, activation quantization, and the
// split of output rows between threads. The kernels themselves are in
// matmul_simd.cc (per SIMD target) and matmul_scalar.cc (reference).
#include "ops/matmul.h"

#include <algorithm>
#include <vector>

#include "ops/dequant.h"
#include "ops/matmul_internal.h"
#include "ops/quant_blocks.h"
#include "ops/weight_pack.h"
#include "util/check.h"

namespace kvx::ops {
namespace {

using internal::QuantizedActs;

// Rows are handed to threads in groups of this many (a multiple of the
// micro-kernels' row counts, 4 and 6, and of the 16-row groups of repacked
// Q8_0 matrices), so only the last group of a matrix is partial.
constexpr int64_t kRowGroup = 48;
// Ranges per thread of the dynamic row split: for batches (prefill), where a
// range is milliseconds of work; for one token (decode), where a whole
// matrix is a few microseconds, one per thread. Each range restarts the
// prefetch streams (and, when measured, also cost a claim on a shared cache
// line: ~0.5 us per range on a 2-core Zen 5 VM, where decode at depth 0 ran
// 340 tok/s with 4 ranges per thread against 420 with 1; kvx bench,
// smollm2-135m q8_0).
constexpr size_t kChunksPerThread = 4, kDecodeChunksPerThread = 1;
// Quantize activations on several threads above this many elements.
constexpr int64_t kParallelQuantizeElems = 1 << 15;

thread_local internal::ScratchBuffer tls_acts;

void CheckWeight(const WeightView& w) {
  const BlockGeometry g = GetBlockGeometry(w.type);
  KVX_CHECK_MSG(g.block_size != 0, "MatMul: unsupported weight type");
  KVX_CHECK(w.n_in > 0 && w.n_in % g.block_size == 0);
  KVX_CHECK(w.row_bytes >= RowBytesOf(w.type, w.n_in));
}

}  // namespace

void MatMulMulti(std::span<const MatMulOutput> outputs, const float* x, int64_t n_tokens, ThreadPool* pool) {
  if (outputs.empty() || n_tokens <= 0) return;
  const int64_t n_in = outputs[0].w.n_in;
  bool any_int = false, any_lanes = false;
  int64_t n_groups = 0;
  std::vector<int64_t> group_begin;  // first row group of each output
  group_begin.reserve(outputs.size() + 1);
  for (const MatMulOutput& o : outputs) {
    CheckWeight(o.w);
    KVX_CHECK(o.w.n_in == n_in);
    any_int |= internal::IsIntPathType(o.w.type);
    any_lanes |= internal::IsIntPathType(o.w.type) && o.w.layout != WeightLayout::kInterleaved16;
    group_begin.push_back(n_groups);
    n_groups += (std::max<int64_t>(o.w.n_out, 0) + kRowGroup - 1) / kRowGroup;
  }
  group_begin.push_back(n_groups);
  if (n_groups == 0) return;
  const bool threaded = pool != nullptr && pool->size() > 1;

  QuantizedActs acts;
  if (any_int) {
    void* buf = tls_acts.Get(internal::QuantizedActsBytes(n_tokens, n_in));
    acts = internal::LayoutQuantizedActs(buf, n_tokens, n_in);
    acts.lane_planes = any_lanes;
    if (threaded && n_tokens > 1 && n_tokens * n_in >= kParallelQuantizeElems) {
      const size_t grain = std::max<size_t>(1, static_cast<size_t>(n_tokens) / (4 * pool->size()));
      pool->ParallelForDynamic(static_cast<size_t>(n_tokens), grain, [&](size_t b, size_t e, int) {
        internal::QuantizeActsBest(x, static_cast<int64_t>(b), static_cast<int64_t>(e), &acts);
      });
    } else {
      internal::QuantizeActsBest(x, 0, n_tokens, &acts);
    }
  }

  // Row groups [gb, ge) across all outputs, in order.
  auto run = [&](size_t gb, size_t ge, int) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t lo = std::max<int64_t>(static_cast<int64_t>(gb), group_begin[i]);
      const int64_t hi = std::min<int64_t>(static_cast<int64_t>(ge), group_begin[i + 1]);
      if (lo >= hi) continue;
      const WeightView& w = outputs[i].w;
      const int64_t r0 = (lo - group_begin[i]) * kRowGroup;
      const int64_t r1 = std::min(w.n_out, (hi - group_begin[i]) * kRowGroup);
      if (internal::IsIntPathType(w.type)) {
        KVX_DCHECK(acts.lane_planes || w.layout == WeightLayout::kInterleaved16);
        internal::MatMulRowsIntBest(w, acts, outputs[i].y, r0, r1);
      } else {
        internal::MatMulRowsFloatBest(w, x, n_tokens, outputs[i].y, r0, r1);
      }
    }
  };
  if (threaded && n_groups > 1) {
    // Dynamic ranges keep a loaded machine from stalling the loop on a
    // descheduled worker (the caller takes over its ranges); each row's
    // result does not depend on the range it falls in.
    const size_t per_thread = n_tokens == 1 ? kDecodeChunksPerThread : kChunksPerThread;
    const size_t grain = std::max<size_t>(1, static_cast<size_t>(n_groups) / (per_thread * pool->size()));
    pool->ParallelForDynamic(static_cast<size_t>(n_groups), grain, run);
  } else {
    run(0, static_cast<size_t>(n_groups), 0);
  }
}

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  const MatMulOutput out{w, y};
  MatMulMulti({&out, 1}, x, n_tokens, pool);
}

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  for (int64_t o = 0; o < w.n_out; ++o) {
    DequantizeWeightRow(w, o, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0;
      const float* xt = x + t * w.n_in;
      for (int64_t i = 0; i < w.n_in; ++i) sum += static_cast<double>(row[i]) * xt[i];
      y[t * w.n_out + o] = static_cast<float>(sum);
    }
  }
}

}  // namespace kvx::ops
