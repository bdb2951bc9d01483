// PageTable: the cache of one (sequence, layer, kv-head) as a chain of pages.
//
// Slots and entries. The chain is a run of SLOTS: slot i lives in
// pages()[i / page_tokens], at i % page_tokens; every page but the last has
// all page_tokens slots written, so length() (the slot count) fixes the
// geometry and the codec rules that depend on it (which pages are sealed,
// kv/codec/codec_config.h). A slot holds a live ENTRY or a dead one: an
// entry removed from the middle of the chain (an eviction policy's drop)
// keeps its slot with its stored position set to kDeadPosition, which the
// attention mask (position <= query position) hides from every query, so
// attention and every codec work on such tables unchanged. Each page counts
// its live entries; a page whose entries all die leaves the chain and goes
// back to the pool at once, and SequenceKV::Compact() packs the live entries
// of partly dead pages into fewer pages. Heads of one sequence may hold
// different numbers of slots and of live entries.
//
// Page formats. Each page has a format (PageFormat, one byte beside its id):
// packed (the layer codec's encoding), full (f16: a staging page of a sealed
// codec that is still being filled or is inside the residual window, or a
// sink page; see LayerCodec::IsFullPage), or demoted (MiKV: entries an
// eviction policy chose, kept in the sequence's low-bit demotion codec
// instead of dropped; SequenceKV::DemoteEntries). SequenceKV::FormatCodec
// maps a (layer, format) to the codec and parameters its pages are read and
// written with, and each format has its own pool size class; attention,
// compaction and copies dispatch per page on it. Demoted pages always hold
// page_tokens slots (dead ones padded) and sit after the sink pages, before
// the rest of the chain, so the layer codec's rules (sealing, staging) never
// see them. Pruned pages (ThinK, kv/policy/think.h) hold their keys' kept
// channels only (the table's channel mask: SequenceKV::PruneKeyChannels) and
// whole values, in the layer's block codec (f16 for f16/f32 layers, the
// layer codec for int8/4/2: kv/pruned_keys.h); they replace packed pages in place (same slots), so
// the chain's geometry is unchanged, and their size class is smaller.
//
// The table only records page ids; it does not own references by itself:
// SequenceKV takes and drops the pool references for the pages it lists.
//
// Page bounds (Quest, kv/page_selection.h): when enabled (EnableBounds), each
// page also carries, beside the table, the per-channel minimum and maximum of
// its entries' keys as stored ([2 * bounds_dim] floats: min then max). The
// mutators keep them aligned with the pages (a moved page keeps its bounds, a
// new or replaced run starts empty); SequenceKV fills them when it writes a
// page. A removed entry leaves its page's bounds as they were: still an upper
// bound of what the page holds, only looser.
//
// Entry scales (cross-layer sharing, MiniCache: kv/policy/minicache.h): when
// enabled (EnableEntryScales), each slot also carries, beside the table, a
// key scale and a value scale that attention applies to what the page
// stores: score q.(a k) = a (q.k), output weight p b for v. They let two
// tables list the same page (one stored direction) with their own norms. New
// slots get 1 (entries stored as they are); the mutators keep the scales
// aligned with the pages like the bounds.
//
// Thread-safety: not thread-safe to mutate; concurrent const reads are safe.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>
#include <algorithm>

#include "kv/block_pool.h"
#include "util/check.h"

namespace kvx::kv {

// The stored position of a dead slot: after every query, so never attended.
inline constexpr int32_t kDeadPosition = std::numeric_limits<int32_t>::max();

// How a page is encoded (see the header comment).
using PageFormat = uint8_t;
inline constexpr PageFormat kPagePacked = 0;   // the layer codec
inline constexpr PageFormat kPageFull = 1;     // f16: staging and sink pages
inline constexpr PageFormat kPageDemoted = 2;  // the sequence's demotion codec (MiKV)
inline constexpr PageFormat kPagePruned = 3;   // keys' kept channels only (ThinK)
inline constexpr int kPageFormats = 4;

class PageTable {
 public:
  PageTable() = default;

  // Number of slots (live and dead entries).
  int length() const { return length_; }
  // Number of live entries.
  int live() const { return live_; }
  const std::vector<PageId>& pages() const { return pages_; }
  // Whether page `index` is stored in f16 rather than the layer codec.
  bool is_full(int index) const { return format_[index] == kPageFull; }
  PageFormat format(int index) const { return format_[index]; }
  // Live entries of page `index`.
  int live_in_page(int index) const { return live_in_page_[index]; }
  int num_pages() const { return static_cast<int>(pages_.size()); }
  bool empty() const { return length_ == 0; }

  // Slots of page `index` of the chain (page_tokens except maybe the last).
  int EntriesInPage(int index, int page_tokens) const {
    KVX_DCHECK(index >= 0 && index < num_pages());
    const int start = index * page_tokens;
    return length_ - start < page_tokens ? length_ - start : page_tokens;
  }

  // Mutators, used by SequenceKV. AddPage/ReplacePage/set_length keep the
  // live counts in step for appends: new slots are live.
  void AddPage(PageId id, bool full = false) { AddPage(id, full ? kPageFull : kPagePacked); }
  void AddPage(PageId id, PageFormat format) {
    pages_.push_back(id);
    format_.push_back(format);
    live_in_page_.push_back(0);
    if (bounds_dim_ > 0) AppendEmptyBounds(1);
    if (scale_page_tokens_ > 0) AppendUnitScales(1);
  }
  void ReplacePage(int index, PageId id, bool full) { ReplacePage(index, id, full ? kPageFull : kPagePacked); }
  void ReplacePage(int index, PageId id, PageFormat format) {
    pages_[index] = id;
    format_[index] = format;
  }
  // Grows the chain to `length` slots, the new ones live. REQUIRES: length >=
  // length() and num_pages() covers it.
  void Grow(int length, int page_tokens) {
    for (int i = length_; i < length; ++i) ++live_in_page_[i / page_tokens];
    live_ += length - length_;
    length_ = length;
  }
  // Marks one live slot of page `index` dead (its stored position is the
  // caller's to overwrite).
  void KillSlot(int index) {
    KVX_DCHECK(live_in_page_[index] > 0);
    --live_in_page_[index];
    --live_;
  }
  // Removes page `index` from the chain. REQUIRES: it holds no live entry.
  // The slots after it move down by page_tokens (the last page's own slots
  // when it is the last page).
  void RemovePage(int index, int page_tokens) {
    KVX_DCHECK(live_in_page_[index] == 0);
    const int slots = EntriesInPage(index, page_tokens);
    pages_.erase(pages_.begin() + index);
    format_.erase(format_.begin() + index);
    live_in_page_.erase(live_in_page_.begin() + index);
    if (bounds_dim_ > 0) {
      const auto b = bounds_.begin() + static_cast<ptrdiff_t>(index) * 2 * bounds_dim_;
      bounds_.erase(b, b + 2 * bounds_dim_);
    }
    if (scale_page_tokens_ > 0) {
      const size_t T = static_cast<size_t>(scale_page_tokens_), at = static_cast<size_t>(index) * T;
      k_scale_.erase(k_scale_.begin() + at, k_scale_.begin() + at + T);
      v_scale_.erase(v_scale_.begin() + at, v_scale_.begin() + at + T);
    }
    length_ -= slots;
  }
  // Replaces pages [first, last) by `ids` (all of `format`), holding `live`
  // live entries in their first slots and dead ones after,
  // `ids.size() * page_tokens` slots in all. For compaction, and (first ==
  // last) to insert whole pages (demotion).
  void ReplaceRun(int first, int last, const std::vector<PageId>& ids, PageFormat format,
                  const std::vector<int>& live, int page_tokens) {
    int removed_live = 0;
    for (int p = first; p < last; ++p) removed_live += live_in_page_[p];
    int added_live = 0;
    for (int n : live) added_live += n;
    // Compaction keeps the live entries; an insertion (first == last) adds them.
    KVX_CHECK((first == last || removed_live == added_live) && ids.size() == live.size());
    live_ += added_live - removed_live;
    const int removed_slots = (last - first) * page_tokens;
    pages_.erase(pages_.begin() + first, pages_.begin() + last);
    format_.erase(format_.begin() + first, format_.begin() + last);
    live_in_page_.erase(live_in_page_.begin() + first, live_in_page_.begin() + last);
    pages_.insert(pages_.begin() + first, ids.begin(), ids.end());
    format_.insert(format_.begin() + first, ids.size(), format);
    live_in_page_.insert(live_in_page_.begin() + first, live.begin(), live.end());
    if (bounds_dim_ > 0) {  // the new pages' bounds start empty: the caller fills them
      const size_t w = 2 * static_cast<size_t>(bounds_dim_);
      std::vector<float> empty(ids.size() * w);
      for (size_t i = 0; i < ids.size(); ++i) EmptyBounds(&empty[i * w]);
      bounds_.erase(bounds_.begin() + first * w, bounds_.begin() + last * w);
      bounds_.insert(bounds_.begin() + first * w, empty.begin(), empty.end());
    }
    if (scale_page_tokens_ > 0) {  // the new pages' entries are stored as they are
      const size_t T = static_cast<size_t>(scale_page_tokens_);
      for (std::vector<float>* sc : {&k_scale_, &v_scale_}) {
        sc->erase(sc->begin() + first * T, sc->begin() + last * T);
        sc->insert(sc->begin() + first * T, ids.size() * T, 1.0f);
      }
    }
    length_ += static_cast<int>(ids.size()) * page_tokens - removed_slots;
  }
  // Keeps the first `length` slots (a prefix fork) and pages; live counts of
  // the kept part are recounted by the caller with SetPageLive.
  void Truncate(int length, int page_tokens) {
    const int np = (length + page_tokens - 1) / page_tokens;
    pages_.resize(np);
    format_.resize(np);
    live_in_page_.resize(np);
    bounds_.resize(static_cast<size_t>(np) * 2 * bounds_dim_);
    k_scale_.resize(static_cast<size_t>(np) * scale_page_tokens_);
    v_scale_.resize(static_cast<size_t>(np) * scale_page_tokens_);
    length_ = length;
    live_ = 0;
    for (int n : live_in_page_) live_ += n;
  }
  void SetPageLive(int index, int live) {
    live_ += live - live_in_page_[index];
    live_in_page_[index] = live;
  }
  void Reset() {
    pages_.clear();
    format_.clear();
    live_in_page_.clear();
    bounds_.clear();
    k_scale_.clear();
    v_scale_.clear();
    scale_page_tokens_ = 0;
    length_ = 0;
    live_ = 0;
  }

  // Page bounds (see the header comment). EnableBounds(dim) turns them on
  // with every page's bounds empty (min +inf, max -inf); 0 turns them off.
  int bounds_dim() const { return bounds_dim_; }
  void EnableBounds(int dim) {
    bounds_dim_ = dim;
    bounds_.clear();
    if (dim > 0) AppendEmptyBounds(num_pages());
  }
  // [2 * bounds_dim()] floats of page `index`: min[c], then max[c].
  // REQUIRES: bounds_dim() > 0.
  const float* bounds(int index) const { return &bounds_[static_cast<size_t>(index) * 2 * bounds_dim_]; }
  float* mutable_bounds(int index) { return &bounds_[static_cast<size_t>(index) * 2 * bounds_dim_]; }
  // Resets one page's bounds to empty (min +inf, max -inf).
  void EmptyBounds(float* b) const {
    std::fill(b, b + bounds_dim_, std::numeric_limits<float>::infinity());
    std::fill(b + bounds_dim_, b + 2 * bounds_dim_, -std::numeric_limits<float>::infinity());
  }

  // Entry scales (see the header comment). EnableEntryScales(T) turns them
  // on with every slot's scales 1 (T: the layout's page_tokens); Reset()
  // turns them off.
  bool has_entry_scales() const { return scale_page_tokens_ > 0; }
  void EnableEntryScales(int page_tokens) {
    if (scale_page_tokens_ > 0) return;
    scale_page_tokens_ = page_tokens;
    AppendUnitScales(num_pages());
  }
  // [page_tokens] key (value) scales of page `index`'s slots.
  // REQUIRES: has_entry_scales().
  const float* k_scales(int index) const { return &k_scale_[static_cast<size_t>(index) * scale_page_tokens_]; }
  const float* v_scales(int index) const { return &v_scale_[static_cast<size_t>(index) * scale_page_tokens_]; }
  void SetEntryScales(int slot, float k, float v) {
    k_scale_[static_cast<size_t>(slot)] = k;
    v_scale_[static_cast<size_t>(slot)] = v;
  }
  size_t EntryScaleBytes() const { return (k_scale_.size() + v_scale_.size()) * sizeof(float); }

 private:
  void AppendUnitScales(int pages) {
    const size_t n = static_cast<size_t>(pages) * scale_page_tokens_;
    k_scale_.insert(k_scale_.end(), n, 1.0f);
    v_scale_.insert(v_scale_.end(), n, 1.0f);
  }
  void AppendEmptyBounds(int pages) {
    const size_t w = 2 * static_cast<size_t>(bounds_dim_), at = bounds_.size();
    bounds_.resize(at + static_cast<size_t>(pages) * w);
    for (int i = 0; i < pages; ++i) EmptyBounds(&bounds_[at + static_cast<size_t>(i) * w]);
  }

  std::vector<PageId> pages_;
  std::vector<PageFormat> format_;
  std::vector<int32_t> live_in_page_;
  std::vector<float> bounds_;  // [num_pages][2][bounds_dim_] when bounds_dim_ > 0
  int bounds_dim_ = 0;
  std::vector<float> k_scale_, v_scale_;  // [num_pages][scale_page_tokens_] when enabled
  int scale_page_tokens_ = 0;             // 0: no entry scales
  int length_ = 0;
  int live_ = 0;
};

}  // namespace kvx::kv
