// PageTable: the cache of one (sequence, layer, kv-head) as a chain of pages.
// Entry i lives in pages()[i / page_tokens], slot i % page_tokens. The chain is
// append-only for now (eviction policies will compact or rewrite it); heads of
// one sequence may hold different numbers of entries.
//
// Each page is either packed (the layer codec's encoding) or full (f16: a
// staging page of a sealed codec that is still being filled or is inside the
// residual window, or a sink page); see LayerCodec::IsFullPage.
//
// The table only records page ids; it does not own references by itself:
// SequenceKV takes and drops the pool references for the pages it lists.
//
// Thread-safety: not thread-safe to mutate; concurrent const reads are safe.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_pool.h"
#include "util/check.h"

namespace kvx::kv {

class PageTable {
 public:
  PageTable() = default;

  // Number of cache entries.
  int length() const { return length_; }
  const std::vector<PageId>& pages() const { return pages_; }
  // Whether page `index` is stored in f16 rather than the layer codec.
  bool is_full(int index) const { return full_[index] != 0; }
  int num_pages() const { return static_cast<int>(pages_.size()); }
  bool empty() const { return length_ == 0; }

  // Entries stored in page `index` of the chain (page_tokens except maybe the last).
  int EntriesInPage(int index, int page_tokens) const {
    KVX_DCHECK(index >= 0 && index < num_pages());
    const int start = index * page_tokens;
    return length_ - start < page_tokens ? length_ - start : page_tokens;
  }

  // Mutators, used by SequenceKV.
  void AddPage(PageId id, bool full = false) {
    pages_.push_back(id);
    full_.push_back(full ? 1 : 0);
  }
  void ReplacePage(int index, PageId id, bool full) {
    pages_[index] = id;
    full_[index] = full ? 1 : 0;
  }
  void set_length(int length) { length_ = length; }
  void Reset() {
    pages_.clear();
    full_.clear();
    length_ = 0;
  }

 private:
  std::vector<PageId> pages_;
  std::vector<uint8_t> full_;
  int length_ = 0;
};

}  // namespace kvx::kv
