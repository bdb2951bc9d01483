// SequenceKV::Import: rebuilding a sequence's tables from saved pages
// (engine/session_file.h). Kept apart from sequence_kv.cc, which writes pages
// from K/V rows; this file only checks and copies pages as they were stored.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"

namespace kvx::kv {

Status SequenceKV::Import(const std::vector<TableImage>& tables, const SequenceKV* prefix, int prefix_pages) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  for (const PageTable& t : tables_) KVX_CHECK_MSG(t.empty(), "Import needs an empty sequence");
  const int T = layout_.page_tokens, H = layout_.n_kv_heads;
  if (tables.size() != tables_.size()) {
    return DataLoss("the image has " + std::to_string(tables.size()) + " page tables, this model's cache has " +
                    std::to_string(tables_.size()) + " (layers x kv heads)");
  }
  KVX_RETURN_IF_ERROR(EnsureSizeClasses());
  if (prefix == nullptr) prefix_pages = 0;
  // Shared pages: the prefix's, as it holds them (its format, its bytes).
  auto shared = [&](size_t, size_t page) { return static_cast<int>(page) < prefix_pages; };
  for (size_t i = 0; i < tables.size() && prefix_pages > 0; ++i) {
    const PageTable& from = prefix->tables_[i];
    if (from.num_pages() < prefix_pages || from.length() < prefix_pages * T ||
        tables[i].pages.size() < static_cast<size_t>(prefix_pages)) {
      return InvalidArgument("the shared prefix of " + std::to_string(prefix_pages) +
                             " pages is longer than the sequence or the image");
    }
    for (int p = 0; p < prefix_pages; ++p) {
      if (from.live_in_page(p) != T) return InvalidArgument("the shared prefix holds dead entries");
    }
  }

  // 1. Check every table before allocating anything.
  int32_t max_pos = -1;
  for (size_t i = 0; i < tables.size(); ++i) {
    const int l = static_cast<int>(i) / H, h = static_cast<int>(i) % H;
    const TableImage& im = tables[i];
    const LayerCodec& lc = layers_[l];
    const std::string where = "table (layer " + std::to_string(l) + ", kv head " + std::to_string(h) + ")";
    const size_t np = im.pages.size();
    if (im.length < 0 || im.full.size() != np || np != static_cast<size_t>((im.length + T - 1) / T)) {
      return DataLoss(where + ": " + std::to_string(np) + " pages do not hold " + std::to_string(im.length) +
                      " slots of " + std::to_string(T));
    }
    bool staging = false;  // inside the f16 staging run of a sealed layer
    for (size_t p = 0; p < np; ++p) {
      if (shared(i, p)) {
        staging = staging || (lc.sealed && static_cast<int>(p) >= lc.sink_pages && prefix->tables_[i].is_full(p));
        continue;
      }
      const std::string page = where + " page " + std::to_string(p);
      const bool full = im.full[p] != 0;
      const int slots = std::min(T, im.length - static_cast<int>(p) * T);
      if (static_cast<int>(p) < lc.sink_pages) {
        if (!full) return DataLoss(page + ": a sink page must be f16");
      } else if (!lc.sealed) {
        if (full) return DataLoss(page + ": this layer's codec keeps no f16 pages past the sinks");
      } else if (full) {
        staging = true;
      } else {
        if (staging) return DataLoss(page + ": a packed page follows the f16 staging pages");
        if (slots != T) return DataLoss(page + ": a sealed packed page must hold all " + std::to_string(T) + " slots");
      }
      // A staging page the codec rules would already have sealed cannot
      // exist after a committed step (Append seals every such page).
      if (full && lc.sealed && static_cast<int>(p) >= lc.sink_pages && !lc.IsFullPage(static_cast<int>(p), im.length)) {
        return DataLoss(page + ": an f16 staging page outside the residual window (it would have been sealed)");
      }
      const size_t bytes = pool_->page_bytes(SizeClass(l, full));
      if (im.pages[p].size() != bytes) {
        return DataLoss(page + ": " + std::to_string(im.pages[p].size()) + " bytes, the codec's page has " +
                        std::to_string(bytes));
      }
      std::vector<int32_t> pos(static_cast<size_t>(slots));
      std::memcpy(pos.data(), im.pages[p].data(), sizeof(int32_t) * slots);  // the page's position array
      int live = 0;
      for (int s = 0; s < slots; ++s) {
        if (pos[s] == kDeadPosition) continue;
        if (pos[s] < 0 || (codec_.pre_rope && pos[s] >= kMaxPreRopePosition)) {
          return DataLoss(page + ": slot " + std::to_string(s) + " holds position " + std::to_string(pos[s]));
        }
        ++live;
        max_pos = std::max(max_pos, pos[s]);
      }
      if (live == 0 && static_cast<int>(p) >= lc.sink_pages) return DataLoss(page + ": no live entry (it would have left the chain)");
    }
  }

  // 2. Allocate every page (all or nothing), then copy.
  std::vector<PageId> taken;
  for (size_t i = 0; i < tables.size(); ++i) {
    const int l = static_cast<int>(i) / H;
    PageId before = kNoPage;
    for (size_t p = 0; p < tables[i].pages.size(); ++p) {
      if (shared(i, p)) {
        const PageId id = prefix->tables_[i].pages()[p];
        pool_->Ref(id);
        taken.push_back(id);
        continue;
      }
      Result<PageId> id = pool_->AllocateAfter(SizeClass(l, tables[i].full[p] != 0), before);
      if (!id.ok()) {
        for (PageId x : taken) pool_->Unref(x);
        return id.status();
      }
      taken.push_back(*id);
      before = *id;
    }
  }
  size_t next = 0;
  for (size_t i = 0; i < tables.size(); ++i) {
    const TableImage& im = tables[i];
    PageTable& t = tables_[i];
    for (size_t p = 0; p < im.pages.size(); ++p) {
      const PageId id = taken[next++];
      if (shared(i, p)) {
        t.AddPage(id, prefix->tables_[i].format(p));
        continue;
      }
      std::memcpy(pool_->PageData(id), im.pages[p].data(), im.pages[p].size());
      t.AddPage(id, im.full[p] != 0);
    }
    t.Grow(im.length, T);
    // Grow counted every slot live; the dead ones are in the positions.
    for (int p = 0; p < t.num_pages(); ++p) {
      const int32_t* pos = PagePositions(pool_->PageData(t.pages()[p]));
      int live = 0;
      for (int s = 0; s < t.EntriesInPage(p, T); ++s) live += pos[s] != kDeadPosition;
      t.SetPageLive(p, live);
    }
  }
  if (prefix_pages > 0) max_pos = std::max(max_pos, prefix->max_pos_);  // (a bound: the table only grows)
  if (codec_.pre_rope && max_pos >= 0) {
    max_pos_ = max_pos;
    ExtendRopeTable(max_pos_);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
