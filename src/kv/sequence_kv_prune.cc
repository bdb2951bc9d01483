// SequenceKV's key-channel pruning (ThinK): the pruned page format
// (kv/pruned_keys.h) written in place of aged packed pages.
#include <string>

#include "kv/codec/codecs.h"
#include "kv/pruned_keys.h"
#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {

size_t SequenceKV::KeyChannelBytes() const {
  size_t n = 0;
  for (const std::vector<int>& kept : kept_channels_) n += kept.size() * sizeof(int);
  return n;
}

Status SequenceKV::PruneKeyChannels(int layer, int kv_head, const std::vector<int>& kept, int recent) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens, D = layout_.head_dim;
  const int nk = static_cast<int>(kept.size());
  if (!pruned::BlockCodec(lc.id, lc.params).has_value()) {
    return InvalidArgument("key-channel pruning (policy think) has no pruned page format for layer " +
                           std::to_string(layer) + "'s codec " + std::string(CodecName(lc.id)) +
                           (IsKivi(lc.id) ? " (keys quantized per channel over a sealed page)" : " with outliers") +
                           "; use codec=f16, f32, int8, int4 or int2 without outliers=");
  }
  if (codec_.pre_rope || keys_rotated()) {
    return InvalidArgument("key-channel pruning (policy think) needs keys stored post-RoPE and unrotated (the "
                           "channels it scores are the ones attention dots); drop prerope=1 / rotate=hadamard");
  }
  if (selection_.enabled) {
    return InvalidArgument("key-channel pruning (policy think) does not combine with Quest page selection; "
                           "use one of the two");
  }
  if (recent < 0) return InvalidArgument("key-channel pruning: recent must be >= 0");
  if (nk < 1 || nk >= D) {
    return InvalidArgument("key-channel pruning keeps 1.." + std::to_string(D - 1) + " of " + std::to_string(D) +
                           " channels, not " + std::to_string(nk));
  }
  for (int i = 0; i < nk; ++i) {
    if (kept[i] < 0 || kept[i] >= D || (i > 0 && kept[i] <= kept[i - 1])) {
      return InvalidArgument("key-channel pruning: kept channels must be ascending and in 0.." +
                             std::to_string(D - 1));
    }
  }
  std::vector<int>& mask = kept_channels_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  if (!mask.empty() && mask != kept) {
    return InvalidArgument("key-channel pruning: (layer " + std::to_string(layer) + ", kv head " +
                           std::to_string(kv_head) + ") already keeps another channel set; one mask per table");
  }
  const pruned::Shape shape = pruned::ShapeFor(lc.id, lc.params, nk);
  const size_t bytes = shape.page_bytes;
  if (bytes >= lc.packed_page_bytes) {
    return InvalidArgument("key-channel pruning to " + std::to_string(nk) + " of " + std::to_string(D) +
                           " channels saves nothing at this page size and codec (" + std::string(CodecName(lc.id)) +
                           " stores key channels in multiples of " + std::to_string(shape.row_unit) +
                           "); prune more channels");
  }
  PageTable& t = mutable_table(layer, kv_head);
  if (t.has_entry_scales()) {
    return InvalidArgument("key-channel pruning of a table merged across layers (policy minicache): its pages are "
                           "shared with another layer's table; run think without minicache");
  }
  // The first slot of the last `recent` live entries: pages wholly before it age out.
  int cut = t.length(), seen = 0;
  for (int p = t.num_pages() - 1; p >= 0 && seen < recent; --p) {
    const int32_t* pos = PagePositions(pool_->PageData(t.pages()[p]));
    for (int s = t.EntriesInPage(p, T) - 1; s >= 0 && seen < recent; --s) {
      if (pos[s] == kDeadPosition) continue;
      ++seen;
      cut = p * T + s;
    }
  }
  if (seen < recent) cut = 0;  // fewer live entries than the window: none ages out
  int cls = PrunedSizeClass(bytes);
  if (cls < 0) {
    KVX_ASSIGN_OR_RETURN(cls, pool_->AddSizeClass(bytes));
    pruned_classes_.emplace_back(bytes, cls);
  }
  mask = kept;
  // The last page of a row-wise layer still takes appends (and a partial
  // page is never whole): only full pages before `cut` are rewritten.
  const int last = cut / T;
  const FormatCodec from = format_codec(layer, kPagePacked);
  // Values the packed page stores as the pruned one does are copied as they
  // are (quantized values are not quantized again); f32 ones become f16.
  const bool copy_values = pruned::SharesValueBlock(shape, lc.id);
  std::vector<float> k(static_cast<size_t>(T) * D), v(copy_values ? 0 : k.size());
  for (int p = lc.sink_pages; p < last; ++p) {
    if (t.format(p) != kPagePacked) continue;
    Result<PageId> id = pool_->AllocateAfter(cls, p > 0 ? t.pages()[p - 1] : kNoPage);
    if (!id.ok()) return id.status();
    const PageId old = t.pages()[p];
    const uint8_t* src = pool_->PageData(old);
    uint8_t* dst = pool_->PageData(*id);
    std::copy(PagePositions(src), PagePositions(src) + T, PagePositions(dst));
    const uint8_t* src_data = src + PageDataOffset(T);
    uint8_t* dst_data = dst + PageDataOffset(T);
    DispatchCodec(from.id, [&](auto codec) {
      using C = decltype(codec);
      C::DecodeKeys(*from.params, src_data, T, k.data());
      if (!copy_values) C::DecodeValues(*from.params, src_data, T, v.data());
    });
    pruned::EncodeKeys(shape, kept, dst_data, T, k.data());
    if (copy_values) {
      pruned::CopyValueBlock(shape, src_data, dst_data);
    } else {
      pruned::EncodeValues(shape, dst_data, T, v.data());
    }
    t.ReplacePage(p, *id, kPagePruned);  // same slots and live count
    pool_->Unref(old);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
