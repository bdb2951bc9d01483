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
// and release are O(1) with no heap allocation. Allocate() pops the front; a
// released page goes to the FRONT too, so it is reused first (its memory is
// already committed and likely cached). The pool knows nothing of prefix
// caching: cached pages are pages a RadixCache holder sequence still
// references (refcount > 0), and the radix cache evicts them by its own LRU
// when a step needs room (kv/radix_cache.h).
// Never-used pages are not listed: each class has a frontier, and pages past
// it have never been handed out. Allocation takes a listed free page first,
// then the frontier. Per-page metadata lives in
// LazyArrays, so a huge budget costs address space only: metadata memory
// grows with the pages actually used, not with the budget.
//
// Locality (extents): decode reads every page of a (layer, kv head) table in
// order, once per token. If the tables of a sequence take pages in turn from
// one list, consecutive pages of a table end up far apart and the hardware
// prefetchers, which follow sequential runs, give up: on a 2-core EPYC
// reading 4 KiB pages scattered like that runs at ~9 GB/s against ~21 GB/s
// in runs of 16 (bench/kv_bench BM_DecodeAttentionAllLayers shows the effect
// on attention). So each class is also divided into extents of about
// BlockPoolOptions::extent_bytes, and AllocateAfter(cls, prev) — what a
// growing table calls — takes the page right after `prev` when it is free,
// else the first page of a wholly free extent (most recently emptied first,
// for warm memory), else the front of the free list. Other tables start in
// other extents, so a table's pages form runs. Extents are a preference,
// never a reservation: every free page stays allocatable, and the budget
// counts only pages in use.
// The extent size trades run length against how many tables have runs: a
// table grows through its extent and then jumps; with fewer extents than
// tables, the tables left over take scattered pages from the free list.
// The best size is one table's whole length when the budget has an extent
// for every table, which is what ExtentBytesFor() (sequence_kv.h) picks for
// the pools the engine makes. Measured alternately (kv_bench
// BM_DecodeAttentionAllLayers/f16/ctx:8192, 90 tables of ~2.1 MB in a pool
// sized for them): 2 MiB extents beat 256 KiB ones in 8 of 9 pairs on
// 2 threads (median -5%) and 4 of 5 on 1 thread (-3.5%); 1 MiB was 4% and
// 8 MiB (fewer extents than tables) 7% slower than 2 MiB. With slower
// kernels, earlier: 64 KiB ~12 ms, 256 KiB or 1 MiB ~10.5 ms.
//
// Size classes (a slab allocator in miniature): a quantized cache needs pages
// of more than one size — a KIVI layer writes its newest tokens into f16
// staging pages and seals each full page into a much smaller quantized page;
// KVTuner-style per-layer bit widths give every layer its own page size. The
// pool therefore serves several page sizes from ONE byte budget. Class 0 is
// the size given at creation; AddSizeClass() adds others. Each class reserves
// its own `budget`-sized address range (virtual only, so this is free) and
// has its own free list; PageIds are global (class c owns a contiguous id
// range). The budget caps the bytes of pages in use summed over all classes,
// so an allocation fails exactly when it would push that sum over budget.
// With one class this is the plain fixed-page pool.
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
#include "util/lazy_array.h"
#include "util/status.h"

namespace kvx::kv {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

// Default target bytes of one extent ("Locality" above).
inline constexpr size_t kDefaultExtentBytes = 256 * 1024;

struct BlockPoolOptions {
  // Total bytes of pages the pool may hand out. Must hold at least one page.
  uint64_t budget_bytes = 0;
  // Bytes per page of size class 0 (codec-specific, see PageBytes() in
  // sequence_kv.h); rounded up to a multiple of 64.
  size_t page_bytes = 0;
  // Target bytes of one extent ("Locality" above); ExtentBytesFor() in
  // sequence_kv.h sizes it to the tables the pool will hold.
  size_t extent_bytes = kDefaultExtentBytes;
};

struct BlockPoolStats {
  int64_t pages_total = 0;         // capacity in class-0 pages (budget / page_bytes)
  int64_t pages_in_use = 0;        // refcount > 0, all classes
  uint64_t bytes_in_use = 0;       // sum of the page sizes of pages in use
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

  // Adds a size class of `page_bytes` (rounded up to 64) and returns its
  // index, or the index of an existing class of that rounded size.
  // InvalidArgument if the budget cannot hold one such page or there are
  // already kMaxSizeClasses classes; IoError if the reservation fails.
  static constexpr int kMaxSizeClasses = 16;
  Result<int> AddSizeClass(size_t page_bytes);
  int num_size_classes() const { return static_cast<int>(classes_.size()); }

  // Takes the front free page of `size_class` and gives it refcount 1. Its
  // bytes are unspecified (zero if never touched). ResourceExhausted when the
  // page would exceed the budget (or the class has no free page).
  // REQUIRES: 0 <= size_class < num_size_classes().
  Result<PageId> Allocate(int size_class = 0);
  // Like Allocate(), for a table whose last page is `prev` (kNoPage for its
  // first page): prefers the page after `prev`, then a wholly free extent
  // (see "Locality" above). Same errors as Allocate().
  Result<PageId> AllocateAfter(int size_class, PageId prev);
  // The default extent size (a class's extent holds max(1, extent bytes /
  // page bytes) pages).
  static constexpr size_t kExtentBytes = kDefaultExtentBytes;

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
    const SizeClass& c = classes_[class_of_[id]];
    return c.base + static_cast<size_t>(id - c.first) * c.page_bytes;
  }
  const uint8_t* PageData(PageId id) const {
    KVX_DCHECK(Valid(id) && refcount_[id] > 0);
    const SizeClass& c = classes_[class_of_[id]];
    return c.base + static_cast<size_t>(id - c.first) * c.page_bytes;
  }
  // Size class and byte size of a page.
  int SizeClassOf(PageId id) const {
    KVX_DCHECK(Valid(id));
    return class_of_[id];
  }
  size_t PageBytesOf(PageId id) const { return classes_[SizeClassOf(id)].page_bytes; }

  // Returns the memory of OS pages covered entirely by free pages to the OS
  // (their contents become zero). Returns the number of bytes released.
  uint64_t ReleaseFreeMemory();

  // Bytes of one page of `size_class` (class 0: the size given at creation).
  size_t page_bytes(int size_class = 0) const { return classes_[size_class].page_bytes; }
  // Capacity in class-0 pages (budget / page_bytes()).
  int64_t pages_total() const { return classes_[0].n_pages; }
  // Pages in use over all classes, and of one class.
  int64_t pages_in_use() const { return n_in_use_; }
  int64_t pages_in_use(int size_class) const { return classes_[size_class].n_in_use; }
  // Class-0 pages that can still be allocated within the budget.
  int64_t pages_free() const {
    return static_cast<int64_t>((budget_bytes_ - bytes_in_use_) / classes_[0].page_bytes);
  }
  uint64_t bytes_in_use() const { return bytes_in_use_; }
  uint64_t budget_bytes() const { return budget_bytes_; }
  BlockPoolStats Stats() const;

  // Verifies every free list and the counters: each list is a consistent
  // doubly-linked chain of its own class, every listed page has refcount 0 and
  // every refcount-0 page is listed exactly once, refcounts are >= 0, counts
  // and bytes add up and stay within the budget. Internal error with a
  // description otherwise. O(pages); for tests and debug builds.
  Status CheckInvariants() const;

  // Page ids on a class's free list, front to back (tests, debugging).
  std::vector<PageId> FreeListForTest(int size_class = 0) const;

 private:
  // One page size: its own address range, id range and free list.
  struct SizeClass {
    size_t page_bytes = 0;
    uint8_t* base = nullptr;
    size_t reserved_bytes = 0;
    PageId first = 0;       // ids [first, first + n_pages)
    int64_t n_pages = 0;
    int64_t n_in_use = 0;
    int64_t n_touched = 0;
    PageId frontier = 0;    // ids [first, frontier) have been handed out at least once
    PageId head = kNoPage;  // free list
    PageId tail = kNoPage;
    // Extents: `extent_pages` consecutive ids each (the last may be shorter).
    int32_t extent_pages = 1;
    // Free pages per extent, counting only pages below the frontier; an
    // extent is wholly free (listed) when all its pages are below it and free.
    LazyArray<int32_t> extent_free;
    LazyArray<int32_t> extent_prev;  // list of wholly free extents (valid while listed)
    LazyArray<int32_t> extent_next;
    int32_t extent_head = -1;
    int32_t extent_tail = -1;
  };

  // Per-page flags.
  static constexpr uint8_t kFlagOnFreeList = 1;  // linked into the free list
  static constexpr uint8_t kFlagTouched = 2;     // memory possibly committed

  BlockPool(uint64_t budget, size_t extent_bytes) : budget_bytes_(budget), extent_bytes_(extent_bytes) {}
  bool Valid(PageId id) const { return id >= 0 && id < n_pages_; }
  void PushFront(PageId id);
  void PushBack(PageId id);
  void Unlink(PageId id);
  // Extent bookkeeping, called whenever a page joins or leaves a free list.
  int32_t ExtentOf(const SizeClass& c, PageId id) const { return (id - c.first) / c.extent_pages; }
  int32_t ExtentSize(const SizeClass& c, int32_t e) const;
  void PageFreed(SizeClass& c, PageId id, bool front);
  void PageTaken(SizeClass& c, PageId id);
  // Unlinks a free page and gives it refcount 1.
  PageId Take(SizeClass& c, PageId id);
  // Moves the frontier past one never-used page and lists it as free.
  PageId Materialize(SizeClass& c);
  PageId end(const SizeClass& c) const { return c.first + static_cast<PageId>(c.n_pages); }
  // No free page of the class (listed or past the frontier), or the budget is spent.
  bool Exhausted(const SizeClass& c) const {
    return (c.head == kNoPage && c.frontier == end(c)) || bytes_in_use_ + c.page_bytes > budget_bytes_;
  }
  Status CheckExtents(const SizeClass& c, const std::string& cls) const;
  std::string ExhaustedMessage(const SizeClass& c) const;

  std::vector<SizeClass> classes_;
  int64_t n_pages_ = 0;  // over all classes
  uint64_t budget_bytes_;
  size_t extent_bytes_;
  uint64_t bytes_in_use_ = 0;
  int64_t n_in_use_ = 0;

  // Per-page metadata, indexed by PageId; meaningful below each class's
  // frontier (zero bytes past it, never written).
  LazyArray<int32_t> refcount_;
  LazyArray<PageId> prev_;  // free-list links; kNoPage at the ends / when not listed
  LazyArray<PageId> next_;
  LazyArray<uint8_t> flags_;
  LazyArray<uint8_t> class_of_;
};

}  // namespace kvx::kv
