// SequenceKV's page formats (page_table.h): the codec of each format, the
// page-level decode/encode every copy path shares, and MiKV's demotion.
#include <algorithm>
#include <optional>
#include <string>

#include "kv/codec/codecs.h"
#include "kv/pruned_keys.h"
#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {

void DecodePage(const BlockPool& pool, const SequenceKV::FormatCodec& fc, PageId id, int slots, DecodedPage* out) {
  const CodecParams& params = *fc.params;
  const int T = params.page_tokens, D = params.head_dim;
  const uint8_t* page = pool.PageData(id);
  out->k.resize(static_cast<size_t>(slots) * D);
  out->v.resize(out->k.size());
  out->pos.assign(PagePositions(page), PagePositions(page) + slots);
  const uint8_t* data = page + PageDataOffset(T);
  if (fc.kept != nullptr) return pruned::Decode(fc.pruned_shape(), *fc.kept, data, slots, out->k.data(), out->v.data());
  DispatchCodec(fc.id, [&](auto codec) {
    // Page codecs decode whole pages (per-channel parameters over all T slots).
    using C = decltype(codec);
    if constexpr (!C::kRowWise) KVX_CHECK(slots == T);
    C::DecodeKeys(params, data, slots, out->k.data());
    C::DecodeValues(params, data, slots, out->v.data());
  });
}

void EncodeInto(BlockPool* pool, const SequenceKV::FormatCodec& fc, PageId id, int n, const float* k, const float* v,
                const int32_t* pos) {
  const CodecParams& params = *fc.params;
  const int T = params.page_tokens, D = params.head_dim;
  uint8_t* page = pool->PageData(id);
  std::copy(pos, pos + n, PagePositions(page));
  uint8_t* data = page + PageDataOffset(T);
  if (fc.kept != nullptr) return pruned::Encode(fc.pruned_shape(), *fc.kept, data, n, k, v);
  DispatchCodec(fc.id, [&](auto codec) {
    using C = decltype(codec);
    if (fc.whole_pages) {
      KVX_CHECK(n == T);
      C::EncodePage(params, data, T, k, v);
    } else if constexpr (C::kRowWise) {
      for (int s = 0; s < n; ++s) {
        C::EncodeRow(params, data, s, k + static_cast<size_t>(s) * D, v + static_cast<size_t>(s) * D);
      }
    } else {
      KVX_CHECK_MSG(false, "page codec without sealing");
    }
  });
}

SequenceKV::FormatCodec SequenceKV::format_codec(int layer, PageFormat format, int kv_head) const {
  const LayerCodec& lc = layers_[layer];
  switch (format) {
    case kPagePruned: {
      KVX_CHECK_MSG(kv_head >= 0, "a pruned page's codec needs its kv head (its channel mask)");
      const std::vector<int>& kept = kept_channels_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
      KVX_CHECK_MSG(!kept.empty(), "a pruned page in a table without a channel mask");
      const std::optional<CodecId> block = pruned::BlockCodec(lc.id, lc.params);
      KVX_CHECK_MSG(block.has_value(), "a pruned page in a layer whose codec has no pruned format");
      return {*block, &lc.params, false, &kept};
    }
    case kPagePacked: return {lc.id, &lc.params, lc.sealed};
    case kPageFull: return {CodecId::kF16, &lc.params, false};
    case kPageDemoted:
      KVX_CHECK_MSG(demote_id_ != CodecId::kF16, "a demoted page without a demotion codec");
      return {demote_id_, &demote_params_, true};
  }
  KVX_CHECK_MSG(false, "unknown page format");
  return {};
}

Status SequenceKV::SetDemotionCodec(CodecId id) {
  const std::string name(CodecName(id));
  if (!IsQuantized(id)) {
    return InvalidArgument("demotion codec " + name + " is not a low-bit codec; use int2, int4, int8, kivi2 or kivi4");
  }
  if (id == demote_id_) return Status::Ok();
  if (demote_class_ >= 0) {
    return InvalidArgument("this sequence already demotes to " + std::string(CodecName(demote_id_)) +
                           "; one demotion codec per sequence (use the same demote= in every policy group)");
  }
  if (layout_.head_dim % 8 != 0) {
    return InvalidArgument("demotion codec " + name + " needs head_dim % 8 == 0, this model has head_dim " +
                           std::to_string(layout_.head_dim) + "; use fate=drop");
  }
  CodecConfig config(id);
  config.residual = 0;
  const LayerCodec resolved = ResolveLayers(layout_, config)[0];
  if (IsKivi(id) && resolved.params.page_tokens * resolved.params.k_bits % 8 != 0) {
    return InvalidArgument("demotion codec " + name + " quantizes keys per channel over a page, which needs at least " +
                           "4 tokens per page (page=" + std::to_string(layout_.page_tokens) +
                           "); use demote=int2 or a larger page=");
  }
  demote_id_ = id;
  demote_params_ = resolved.params;
  demote_page_bytes_ = resolved.packed_page_bytes;
  return Status::Ok();
}

int SequenceKV::LiveEntriesIn(int layer, int kv_head, PageFormat format) const {
  const PageTable& t = table(layer, kv_head);
  int n = 0;
  for (int p = 0; p < t.num_pages(); ++p) n += t.format(p) == format ? t.live_in_page(p) : 0;
  return n;
}

Status SequenceKV::DemoteEntries(int layer, int kv_head, const std::vector<int>& slots) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  if (demote_id_ == CodecId::kF16) return InvalidArgument("DemoteEntries: no demotion codec (SetDemotionCodec)");
  PageTable& t = mutable_table(layer, kv_head);
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens, D = layout_.head_dim;
  // The live entries to demote, chain order. Sink pages stay as they are
  // (f16 for ever by the codec's rule, and the insertion point is after
  // them); entries already demoted stay where they are.
  std::vector<int> todo;
  for (int slot : slots) {
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " +
                             std::to_string(t.length()) + " slots");
    }
    const int p = slot / T;
    if (p < lc.sink_pages || t.format(p) == kPageDemoted) continue;
    if (PagePositions(pool_->PageData(t.pages()[p]))[slot % T] == kDeadPosition) continue;
    todo.push_back(slot);
  }
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  if (todo.empty()) return Status::Ok();
  if (demote_class_ < 0) {
    KVX_ASSIGN_OR_RETURN(demote_class_, pool_->AddSizeClass(demote_page_bytes_));
  }

  // Their rows as stored, gathered page by page.
  const int n = static_cast<int>(todo.size());
  int n_new = 0;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  DecodedPage dp;
  for (size_t i = 0; i < todo.size();) {
    const int p = todo[i] / T;
    const FormatCodec fc = format_codec(layer, t.format(p), kv_head);
    DecodePage(*pool_, fc, t.pages()[p], fc.whole_pages ? T : t.EntriesInPage(p, T), &dp);
    for (; i < todo.size() && todo[i] / T == p; ++i) {
      const size_t s = static_cast<size_t>(todo[i] % T);
      pos.push_back(dp.pos[s]);
      k.insert(k.end(), dp.k.begin() + s * D, dp.k.begin() + (s + 1) * D);
      v.insert(v.end(), dp.v.begin() + s * D, dp.v.begin() + (s + 1) * D);
    }
  }
  // With a row-wise demotion codec, the dead slots of the demoted pages are
  // filled first (rows encoded one by one: nothing already demoted is
  // quantized again), so demotion during decode (a few entries per step)
  // does not leave a page per step; page codecs (kivi) get new pages, which
  // Compact packs.
  const FormatCodec demoted = format_codec(layer, kPageDemoted);
  std::vector<std::pair<int, int>> free_slots;  // (page, slot) in the demoted run
  const bool row_wise = DispatchCodec(demote_id_, [](auto codec) { return decltype(codec)::kRowWise; });
  if (row_wise) {
    for (int p = std::min(lc.sink_pages, t.num_pages());
         p < t.num_pages() && t.format(p) == kPageDemoted && static_cast<int>(free_slots.size()) < n; ++p) {
      const int32_t* pp = PagePositions(pool_->PageData(t.pages()[p]));
      for (int s = 0; s < T && static_cast<int>(free_slots.size()) < n; ++s) {
        if (pp[s] == kDeadPosition) free_slots.emplace_back(p, s);
      }
    }
  }
  const int n_fill = static_cast<int>(free_slots.size()), n_rest = n - n_fill;
  n_new = (n_rest + T - 1) / T;
  // Pad the last new page's dead slots with copies of the last row (the
  // codec's ranges then see no made-up values), as Compact does.
  while (static_cast<int>(pos.size()) < n_fill + n_new * T) {
    pos.push_back(kDeadPosition);
    k.insert(k.end(), k.end() - D, k.end());
    v.insert(v.end(), v.end() - D, v.end());
  }
  std::vector<int> fill_pages;
  for (const auto& [p, s] : free_slots) {
    if (fill_pages.empty() || fill_pages.back() != p) fill_pages.push_back(p);
  }
  // Private copies of shared pages to fill, and the new pages, before
  // anything changes (a copy leaves the content as it was).
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, fill_pages));
  std::vector<PageId> ids;
  PageId before = kNoPage;
  for (int i = 0; i < n_new; ++i) {
    Result<PageId> id = pool_->AllocateAfter(demote_class_, before);
    if (!id.ok()) {
      for (PageId x : ids) pool_->Unref(x);
      return id.status();
    }
    ids.push_back(*id);
    before = *id;
  }
  if (Status s = RemoveEntries(layer, kv_head, todo); !s.ok()) {
    for (PageId x : ids) pool_->Unref(x);
    return s;
  }
  // RemoveEntries removed only pages after the demoted run (sinks stay, and
  // no demoted entry was removed), so free_slots' page indices hold.
  DispatchCodec(demote_id_, [&](auto codec) {
    using C = decltype(codec);
    if constexpr (C::kRowWise) {
      for (int i = 0; i < n_fill; ++i) {
        const auto [p, s] = free_slots[i];
        uint8_t* page = pool_->PageData(t.pages()[p]);
        PagePositions(page)[s] = pos[i];
        C::EncodeRow(*demoted.params, page + PageDataOffset(T), s, &k[static_cast<size_t>(i) * D],
                     &v[static_cast<size_t>(i) * D]);
        t.SetPageLive(p, t.live_in_page(p) + 1);
      }
    }
  });
  std::vector<int> lives;
  for (int i = 0; i < n_new; ++i) {
    const size_t off = static_cast<size_t>(n_fill) + static_cast<size_t>(i) * T;
    EncodeInto(pool_, demoted, ids[i], T, &k[off * D], &v[off * D], &pos[off]);
    lives.push_back(std::min(T, n_rest - i * T));
  }
  if (t.bounds_dim() > 0) {
    for (int p : fill_pages) RefreshBounds(layer, t, p);
  }
  // After the sink pages and the demoted pages already there: whole pages,
  // so the chain's geometry (every page but the last holds T slots) holds.
  int at = std::min(lc.sink_pages, t.num_pages());
  while (at < t.num_pages() && t.format(at) == kPageDemoted) ++at;
  KVX_CHECK(at < t.num_pages() || t.length() % T == 0);
  t.ReplaceRun(at, at, ids, kPageDemoted, lives, T);
  if (t.bounds_dim() > 0) {
    for (int i = 0; i < n_new; ++i) RefreshBounds(layer, t, at + i);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
