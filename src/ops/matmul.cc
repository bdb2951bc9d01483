// MatMul entry points: argument checks, activation quantization, and the
// split of output rows between threads. The kernels themselves are in
// matmul_simd.cc (per SIMD target) and matmul_scalar.cc (reference).
#include "ops/matmul.h"

#include <algorithm>
#include <vector>

#include "ops/dequant.h"
#include "ops/matmul_internal.h"
#include "ops/nn.h"
#include "ops/quant_blocks.h"
#include "ops/weight_pack.h"
#include "util/check.h"

namespace kvx::ops {
namespace {

using internal::kActBlock;
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
thread_local internal::ScratchBuffer tls_swiglu;  // SwiGLUGroups' gate and up columns
thread_local internal::ScratchBuffer tls_ffn;     // FeedForward's SwiGLU output (int8 or float)

void CheckWeight(const WeightView& w) {
  const BlockGeometry g = GetBlockGeometry(w.type);
  KVX_CHECK_MSG(g.block_size != 0, "MatMul: unsupported weight type");
  KVX_CHECK(w.n_in > 0 && w.n_in % g.block_size == 0);
  KVX_CHECK(w.row_bytes >= RowBytesOf(w.type, w.n_in));
}

// x quantized once for the integer-path matrices among ws (all of x's
// tokens, on the pool when large); an empty QuantizedActs when none is.
QuantizedActs QuantizeFor(std::span<const WeightView* const> ws, const float* x, int64_t n_tokens, ThreadPool* pool) {
  bool any_int = false, any_lanes = false;
  for (const WeightView* w : ws) {
    any_int |= internal::IsIntPathType(w->type);
    any_lanes |= internal::IsIntPathType(w->type) && w->layout != WeightLayout::kInterleaved16;
  }
  QuantizedActs acts;
  if (!any_int) return acts;
  const int64_t n_in = ws[0]->n_in;
  void* buf = tls_acts.Get(internal::QuantizedActsBytes(n_tokens, n_in));
  acts = internal::LayoutQuantizedActs(buf, n_tokens, n_in);
  acts.lane_planes = any_lanes;
  const int64_t n_blocks = acts.k_pad / kActBlock;
  if (pool != nullptr && pool->size() > 1 && n_tokens > 1 && n_tokens * n_in >= kParallelQuantizeElems) {
    const size_t grain = std::max<size_t>(1, static_cast<size_t>(n_tokens) / (4 * pool->size()));
    pool->ParallelForDynamic(static_cast<size_t>(n_tokens), grain, [&](size_t b, size_t e, int) {
      internal::QuantizeActsBest(x, n_in, static_cast<int64_t>(b), static_cast<int64_t>(e), 0, n_blocks, &acts);
    });
  } else {
    internal::QuantizeActsBest(x, n_in, 0, n_tokens, 0, n_blocks, &acts);
  }
  return acts;
}

// Rows [r0, r1) of w for every token: y[t * ldy + (r - r0)].
void RunRows(const WeightView& w, const QuantizedActs& acts, const float* x, int64_t n_tokens, float* y, int64_t ldy,
             int64_t r0, int64_t r1) {
  if (internal::IsIntPathType(w.type)) {
    KVX_DCHECK(acts.lane_planes || w.layout == WeightLayout::kInterleaved16);
    internal::MatMulRowsIntBest(w, acts, y, ldy, r0, r1);
  } else {
    internal::MatMulRowsFloatBest(w, x, n_tokens, y, ldy, r0, r1);
  }
}

// Runs fn(gb, ge, thread) over row groups [0, n_groups) on the pool: dynamic
// ranges keep a loaded machine from stalling the loop on a descheduled worker
// (the caller takes over its ranges); each row's result does not depend on
// the range it falls in.
void ForRowGroups(int64_t n_groups, int64_t n_tokens, ThreadPool* pool, ThreadPool::RangeFn fn) {
  if (pool != nullptr && pool->size() > 1 && n_groups > 1) {
    const size_t per_thread = n_tokens == 1 ? kDecodeChunksPerThread : kChunksPerThread;
    const size_t grain = std::max<size_t>(1, static_cast<size_t>(n_groups) / (per_thread * pool->size()));
    pool->ParallelForDynamic(static_cast<size_t>(n_groups), grain, fn);
  } else {
    fn(0, static_cast<size_t>(n_groups), 0);
  }
}

// MatMulMulti with x already quantized into acts (when any matrix needs it).
void MatMulMultiWith(std::span<const MatMulOutput> outputs, const QuantizedActs& acts, const float* x, int64_t n_tokens,
                     ThreadPool* pool) {
  int64_t n_groups = 0;
  std::vector<int64_t> group_begin;  // first row group of each output
  group_begin.reserve(outputs.size() + 1);
  for (const MatMulOutput& o : outputs) {
    group_begin.push_back(n_groups);
    n_groups += (std::max<int64_t>(o.w.n_out, 0) + kRowGroup - 1) / kRowGroup;
  }
  group_begin.push_back(n_groups);
  if (n_groups == 0) return;
  // Row groups [gb, ge) across all outputs, in order.
  ForRowGroups(n_groups, n_tokens, pool, [&](size_t gb, size_t ge, int) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t lo = std::max<int64_t>(static_cast<int64_t>(gb), group_begin[i]);
      const int64_t hi = std::min<int64_t>(static_cast<int64_t>(ge), group_begin[i + 1]);
      if (lo >= hi) continue;
      const WeightView& w = outputs[i].w;
      const int64_t r0 = (lo - group_begin[i]) * kRowGroup;
      const int64_t r1 = std::min(w.n_out, (hi - group_begin[i]) * kRowGroup);
      RunRows(w, acts, x, n_tokens, outputs[i].y + r0, w.n_out, r0, r1);
    }
  });
}

// SwiGLU(gate . x, up . x) in groups of kSwiGLURows rows: each thread
// computes a group of both matrices for every token into L2-resident
// scratch and applies SwiGLU there; the group's result goes to out (row
// stride n_out) or, with h_acts, straight into the int8 activations of the
// next matrix (the group's 32-blocks; the last group also writes the
// padding blocks).
constexpr int64_t kSwiGLURows = 2 * kRowGroup;  // 3 activation blocks
static_assert(kSwiGLURows % kActBlock == 0);

void SwiGLUGroups(const WeightView& gate, const WeightView& up, const float* x, int64_t n_tokens, float* out,
                  QuantizedActs* h_acts, ThreadPool* pool) {
  CheckWeight(gate);
  CheckWeight(up);
  KVX_CHECK(gate.n_in == up.n_in && gate.n_out == up.n_out);
  const WeightView* ws[] = {&gate, &up};
  const QuantizedActs acts = QuantizeFor(ws, x, n_tokens, pool);
  const int64_t n_out = gate.n_out, n_groups = (n_out + kSwiGLURows - 1) / kSwiGLURows;
  ForRowGroups(n_groups, n_tokens, pool, [&](size_t gb, size_t ge, int) {
    float* g = static_cast<float*>(tls_swiglu.Get(sizeof(float) * 2 * static_cast<size_t>(n_tokens) * kSwiGLURows));
    for (size_t grp = gb; grp < ge; ++grp) {
      const int64_t r0 = static_cast<int64_t>(grp) * kSwiGLURows, r1 = std::min(n_out, r0 + kSwiGLURows), m = r1 - r0;
      float* u = g + n_tokens * m;
      RunRows(gate, acts, x, n_tokens, g, m, r0, r1);
      RunRows(up, acts, x, n_tokens, u, m, r0, r1);
      if (h_acts == nullptr) {
        SwiGLURows(g, u, n_tokens, m, out + r0, n_out);
        continue;
      }
      SwiGLURows(g, u, n_tokens, m, g, m);  // in place
      const int64_t b1 = r1 == n_out ? h_acts->k_pad / kActBlock : r1 / kActBlock;
      internal::QuantizeActsBest(g, m, 0, n_tokens, r0 / kActBlock, b1, h_acts);
    }
  });
}

}  // namespace

void MatMulMulti(std::span<const MatMulOutput> outputs, const float* x, int64_t n_tokens, ThreadPool* pool) {
  if (outputs.empty() || n_tokens <= 0) return;
  std::vector<const WeightView*> ws;
  for (const MatMulOutput& o : outputs) {
    CheckWeight(o.w);
    KVX_CHECK(o.w.n_in == outputs[0].w.n_in);
    ws.push_back(&o.w);
  }
  MatMulMultiWith(outputs, QuantizeFor(ws, x, n_tokens, pool), x, n_tokens, pool);
}

void MatMulSwiGLU(const WeightView& gate, const WeightView& up, const float* x, int64_t n_tokens, float* out,
                  ThreadPool* pool) {
  if (n_tokens <= 0) return;
  SwiGLUGroups(gate, up, x, n_tokens, out, nullptr, pool);
}

void FeedForward(const WeightView& gate, const WeightView& up, const WeightView& down, const float* x,
                 int64_t n_tokens, float* out, ThreadPool* pool) {
  CheckWeight(down);
  KVX_CHECK(down.n_in == gate.n_out);
  if (n_tokens <= 0) return;
  const MatMulOutput y[] = {{down, out}};
  if (!internal::IsIntPathType(down.type)) {  // float weights multiply float activations
    float* h = static_cast<float*>(tls_ffn.Get(sizeof(float) * static_cast<size_t>(n_tokens) * down.n_in));
    SwiGLUGroups(gate, up, x, n_tokens, h, nullptr, pool);
    MatMulMultiWith(y, QuantizedActs{}, h, n_tokens, pool);
    return;
  }
  QuantizedActs h_acts = internal::LayoutQuantizedActs(
      tls_ffn.Get(internal::QuantizedActsBytes(n_tokens, down.n_in)), n_tokens, down.n_in);
  h_acts.lane_planes = down.layout != WeightLayout::kInterleaved16;
  SwiGLUGroups(gate, up, x, n_tokens, nullptr, &h_acts, pool);
  MatMulMultiWith(y, h_acts, nullptr, n_tokens, pool);
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
