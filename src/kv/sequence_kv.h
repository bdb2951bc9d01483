// SequenceKV: the KV cache of one sequence (one session's context): for every
// (layer, kv-head) a PageTable of pages from a shared BlockPool, encoded with one
// codec. The forward pass appends each layer's new K/V here and reads it back
// through Attention() (kv/attention.h).
//
// Ownership: a SequenceKV holds one pool reference per page it lists and drops
// them in Clear()/the destructor. Pages may be shared with other sequences
// (Fork()); a shared partially filled last page is copied before it is
// written (copy-on-write), so sharing is invisible to the forward pass.
//
// Thread-safety: not thread-safe to mutate; Attention() may read one
// SequenceKV from many threads while nothing appends to it. Mutations also
// touch the pool, so sequences sharing a pool must be mutated by one thread
// at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/block_pool.h"
#include "kv/codec/codec_id.h"
#include "kv/layout.h"
#include "kv/page_table.h"
#include "util/status.h"

namespace kvx::kv {

// Bytes of one page of `layout.page_tokens` entries of one (layer, kv-head).
size_t PageBytes(const KVLayout& layout, CodecId codec);
// Bytes one token costs across all layers and kv heads when pages are full
// (PageBytes * n_layers * n_kv_heads / page_tokens, rounded up).
size_t BytesPerToken(const KVLayout& layout, CodecId codec);
// Pool budget that holds `n_ctx` tokens of one sequence in every (layer, kv-head)
// (whole pages: n_layers * n_kv_heads * ceil(n_ctx / page_tokens) * PageBytes).
uint64_t BudgetForContext(const KVLayout& layout, CodecId codec, int64_t n_ctx);

class SequenceKV {
 public:
  // REQUIRES: pool outlives this object; layout.Validate() is OK;
  // pool->page_bytes() >= PageBytes(layout, codec).
  SequenceKV(BlockPool* pool, const KVLayout& layout, CodecId codec);
  ~SequenceKV();
  SequenceKV(const SequenceKV&) = delete;
  SequenceKV& operator=(const SequenceKV&) = delete;

  // Appends n tokens' K and V for one layer. k, v: [n][n_kv_heads][head_dim]
  // floats; pos[n]: their positions (any order, gaps allowed). Every kv-head of
  // the layer gets the n entries.
  // ResourceExhausted when the pool cannot supply the pages; then nothing
  // changed (all pages the call needs are allocated before any is written).
  // REQUIRES: 0 <= layer < n_layers, n >= 0.
  Status Append(int layer, int n, const int32_t* pos, const float* k, const float* v);

  // Entries cached for (layer, kv_head).
  int Length(int layer, int kv_head) const { return table(layer, kv_head).length(); }

  // Returns every page to the pool (drops this sequence's references).
  void Clear();

  // Bytes of the pages this sequence references (shared pages count fully).
  size_t BytesInUse() const;
  // Pages this sequence references (shared pages count once per reference).
  int64_t PagesInUse() const;

  // A new sequence sharing every page with this one (refcounts +1); later
  // appends to either copy a shared last page before writing it.
  std::unique_ptr<SequenceKV> Fork() const;

  // Reads entry `index` of (layer, kv_head) back as floats (decoded) and its
  // position. For tests, debugging and tiers; not a hot path.
  // REQUIRES: 0 <= index < Length(layer, kv_head); k, v hold head_dim floats.
  void ReadEntry(int layer, int kv_head, int index, float* k, float* v, int32_t* pos) const;

  const PageTable& table(int layer, int kv_head) const {
    return tables_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  }
  const KVLayout& layout() const { return layout_; }
  CodecId codec() const { return codec_; }
  const BlockPool& pool() const { return *pool_; }

 private:
  PageTable& mutable_table(int layer, int kv_head) {
    return tables_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  }

  BlockPool* pool_;
  KVLayout layout_;
  CodecId codec_;
  std::vector<PageTable> tables_;   // [n_layers * n_kv_heads]
  std::vector<PageId> scratch_;     // pages allocated by the current Append
};

}  // namespace kvx::kv
