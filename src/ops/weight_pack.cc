#include "ops/weight_pack.h"

#include <cstring>
#include <vector>

#include "ops/dequant.h"
#include "ops/matmul_internal.h"
#include "ops/quant_blocks.h"
#include "ops/simd_target.h"
#include "util/check.h"

namespace kvx::ops {

using internal::RowGroups4;

bool CanRepack(const WeightView& w) {
  return w.layout == WeightLayout::kRows && w.type == gguf::TensorType::kQ8_0 && w.n_in > 0 &&
         w.n_in % internal::kChunk == 0 && w.n_out > 0 && w.n_out % RowGroups4::kRows == 0;
}

bool RepackingPays() { return ActiveSimdTarget() == "AVX3_DL"; }

PackedWeight PackedWeight::Pack(const WeightView& w) {
  KVX_CHECK(CanRepack(w));
  const size_t row_bytes = RowBytesOf(w.type, w.n_in);
  const size_t bytes = row_bytes * static_cast<size_t>(w.n_out);
  PackedWeight p;
  p.buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, internal::RoundUp(static_cast<int64_t>(bytes), 64))));
  KVX_CHECK_MSG(p.buffer_ != nullptr, "out of memory repacking weights");
  p.view_ = w;
  p.view_.data = p.buffer_.get();
  p.view_.row_bytes = row_bytes;
  p.view_.layout = WeightLayout::kRowGroups4;
  const RowGroups4 g = internal::RowGroups4Of(p.view_);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.n_out; ++r) {
    const uint8_t* row = src + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t c = 0; c < g.n_chunks; ++c) {
      uint8_t* q = g.Quants(r / RowGroups4::kRows, c) + (r % RowGroups4::kRows) * internal::kChunk;
      uint16_t* s = g.Scales(r / RowGroups4::kRows, c) + (r % RowGroups4::kRows) * 2;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* blk = row + (2 * c + h) * kQ8_0Bytes;
        std::memcpy(&s[h], blk, 2);
        for (int j = 0; j < kQK8_0; ++j) q[kQK8_0 * h + j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
      }
    }
  }
  return p;
}

void CopyRowAsStored(const WeightView& w, int64_t r, uint8_t* out) {
  KVX_CHECK(r >= 0 && r < w.n_out);
  if (w.layout == WeightLayout::kRows) {
    std::memcpy(out, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes,
                RowBytesOf(w.type, w.n_in));
    return;
  }
  const RowGroups4 g = internal::RowGroups4Of(w);
  for (int64_t c = 0; c < g.n_chunks; ++c) {
    const uint8_t* q = g.Quants(r / RowGroups4::kRows, c) + (r % RowGroups4::kRows) * internal::kChunk;
    const uint16_t* s = g.Scales(r / RowGroups4::kRows, c) + (r % RowGroups4::kRows) * 2;
    for (int h = 0; h < 2; ++h) {
      uint8_t* blk = out + (2 * c + h) * kQ8_0Bytes;
      std::memcpy(blk, &s[h], 2);
      for (int j = 0; j < kQK8_0; ++j) blk[2 + j] = static_cast<uint8_t>(q[kQK8_0 * h + j] ^ 0x80);
    }
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
