// BlockPool: every KV page of a process comes from one pool with a fixed byte
// budget, split into fixed-size pages.
//
// Memory (the vAttention idea): the whole budget is reserved once as virtual
// address space (mmap MAP_NORESERVE); the OS commits a page's memory on first
// touch, so an unused budget costs nothing, and ReleaseFreeMemory() hands the
// memory of free pages back to the OS (madvise MADV_DONTNEED).
//
// Pages are refcounted: Allocate() returns a page with refcount 1, Ref() adds a
// holder (prefix sharing, forked sequences), Unref() drops one; at 0 the page is
// free. A holder that wants to write a page with IsShared() must copy it first
// (copy-on-write; SequenceKV does this).
//
// Free list (vLLM v1's FreeKVCacheBlockQueue): an intrusive doubly-linked list
// threaded through per-page metadata arrays (prev/next indices), so allocation
// and release are O(1) with no heap allocation. Allocate() pops the front.
// Release order:
//   * a plain free page goes to the FRONT: it is reused first (its memory is
//     already committed and likely cached);
//   * (future, prefix cache) a page released while still holding cached
//     content (kFlagCached) goes to the BACK, so cached-but-unused pages are
//     evicted in LRU order, only after every plain free page and never-touched
//     page is used. Popping a cached page will call an eviction hook so the
//     prefix cache drops its entry. The flag and the back insertion exist now;
//     the hook is the small addition left for the prefix-cache issue.
// Never-used pages start on the list in address order.
//
// Thread-safety: not thread-safe; the owner serialises Allocate/Ref/Unref/
// ReleaseFreeMemory. Reading page bytes concurrently (attention) is safe while
// no thread changes that page's holders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/check.h"
#include "util/status.h"

namespace kvx::kv {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

struct BlockPoolOptions {
  // Total bytes of pages the pool may hand out. Must hold at least one page.
  uint64_t budget_bytes = 0;
  // Bytes per page (codec-specific, see PageBytes() in sequence_kv.h); rounded up
  // to a multiple of 64.
  size_t page_bytes = 0;
};

struct BlockPoolStats {
  int64_t pages_total = 0;
  int64_t pages_in_use = 0;        // refcount > 0
  uint64_t bytes_in_use = 0;       // pages_in_use * page_bytes
  // Bytes of pages touched since they were last released to the OS: an upper
  // estimate of the pool's resident memory (the OS may have reclaimed less).
  uint64_t bytes_committed_estimate = 0;
  uint64_t budget_bytes = 0;
};

class BlockPool {
 public:
  // Reserves the address space. InvalidArgument if the budget cannot hold one
  // page; IoError if the OS refuses the reservation.
  static Result<std::unique_ptr<BlockPool>> Create(const BlockPoolOptions& options);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Takes the front free page and gives it refcount 1. Its bytes are
  // unspecified (zero if never touched). ResourceExhausted when no page is free.
  Result<PageId> Allocate();

  // REQUIRES: RefCount(id) > 0.
  void Ref(PageId id);
  // Drops one holder; at zero the page returns to the free list.
  // REQUIRES: RefCount(id) > 0.
  void Unref(PageId id);

  int32_t RefCount(PageId id) const {
    KVX_DCHECK(Valid(id));
    return refcount_[id];
  }
  // True when more than one holder references the page (write => copy first).
  bool IsShared(PageId id) const { return RefCount(id) > 1; }

  // REQUIRES: RefCount(id) > 0 (a free page's bytes may be discarded any time).
  uint8_t* PageData(PageId id) {
    KVX_DCHECK(Valid(id) && refcount_[id] > 0);
    return base_ + static_cast<size_t>(id) * page_bytes_;
  }
  const uint8_t* PageData(PageId id) const {
    KVX_DCHECK(Valid(id) && refcount_[id] > 0);
    return base_ + static_cast<size_t>(id) * page_bytes_;
  }

  // Returns the memory of OS pages covered entirely by free pages to the OS
  // (their contents become zero). Returns the number of bytes released.
  uint64_t ReleaseFreeMemory();

  size_t page_bytes() const { return page_bytes_; }
  int64_t pages_total() const { return n_pages_; }
  int64_t pages_in_use() const { return n_in_use_; }
  int64_t pages_free() const { return n_pages_ - n_in_use_; }
  uint64_t bytes_in_use() const { return static_cast<uint64_t>(n_in_use_) * page_bytes_; }
  uint64_t budget_bytes() const { return budget_bytes_; }
  BlockPoolStats Stats() const;

  // Verifies the free list and counters: the list is a consistent doubly-linked
  // chain, every listed page has refcount 0 and every refcount-0 page is
  // listed exactly once, refcounts are >= 0, counts add up. Internal error with
  // a description otherwise. O(pages); for tests and debug builds.
  Status CheckInvariants() const;

  // Page ids on the free list, front to back (tests, debugging). O(free pages).
  std::vector<PageId> FreeListForTest() const;

 private:
  // Per-page flags (metadata hook for later features).
  static constexpr uint8_t kFlagOnFreeList = 1;  // linked into the free list
  static constexpr uint8_t kFlagTouched = 2;     // memory possibly committed
  static constexpr uint8_t kFlagCached = 4;      // (prefix cache) content still indexed

  BlockPool(uint8_t* base, size_t reserved, size_t page_bytes, int64_t n_pages, uint64_t budget);
  bool Valid(PageId id) const { return id >= 0 && id < n_pages_; }
  void PushFront(PageId id);
  void PushBack(PageId id);
  void Unlink(PageId id);
  std::string ExhaustedMessage() const;

  uint8_t* base_;
  size_t reserved_bytes_;
  size_t page_bytes_;
  int64_t n_pages_;
  uint64_t budget_bytes_;
  int64_t n_in_use_ = 0;
  int64_t n_touched_ = 0;

  // Per-page metadata, indexed by PageId.
  std::vector<int32_t> refcount_;
  std::vector<PageId> prev_;  // free-list links; kNoPage at the ends / when not listed
  std::vector<PageId> next_;
  std::vector<uint8_t> flags_;
  PageId head_ = kNoPage;
  PageId tail_ = kNoPage;
};

}  // namespace kvx::kv
