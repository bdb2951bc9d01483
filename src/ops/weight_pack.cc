#include "ops/weight_pack.h"

#include <string>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "ops/dequant.h"
#include "ops/matmul_internal.h"
#include "ops/quant_blocks.h"
#include "ops/simd_target.h"
#include "util/check.h"

namespace kvx::ops {

using internal::Interleaved16;

bool CanRepack(const WeightView& w) {
  return w.layout == WeightLayout::kRows && w.type == gguf::TensorType::kQ8_0 && w.n_in > 0 &&
         w.n_in % internal::kChunk == 0 && w.n_out > 0 && w.n_out % Interleaved16::kRows == 0;
}

bool RepackingPays() {
  const std::string target = ActiveSimdTarget();
  return target == "AVX3_DL" || target == "AVX2_VNNI" || target == "AVX2";
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Where element (r, 32b + j) of a kInterleaved16 matrix keeps its quant,
// and row r's scale of block b, relative to the buffer: in the unit of r's
// 16-row group and b's chunk, at step j / 4 of half b % 2.
int64_t UnitOffset(const Interleaved16& g, int64_t r, int64_t b) {
  return (r / Interleaved16::kRows * g.n_chunks + b / 2) * Interleaved16::kUnitBytes;
}
size_t QuantOffset(const Interleaved16& g, int64_t r, int64_t b, int j) {
  const int64_t step = (b % 2) * Interleaved16::kSteps + j / 4;
  const int64_t lane = step * Interleaved16::kRows + r % Interleaved16::kRows;
  return static_cast<size_t>(UnitOffset(g, r, b) + lane * 4 + j % 4);
}
size_t ScaleOffset(const Interleaved16& g, int64_t r, int64_t b) {
  const int64_t slot = (b % 2) * Interleaved16::kRows + r % Interleaved16::kRows;
  return static_cast<size_t>(UnitOffset(g, r, b) + Interleaved16::kQuantBytes + slot * 2);
}

// Writes the kInterleaved16 copy of w to dst (64-byte aligned) and returns its view.
WeightView PackInto(const WeightView& w, uint8_t* dst) {
  KVX_CHECK(CanRepack(w));
  WeightView p = w;
  p.data = dst;
  p.row_bytes = RowBytesOf(w.type, w.n_in);
  p.layout = WeightLayout::kInterleaved16;
  const Interleaved16 g = internal::Interleaved16Of(p);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.n_out; ++r) {
    const uint8_t* row = src + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t b = 0; b < w.n_in / kQK8_0; ++b) {
      const uint8_t* blk = row + b * kQ8_0Bytes;
      std::memcpy(dst + ScaleOffset(g, r, b), blk, 2);
      for (int j = 0; j < kQK8_0; ++j) dst[QuantOffset(g, r, b, j)] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
    }
  }
  return p;
}

}  // namespace

PackedWeights PackedWeights::PackAll(std::span<WeightView* const> views, const SourceDone& done) {
  // The distinct source matrices (a tied head is the embedding table), each
  // with its offset in the buffer and, once made, its copy.
  struct Source {
    const void* data;
    size_t bytes;   // of the source rows (their stride may exceed the packed rows')
    size_t offset;  // of the copy in the buffer
    WeightView copy;
  };
  std::vector<Source> sources;
  auto find = [&](const void* data) {
    return std::find_if(sources.begin(), sources.end(), [&](const Source& e) { return e.data == data; });
  };
  size_t total = 0;
  for (const WeightView* w : views) {
    if (!CanRepack(*w) || find(w->data) != sources.end()) continue;
    sources.push_back({w->data, w->row_bytes * static_cast<size_t>(w->n_out), total, {}});
    total += static_cast<size_t>(internal::RoundUp(static_cast<int64_t>(RowBytesOf(w->type, w->n_in) * w->n_out), 64));
  }
  PackedWeights p;
  if (total == 0) return p;
  // A mapping one huge page longer than needed, so that the buffer can start
  // on a huge-page boundary (the kernel backs only aligned 2 MiB ranges).
  p.mapped_ = static_cast<size_t>(internal::RoundUp(static_cast<int64_t>(total), kHugePage)) + kHugePage;
  void* m = mmap(nullptr, p.mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  KVX_CHECK_MSG(m != MAP_FAILED, "out of memory repacking weights");
  p.base_ = static_cast<uint8_t*>(m);
  uint8_t* buf = p.base_ + (kHugePage - reinterpret_cast<uintptr_t>(p.base_) % kHugePage) % kHugePage;
  // Advice only: without transparent huge pages this fails and the buffer
  // stays in ordinary pages.
  (void)madvise(buf, static_cast<size_t>(internal::RoundUp(static_cast<int64_t>(total), kHugePage)), MADV_HUGEPAGE);
  p.bytes_ = total;
  p.count_ = static_cast<int>(sources.size());
  for (WeightView* w : views) {
    if (!CanRepack(*w)) continue;
    const auto source = find(w->data);
    if (source->copy.data == nullptr) source->copy = PackInto(*w, buf + source->offset);
    *w = source->copy;
  }
  if (done) {
    for (const Source& e : sources) done(e.data, e.bytes);
  }
  return p;
}

PackedWeights::~PackedWeights() {
  if (base_ != nullptr) munmap(base_, mapped_);
}

PackedWeights::PackedWeights(PackedWeights&& o) noexcept { *this = std::move(o); }

PackedWeights& PackedWeights::operator=(PackedWeights&& o) noexcept {
  std::swap(base_, o.base_);
  std::swap(mapped_, o.mapped_);
  std::swap(bytes_, o.bytes_);
  std::swap(count_, o.count_);
  return *this;
}

void CopyRowAsStored(const WeightView& w, int64_t r, uint8_t* out) {
  KVX_CHECK(r >= 0 && r < w.n_out);
  if (w.layout == WeightLayout::kRows) {
    std::memcpy(out, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes,
                RowBytesOf(w.type, w.n_in));
    return;
  }
  const Interleaved16 g = internal::Interleaved16Of(w);
  for (int64_t b = 0; b < w.n_in / kQK8_0; ++b) {
    uint8_t* blk = out + b * kQ8_0Bytes;
    std::memcpy(blk, g.base + ScaleOffset(g, r, b), 2);
    for (int j = 0; j < kQK8_0; ++j) blk[2 + j] = static_cast<uint8_t>(g.base[QuantOffset(g, r, b, j)] ^ 0x80);
  }
}

void DequantizeWeightRow(const WeightView& w, int64_t r, float* out) {
  if (w.layout == WeightLayout::kRows) {
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes, out, w.n_in);
    return;
  }
  thread_local std::vector<uint8_t> row;
  row.resize(RowBytesOf(w.type, w.n_in));
  CopyRowAsStored(w, r, row.data());
  DequantizeRow(w.type, row.data(), out, w.n_in);
}

}  // namespace kvx::ops
