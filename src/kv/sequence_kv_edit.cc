// SequenceKV's single-table mutators, called between steps by the eviction
// and merging policies: RemoveEntries, Compact, RewriteEntries, SetPositions,
// and the copy-on-write of shared pages they share (MakePagesPrivate).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {

Status SequenceKV::MakePagesPrivate(PageTable& t, const std::vector<int>& pages) {
  // Allocate every copy first, so a full pool changes nothing.
  std::vector<std::pair<int, PageId>> copies;
  for (int p : pages) {
    if (!pool_->IsShared(t.pages()[p])) continue;
    Result<PageId> copy = pool_->AllocateAfter(pool_->SizeClassOf(t.pages()[p]), t.pages()[p]);
    if (!copy.ok()) {
      for (auto& c : copies) pool_->Unref(c.second);
      return copy.status();
    }
    copies.emplace_back(p, *copy);
  }
  for (auto& [p, copy] : copies) {
    const PageId cur = t.pages()[p];
    std::memcpy(pool_->PageData(copy), pool_->PageData(cur), pool_->PageBytesOf(cur));
    t.ReplacePage(p, copy, t.format(p));
    pool_->Unref(cur);
  }
  return Status::Ok();
}

Status SequenceKV::SetPositions(int layer, int kv_head, const std::vector<int>& slots,
                                const std::vector<int32_t>& positions) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  if (slots.size() != positions.size()) return InvalidArgument("SetPositions: slots and positions differ in length");
  PageTable& t = mutable_table(layer, kv_head);
  const int T = layout_.page_tokens;
  std::vector<int> pages;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int slot = slots[i];
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " + std::to_string(t.length()));
    }
    if (PagePositions(pool_->PageData(t.pages()[slot / T]))[slot % T] == kDeadPosition) {
      return InvalidArgument("slot " + std::to_string(slot) + " is dead; only live entries get new positions");
    }
    if (positions[i] < 0 || positions[i] == kDeadPosition || positions[i] > max_pos_) {
      return InvalidArgument("position " + std::to_string(positions[i]) + " is outside 0.." + std::to_string(max_pos_) +
                             " (the positions appended so far)");
    }
    pages.push_back(slot / T);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, pages));
  for (size_t i = 0; i < slots.size(); ++i) {
    PagePositions(pool_->PageData(t.pages()[slots[i] / T]))[slots[i] % T] = positions[i];
  }
  return Status::Ok();
}

Status SequenceKV::RemoveEntries(int layer, int kv_head, const std::vector<int>& slots) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  PageTable& t = mutable_table(layer, kv_head);
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens;
  // Group the live slots to kill by page.
  std::vector<std::pair<int, int>> kills;  // (page, slot in page)
  for (int slot : slots) {
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " +
                             std::to_string(t.length()) + " slots");
    }
    const int p = slot / T, s = slot % T;
    if (PagePositions(pool_->PageData(t.pages()[p]))[s] == kDeadPosition) continue;
    kills.emplace_back(p, s);
  }
  std::sort(kills.begin(), kills.end());
  kills.erase(std::unique(kills.begin(), kills.end()), kills.end());
  if (kills.empty()) return Status::Ok();
  // Pages that keep live entries need a private copy (when shared) before
  // their positions change; pages about to leave the chain do not.
  std::vector<int> kept;
  for (size_t i = 0; i < kills.size();) {
    const int p = kills[i].first;
    size_t j = i;
    while (j < kills.size() && kills[j].first == p) ++j;
    const int left = t.live_in_page(p) - static_cast<int>(j - i);
    if (left != 0 || p < lc.sink_pages) kept.push_back(p);
    i = j;
  }
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, kept));
  // Count the kills first: a page about to leave the chain is not written
  // (it may be shared, and was not copied).
  for (const auto& [p, s] : kills) t.KillSlot(p);
  for (const auto& [p, s] : kills) {
    if (t.live_in_page(p) == 0 && p >= lc.sink_pages) continue;
    PagePositions(pool_->PageData(t.pages()[p]))[s] = kDeadPosition;
  }
  // Emptied pages leave the chain at once (last first, so indices hold);
  // sink pages stay, as the codec rules count them by index.
  for (int p = t.num_pages() - 1; p >= lc.sink_pages; --p) {
    if (t.live_in_page(p) != 0) continue;
    const PageId id = t.pages()[p];
    t.RemovePage(p, T);
    pool_->Unref(id);
  }
  return Status::Ok();
}

Status SequenceKV::Compact(int layer, int kv_head) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  PageTable& t = mutable_table(layer, kv_head);
  // A table sharing pages with another layer's (ShareEntries) is left as it
  // is: compacting would copy the shared pages into private ones, and its
  // runs are already dense but for one padded page per run.
  if (t.has_entry_scales()) return Status::Ok();
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens, D = layout_.head_dim;
  // The region that can be rewritten: after the sink pages, before the
  // staging pages of a sealed layer (they seal as they are) or, for
  // row-wise codecs, before the last page (appends still write into it).
  int end = FirstMutablePage(lc, t, t.length());
  if (!lc.sealed) end = std::min(end, t.num_pages() - 1);
  int first = lc.sink_pages;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  DecodedPage dp;
  // Runs of source pages whose live entries fill at most kCompactRunPages
  // new pages, each written and swapped in before the next: the new pages
  // of a run are allocated before its sources are freed, so a pool that is
  // nearly full (a policy compressing a context that filled its budget)
  // needs only a run's worth of free pages, not the whole table's.
  while (first < end) {
    while (first < end && t.live_in_page(first) == T) ++first;  // already dense
    int last = first, live = 0;
    // A run holds pages of one format (demoted pages pack among themselves).
    while (last < end && t.format(last) == t.format(first) && live + t.live_in_page(last) <= kCompactRunPages * T) {
      live += t.live_in_page(last++);
    }
    if (last - first < 2) {
      first = last;
      continue;
    }
    const int n_new = (live + T - 1) / T;
    if (n_new >= last - first) {  // nothing to gain in this run
      first = last;
      continue;
    }
    const PageFormat format = t.format(first);
    const FormatCodec fc = format_codec(layer, format, kv_head);
    std::vector<PageId> ids;
    PageId before = first > 0 ? t.pages()[first - 1] : kNoPage;
    for (int i = 0; i < n_new; ++i) {
      Result<PageId> id = pool_->AllocateAfter(pool_->SizeClassOf(t.pages()[first]), before);
      if (!id.ok()) {
        for (PageId x : ids) pool_->Unref(x);
        return id.status();
      }
      ids.push_back(*id);
      before = *id;
    }
    if (format == kPagePruned) {
      // Pruned pages are row-wise in every block codec: their live rows are
      // copied as stored (a quantized row is not quantized again), the last
      // page's dead slots padded with copies of the last live row.
      const pruned::Shape shape = fc.pruned_shape();
      std::vector<std::pair<int, int>> rows;  // (source page, slot), chain order
      for (int p = first; p < last; ++p) {
        const int32_t* pp = PagePositions(pool_->PageData(t.pages()[p]));
        for (int s = 0; s < T; ++s) {
          if (pp[s] != kDeadPosition) rows.emplace_back(p, s);
        }
      }
      KVX_CHECK(static_cast<int>(rows.size()) == live);
      std::vector<int> lives;
      for (int i = 0; i < n_new; ++i) {
        lives.push_back(std::min(T, live - i * T));
        uint8_t* dst = pool_->PageData(ids[i]);
        for (int s = 0; s < T; ++s) {
          const auto [p, from] = rows[std::min(static_cast<size_t>(i) * T + s, rows.size() - 1)];
          const uint8_t* src = pool_->PageData(t.pages()[p]);
          PagePositions(dst)[s] = i * T + s < live ? PagePositions(src)[from] : kDeadPosition;
          pruned::CopyRow(shape, src + PageDataOffset(T), from, dst + PageDataOffset(T), s);
        }
      }
      std::vector<PageId> old(t.pages().begin() + first, t.pages().begin() + last);
      t.ReplaceRun(first, last, ids, format, lives, T);
      for (PageId id : old) pool_->Unref(id);
      end -= (last - first) - n_new;
      first += n_new;
      continue;
    }
    // Gather the run's live entries in chain order (their stored form
    // decoded: rotated, pre-RoPE keys un-roped, as they were encoded).
    k.clear();
    v.clear();
    pos.clear();
    for (int p = first; p < last; ++p) {
      DecodePage(*pool_, fc, t.pages()[p], T, &dp);
      for (int s = 0; s < T; ++s) {
        if (dp.pos[s] == kDeadPosition) continue;
        pos.push_back(dp.pos[s]);
        k.insert(k.end(), dp.k.begin() + static_cast<size_t>(s) * D, dp.k.begin() + static_cast<size_t>(s + 1) * D);
        v.insert(v.end(), dp.v.begin() + static_cast<size_t>(s) * D, dp.v.begin() + static_cast<size_t>(s + 1) * D);
      }
    }
    KVX_CHECK(static_cast<int>(pos.size()) == live);
    // Pad the last page's dead slots with copies of the last live entry (a
    // page codec's per-channel ranges then see no made-up values).
    std::vector<int> lives;
    for (int i = 0; i < n_new; ++i) lives.push_back(std::min(T, live - i * T));
    while (static_cast<int>(pos.size()) < n_new * T) {
      pos.push_back(kDeadPosition);
      k.insert(k.end(), k.end() - D, k.end());
      v.insert(v.end(), v.end() - D, v.end());
    }
    for (int i = 0; i < n_new; ++i) {
      const size_t off = static_cast<size_t>(i) * T;
      EncodeInto(pool_, fc, ids[i], T, &k[off * D], &v[off * D], &pos[off]);
    }
    std::vector<PageId> old(t.pages().begin() + first, t.pages().begin() + last);
    t.ReplaceRun(first, last, ids, format, lives, T);
    for (PageId id : old) pool_->Unref(id);
    if (t.bounds_dim() > 0) {
      for (int i = 0; i < n_new; ++i) RefreshBounds(layer, t, first + i);
    }
    end -= (last - first) - n_new;
    first += n_new;  // a partial last page stays as it is (no second re-encoding)
  }
  return Status::Ok();
}

Status SequenceKV::RewriteEntries(int layer, int kv_head, const std::vector<int>& slots, const float* k,
                                  const float* v) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  PageTable& t = mutable_table(layer, kv_head);
  const int T = layout_.page_tokens, D = layout_.head_dim;
  std::vector<int> pages;  // touched, ascending
  for (int slot : slots) {
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " + std::to_string(t.length()));
    }
    if (PagePositions(pool_->PageData(t.pages()[slot / T]))[slot % T] == kDeadPosition) {
      return InvalidArgument("slot " + std::to_string(slot) + " holds no live entry to rewrite");
    }
    pages.push_back(slot / T);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  // Private copies of shared pages first (all or nothing).
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, pages));
  // Each touched page: decode, replace the rows (in the stored basis), re-encode in place.
  std::vector<float> row_k(D), row_v(D);
  DecodedPage dp;
  for (int p : pages) {
    const FormatCodec fc = format_codec(layer, t.format(p), kv_head);
    const int n = fc.whole_pages ? T : t.EntriesInPage(p, T);
    if (fc.kept == nullptr) DecodePage(*pool_, fc, t.pages()[p], n, &dp);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] / T != p) continue;
      std::memcpy(row_k.data(), k + i * D, sizeof(float) * D);
      std::memcpy(row_v.data(), v + i * D, sizeof(float) * D);
      if (rotation_ != nullptr) {
        if (keys_rotated()) rotation_->Forward(row_k.data());
        rotation_->Forward(row_v.data());
      }
      const size_t s = static_cast<size_t>(slots[i] % T);
      if (fc.kept != nullptr) {  // row-wise: only the rewritten rows are encoded, the others stay as stored
        pruned::EncodeRow(fc.pruned_shape(), *fc.kept, pool_->PageData(t.pages()[p]) + PageDataOffset(T),
                          static_cast<int>(s), row_k.data(), row_v.data());
        continue;
      }
      std::copy(row_k.begin(), row_k.end(), dp.k.begin() + s * D);
      std::copy(row_v.begin(), row_v.end(), dp.v.begin() + s * D);
    }
    if (fc.kept == nullptr) EncodeInto(pool_, fc, t.pages()[p], n, dp.k.data(), dp.v.data(), dp.pos.data());
    if (t.bounds_dim() > 0) RefreshBounds(layer, t, p);
  }
  if (t.has_entry_scales()) {  // the rows given are what attention reads: stored as they are
    for (int slot : slots) t.SetEntryScales(slot, 1.0f, 1.0f);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
