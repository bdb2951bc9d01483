#include "kv/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "kv/codec/codec_id.h"

namespace kvx::kv {

Result<std::unique_ptr<BlockPool>> BlockPool::Create(const BlockPoolOptions& options) {
  if (options.page_bytes == 0) return InvalidArgument("KV block pool: page size must be > 0");
  const size_t page_bytes = AlignUp(options.page_bytes, kPageAlign);
  const uint64_t n_pages64 = options.budget_bytes / page_bytes;
  if (n_pages64 == 0) {
    return InvalidArgument("KV budget of " + std::to_string(options.budget_bytes) +
                           " bytes is smaller than one page (" + std::to_string(page_bytes) +
                           " bytes); raise the budget (--kv budget=...)");
  }
  if (n_pages64 > static_cast<uint64_t>(std::numeric_limits<PageId>::max())) {
    return InvalidArgument("KV budget of " + std::to_string(options.budget_bytes) + " bytes makes " +
                           std::to_string(n_pages64) + " pages; at most " +
                           std::to_string(std::numeric_limits<PageId>::max()) +
                           " are supported: use larger pages or a smaller budget");
  }
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t reserved = AlignUp(static_cast<size_t>(n_pages64) * page_bytes, os_page);
  void* base = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return IoError("cannot reserve " + std::to_string(reserved) + " bytes of address space for the KV pool: " +
                   std::strerror(errno) + "; lower the budget (--kv budget=...)");
  }
  return std::unique_ptr<BlockPool>(new BlockPool(static_cast<uint8_t*>(base), reserved, page_bytes,
                                                  static_cast<int64_t>(n_pages64), options.budget_bytes));
}

BlockPool::BlockPool(uint8_t* base, size_t reserved, size_t page_bytes, int64_t n_pages, uint64_t budget)
    : base_(base),
      reserved_bytes_(reserved),
      page_bytes_(page_bytes),
      n_pages_(n_pages),
      budget_bytes_(budget),
      refcount_(n_pages, 0),
      prev_(n_pages, kNoPage),
      next_(n_pages, kNoPage),
      flags_(n_pages, 0) {
  for (PageId id = 0; id < n_pages_; ++id) PushBack(id);
}

BlockPool::~BlockPool() { munmap(base_, reserved_bytes_); }

void BlockPool::PushFront(PageId id) {
  prev_[id] = kNoPage;
  next_[id] = head_;
  if (head_ != kNoPage) prev_[head_] = id; else tail_ = id;
  head_ = id;
  flags_[id] |= kFlagOnFreeList;
}

void BlockPool::PushBack(PageId id) {
  next_[id] = kNoPage;
  prev_[id] = tail_;
  if (tail_ != kNoPage) next_[tail_] = id; else head_ = id;
  tail_ = id;
  flags_[id] |= kFlagOnFreeList;
}

void BlockPool::Unlink(PageId id) {
  const PageId p = prev_[id], n = next_[id];
  if (p != kNoPage) next_[p] = n; else head_ = n;
  if (n != kNoPage) prev_[n] = p; else tail_ = p;
  prev_[id] = next_[id] = kNoPage;
  flags_[id] &= static_cast<uint8_t>(~kFlagOnFreeList);
}

std::string BlockPool::ExhaustedMessage() const {
  return "KV budget exhausted: " + std::to_string(n_in_use_) + " pages of " + std::to_string(page_bytes_) +
         " bytes in use (budget " + std::to_string(budget_bytes_) +
         " bytes); raise the budget (--kv budget=...) or shorten the context";
}

Result<PageId> BlockPool::Allocate() {
  if (head_ == kNoPage) return ResourceExhausted(ExhaustedMessage());
  const PageId id = head_;
  Unlink(id);
  // Prefix-cache hook: a kFlagCached page popped here is evicted (its index
  // entry must be dropped) before reuse.
  flags_[id] &= static_cast<uint8_t>(~kFlagCached);
  if (!(flags_[id] & kFlagTouched)) {
    flags_[id] |= kFlagTouched;
    ++n_touched_;
  }
  refcount_[id] = 1;
  ++n_in_use_;
  return id;
}

void BlockPool::Ref(PageId id) {
  KVX_CHECK(Valid(id) && refcount_[id] > 0);
  ++refcount_[id];
}

void BlockPool::Unref(PageId id) {
  KVX_CHECK(Valid(id) && refcount_[id] > 0);
  if (--refcount_[id] > 0) return;
  --n_in_use_;
  if (flags_[id] & kFlagCached) {
    PushBack(id);  // LRU: cached content is evicted last, oldest first
  } else {
    PushFront(id);  // reuse warm, committed memory first
  }
}

uint64_t BlockPool::ReleaseFreeMemory() {
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t released = 0;
  // Walk runs of consecutive free page ids; release the OS pages inside each run.
  PageId id = 0;
  while (id < n_pages_) {
    if (refcount_[id] != 0) {
      ++id;
      continue;
    }
    PageId end = id;
    bool any_touched = false;
    while (end < n_pages_ && refcount_[end] == 0) any_touched |= (flags_[end++] & kFlagTouched) != 0;
    if (any_touched) {
      const size_t lo = AlignUp(static_cast<size_t>(id) * page_bytes_, os_page);
      size_t hi = static_cast<size_t>(end) * page_bytes_;
      if (end == n_pages_) hi = reserved_bytes_;  // the mapping's tail belongs to the last page
      hi = hi / os_page * os_page;
      if (hi > lo && madvise(base_ + lo, hi - lo, MADV_DONTNEED) == 0) {
        released += hi - lo;
        // Pages now entirely inside [lo, hi) are uncommitted again.
        for (PageId p = id; p < end; ++p) {
          const size_t b = static_cast<size_t>(p) * page_bytes_;
          if (b >= lo && b + page_bytes_ <= hi && (flags_[p] & kFlagTouched)) {
            flags_[p] &= static_cast<uint8_t>(~(kFlagTouched | kFlagCached));
            --n_touched_;
          }
        }
      }
    }
    id = end;
  }
  return released;
}

BlockPoolStats BlockPool::Stats() const {
  BlockPoolStats s;
  s.pages_total = n_pages_;
  s.pages_in_use = n_in_use_;
  s.bytes_in_use = bytes_in_use();
  s.bytes_committed_estimate = static_cast<uint64_t>(n_touched_) * page_bytes_;
  s.budget_bytes = budget_bytes_;
  return s;
}

std::vector<PageId> BlockPool::FreeListForTest() const {
  std::vector<PageId> out;
  for (PageId id = head_; id != kNoPage; id = next_[id]) out.push_back(id);
  return out;
}

Status BlockPool::CheckInvariants() const {
  auto fail = [](const std::string& m) { return Internal("BlockPool invariant violated: " + m); };
  int64_t listed = 0;
  PageId prev = kNoPage;
  for (PageId id = head_; id != kNoPage; id = next_[id]) {
    if (!Valid(id)) return fail("free list holds invalid id " + std::to_string(id));
    if (++listed > n_pages_) return fail("free list has a cycle");
    if (prev_[id] != prev) return fail("prev link of page " + std::to_string(id) + " is wrong");
    if (!(flags_[id] & kFlagOnFreeList)) return fail("listed page " + std::to_string(id) + " lacks the flag");
    if (refcount_[id] != 0) {
      return fail("page " + std::to_string(id) + " is free-listed with refcount " + std::to_string(refcount_[id]));
    }
    prev = id;
  }
  if (tail_ != prev) return fail("tail does not match the last listed page");
  int64_t zero = 0, in_use = 0, touched = 0;
  for (PageId id = 0; id < n_pages_; ++id) {
    if (refcount_[id] < 0) return fail("page " + std::to_string(id) + " has negative refcount");
    const bool on_list = (flags_[id] & kFlagOnFreeList) != 0;
    if ((refcount_[id] == 0) != on_list) {
      return fail("page " + std::to_string(id) + " refcount " + std::to_string(refcount_[id]) +
                  (on_list ? " but on" : " but not on") + " the free list");
    }
    if (!on_list && (prev_[id] != kNoPage || next_[id] != kNoPage)) {
      return fail("page " + std::to_string(id) + " in use has free-list links");
    }
    if (refcount_[id] == 0) ++zero; else ++in_use;
    if (flags_[id] & kFlagTouched) ++touched;
  }
  if (zero != listed) return fail("free pages " + std::to_string(zero) + " != listed " + std::to_string(listed));
  if (in_use != n_in_use_) {
    return fail("pages in use " + std::to_string(in_use) + " != counter " + std::to_string(n_in_use_));
  }
  if (in_use + zero != n_pages_) return fail("counts do not add up to pages_total");
  if (touched != n_touched_) return fail("touched counter is wrong");
  return Status::Ok();
}

}  // namespace kvx::kv
