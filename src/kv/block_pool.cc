#include "kv/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "kv/codec/codec_id.h"

namespace kvx::kv {

Result<std::unique_ptr<BlockPool>> BlockPool::Create(const BlockPoolOptions& options) {
  if (options.page_bytes == 0) return InvalidArgument("KV block pool: page size must be > 0");
  std::unique_ptr<BlockPool> pool(new BlockPool(options.budget_bytes, std::max<size_t>(options.extent_bytes, 1)));
  KVX_ASSIGN_OR_RETURN(const int cls, pool->AddSizeClass(options.page_bytes));
  KVX_CHECK(cls == 0);
  return pool;
}

Result<int> BlockPool::AddSizeClass(size_t page_bytes_in) {
  if (page_bytes_in == 0) return InvalidArgument("KV block pool: page size must be > 0");
  const size_t page_bytes = AlignUp(page_bytes_in, kPageAlign);
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (classes_[c].page_bytes == page_bytes) return static_cast<int>(c);
  }
  if (classes_.size() >= static_cast<size_t>(kMaxSizeClasses)) {
    return InvalidArgument("KV block pool: more than " + std::to_string(kMaxSizeClasses) +
                           " distinct page sizes; use fewer distinct per-layer bit widths");
  }
  const uint64_t n_pages64 = budget_bytes_ / page_bytes;
  if (n_pages64 == 0) {
    return InvalidArgument("KV budget of " + std::to_string(budget_bytes_) + " bytes is smaller than one page (" +
                           std::to_string(page_bytes) + " bytes); raise the budget (--kv budget=...)");
  }
  const uint64_t max_ids = static_cast<uint64_t>(std::numeric_limits<PageId>::max());
  if (n_pages64 > max_ids - static_cast<uint64_t>(n_pages_)) {
    return InvalidArgument("KV budget of " + std::to_string(budget_bytes_) + " bytes makes " +
                           std::to_string(n_pages64) + " pages; at most " + std::to_string(max_ids) +
                           " are supported: use larger pages or a smaller budget");
  }
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t reserved = AlignUp(static_cast<size_t>(n_pages64) * page_bytes, os_page);
  void* base = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return IoError("cannot reserve " + std::to_string(reserved) + " bytes of address space for the KV pool: " +
                   std::strerror(errno) + "; lower the budget (--kv budget=...)");
  }
  SizeClass c;
  c.page_bytes = page_bytes;
  c.base = static_cast<uint8_t*>(base);
  c.reserved_bytes = reserved;
  c.first = static_cast<PageId>(n_pages_);
  c.n_pages = static_cast<int64_t>(n_pages64);
  c.extent_pages = static_cast<int32_t>(std::clamp<uint64_t>(extent_bytes_ / page_bytes, 1, n_pages64));
  const size_t n_extents = static_cast<size_t>((n_pages64 + c.extent_pages - 1) / c.extent_pages);
  c.frontier = c.first;
  if (!c.extent_free.Resize(n_extents) || !c.extent_prev.Resize(n_extents) || !c.extent_next.Resize(n_extents) ||
      !refcount_.Resize(n_pages_ + c.n_pages) || !prev_.Resize(n_pages_ + c.n_pages) ||
      !next_.Resize(n_pages_ + c.n_pages) || !flags_.Resize(n_pages_ + c.n_pages) ||
      !class_of_.Resize(n_pages_ + c.n_pages)) {
    munmap(base, reserved);
    return IoError("cannot reserve address space for the KV pool's page table (" + std::to_string(c.n_pages) +
                   " pages); lower the budget (--kv budget=...) or use larger pages");
  }
  const int index = static_cast<int>(classes_.size());
  classes_.push_back(std::move(c));
  n_pages_ += classes_.back().n_pages;
  return index;
}

BlockPool::~BlockPool() {
  for (const SizeClass& c : classes_) munmap(c.base, c.reserved_bytes);
}

int32_t BlockPool::ExtentSize(const SizeClass& c, int32_t e) const {
  return static_cast<int32_t>(std::min<int64_t>(c.extent_pages, c.n_pages - static_cast<int64_t>(e) * c.extent_pages));
}

void BlockPool::PageFreed(SizeClass& c, PageId id, bool front) {
  const int32_t e = ExtentOf(c, id);
  if (++c.extent_free[e] < ExtentSize(c, e)) return;
  // Wholly free: onto the extent list (front when a page was just released, so
  // warm memory is reused first; back while the class is being set up).
  if (front) {
    c.extent_prev[e] = -1;
    c.extent_next[e] = c.extent_head;
    if (c.extent_head >= 0) c.extent_prev[c.extent_head] = e; else c.extent_tail = e;
    c.extent_head = e;
  } else {
    c.extent_next[e] = -1;
    c.extent_prev[e] = c.extent_tail;
    if (c.extent_tail >= 0) c.extent_next[c.extent_tail] = e; else c.extent_head = e;
    c.extent_tail = e;
  }
}

void BlockPool::PageTaken(SizeClass& c, PageId id) {
  const int32_t e = ExtentOf(c, id);
  if (c.extent_free[e]-- < ExtentSize(c, e)) return;
  const int32_t p = c.extent_prev[e], n = c.extent_next[e];  // was wholly free: unlink it
  if (p >= 0) c.extent_next[p] = n; else c.extent_head = n;
  if (n >= 0) c.extent_prev[n] = p; else c.extent_tail = p;
  c.extent_prev[e] = c.extent_next[e] = -1;
}

void BlockPool::PushFront(PageId id) {
  SizeClass& c = classes_[class_of_[id]];
  PageFreed(c, id, /*front=*/true);
  prev_[id] = kNoPage;
  next_[id] = c.head;
  if (c.head != kNoPage) prev_[c.head] = id; else c.tail = id;
  c.head = id;
  flags_[id] |= kFlagOnFreeList;
}

void BlockPool::PushBack(PageId id) {
  SizeClass& c = classes_[class_of_[id]];
  PageFreed(c, id, /*front=*/false);
  next_[id] = kNoPage;
  prev_[id] = c.tail;
  if (c.tail != kNoPage) next_[c.tail] = id; else c.head = id;
  c.tail = id;
  flags_[id] |= kFlagOnFreeList;
}

void BlockPool::Unlink(PageId id) {
  SizeClass& c = classes_[class_of_[id]];
  PageTaken(c, id);
  const PageId p = prev_[id], n = next_[id];
  if (p != kNoPage) next_[p] = n; else c.head = n;
  if (n != kNoPage) prev_[n] = p; else c.tail = p;
  prev_[id] = next_[id] = kNoPage;
  flags_[id] &= static_cast<uint8_t>(~kFlagOnFreeList);
}

std::string BlockPool::ExhaustedMessage(const SizeClass& c) const {
  std::string in_use = std::to_string(n_in_use_) + " pages";
  if (classes_.size() == 1) {
    in_use += " of " + std::to_string(c.page_bytes) + " bytes";
  } else {
    in_use += " (" + std::to_string(bytes_in_use_) + " bytes, " + std::to_string(classes_.size()) + " page sizes)";
  }
  return "KV budget exhausted: " + in_use + " in use (budget " + std::to_string(budget_bytes_) +
         " bytes); raise the budget (--kv budget=...) or shorten the context";
}

PageId BlockPool::Materialize(SizeClass& c) {
  KVX_DCHECK(c.frontier < end(c));
  const PageId id = c.frontier++;
  class_of_[id] = static_cast<uint8_t>(&c - classes_.data());
  refcount_[id] = 0;
  flags_[id] = 0;
  PushBack(id);
  return id;
}

Result<PageId> BlockPool::Allocate(int size_class) {
  KVX_CHECK(size_class >= 0 && size_class < num_size_classes());
  SizeClass& c = classes_[size_class];
  if (Exhausted(c)) return ResourceExhausted(ExhaustedMessage(c));
  // Listed free pages first (warm), then never-used ones.
  if (c.head != kNoPage || c.frontier == end(c)) return Take(c, c.head);
  return Take(c, Materialize(c));
}

Result<PageId> BlockPool::AllocateAfter(int size_class, PageId prev) {
  KVX_CHECK(size_class >= 0 && size_class < num_size_classes());
  SizeClass& c = classes_[size_class];
  if (Exhausted(c)) return ResourceExhausted(ExhaustedMessage(c));
  const PageId next = prev + 1;
  if (prev != kNoPage && prev >= c.first && prev < c.frontier) {
    if (next < c.frontier && (flags_[next] & kFlagOnFreeList)) return Take(c, next);
    if (next == c.frontier && next < end(c)) return Take(c, Materialize(c));  // grow at the frontier
  }
  if (c.extent_head >= 0) return Take(c, c.first + c.extent_head * c.extent_pages);
  if (c.frontier < end(c)) {
    // Start a run in a fresh extent: the pages up to its boundary are listed
    // as free for anyone (they end the previous extent's run).
    const int64_t rel = c.frontier - c.first;
    const PageId boundary = c.first + static_cast<PageId>((rel + c.extent_pages - 1) / c.extent_pages * c.extent_pages);
    if (boundary < end(c)) {
      while (c.frontier < boundary) Materialize(c);
    }
    return Take(c, Materialize(c));
  }
  return Take(c, c.head);
}

PageId BlockPool::Take(SizeClass& c, PageId id) {
  Unlink(id);
  if (!(flags_[id] & kFlagTouched)) {
    flags_[id] |= kFlagTouched;
    ++c.n_touched;
  }
  refcount_[id] = 1;
  ++n_in_use_;
  ++c.n_in_use;
  bytes_in_use_ += c.page_bytes;
  return id;
}

void BlockPool::Ref(PageId id) {
  KVX_CHECK(Valid(id) && refcount_[id] > 0);
  ++refcount_[id];
}

void BlockPool::Unref(PageId id) {
  KVX_CHECK(Valid(id) && refcount_[id] > 0);
  if (--refcount_[id] > 0) return;
  SizeClass& c = classes_[class_of_[id]];
  --n_in_use_;
  --c.n_in_use;
  bytes_in_use_ -= c.page_bytes;
  PushFront(id);  // reuse warm, committed memory first
}

uint64_t BlockPool::ReleaseFreeMemory() {
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t released = 0;
  for (SizeClass& c : classes_) {
    const PageId last = c.frontier;  // pages past it were never touched
    // Walk runs of consecutive free page ids; release the OS pages inside each run.
    PageId id = c.first;
    while (id < last) {
      if (refcount_[id] != 0) {
        ++id;
        continue;
      }
      PageId end = id;
      bool any_touched = false;
      while (end < last && refcount_[end] == 0) any_touched |= (flags_[end++] & kFlagTouched) != 0;
      if (any_touched) {
        const size_t lo = AlignUp(static_cast<size_t>(id - c.first) * c.page_bytes, os_page);
        size_t hi = static_cast<size_t>(end - c.first) * c.page_bytes;
        if (end == last) hi = c.reserved_bytes;  // the mapping's tail belongs to the last page
        hi = hi / os_page * os_page;
        if (hi > lo && madvise(c.base + lo, hi - lo, MADV_DONTNEED) == 0) {
          released += hi - lo;
          // Pages now entirely inside [lo, hi) are uncommitted again.
          for (PageId p = id; p < end; ++p) {
            const size_t b = static_cast<size_t>(p - c.first) * c.page_bytes;
            if (b >= lo && b + c.page_bytes <= hi && (flags_[p] & kFlagTouched)) {
              flags_[p] &= static_cast<uint8_t>(~kFlagTouched);
              --c.n_touched;
            }
          }
        }
      }
      id = end;
    }
  }
  return released;
}

BlockPoolStats BlockPool::Stats() const {
  BlockPoolStats s;
  s.pages_total = pages_total();
  s.pages_in_use = n_in_use_;
  s.bytes_in_use = bytes_in_use_;
  for (const SizeClass& c : classes_) s.bytes_committed_estimate += static_cast<uint64_t>(c.n_touched) * c.page_bytes;
  s.budget_bytes = budget_bytes_;
  return s;
}

std::vector<PageId> BlockPool::FreeListForTest(int size_class) const {
  std::vector<PageId> out;
  const SizeClass& c = classes_[size_class];
  for (PageId id = c.head; id != kNoPage; id = next_[id]) out.push_back(id);
  for (PageId id = c.frontier; id < end(c); ++id) out.push_back(id);  // never used, allocated in this order
  return out;
}

Status BlockPool::CheckInvariants() const {
  auto fail = [](const std::string& m) { return Internal("BlockPool invariant violated: " + m); };
  int64_t total_in_use = 0;
  uint64_t total_bytes = 0;
  for (size_t ci = 0; ci < classes_.size(); ++ci) {
    const SizeClass& c = classes_[ci];
    if (c.frontier < c.first || c.frontier > end(c)) return fail("frontier out of range");
    const PageId last = c.frontier;  // pages past it have no metadata yet
    const std::string cls = classes_.size() > 1 ? " (size class " + std::to_string(ci) + ")" : "";
    int64_t listed = 0;
    PageId prev = kNoPage;
    for (PageId id = c.head; id != kNoPage; id = next_[id]) {
      if (id < c.first || id >= last) return fail("free list" + cls + " holds foreign id " + std::to_string(id));
      if (++listed > c.n_pages) return fail("free list" + cls + " has a cycle");
      if (prev_[id] != prev) return fail("prev link of page " + std::to_string(id) + " is wrong");
      if (!(flags_[id] & kFlagOnFreeList)) return fail("listed page " + std::to_string(id) + " lacks the flag");
      if (refcount_[id] != 0) {
        return fail("page " + std::to_string(id) + " is free-listed with refcount " + std::to_string(refcount_[id]));
      }
      prev = id;
    }
    if (c.tail != prev) return fail("tail does not match the last listed page" + cls);
    int64_t zero = 0, in_use = 0, touched = 0;
    for (PageId id = c.first; id < last; ++id) {
      if (class_of_[id] != ci) return fail("page " + std::to_string(id) + " has the wrong size class");
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
    if (zero != listed) return fail("free pages " + std::to_string(zero) + " != listed " + std::to_string(listed) + cls);
    if (in_use != c.n_in_use) {
      return fail("pages in use " + std::to_string(in_use) + " != counter " + std::to_string(c.n_in_use) + cls);
    }
    if (in_use + zero != c.frontier - c.first) return fail("counts do not add up to the class's used pages" + cls);
    if (touched != c.n_touched) return fail("touched counter is wrong" + cls);
    KVX_RETURN_IF_ERROR(CheckExtents(c, cls));
    total_in_use += in_use;
    total_bytes += static_cast<uint64_t>(in_use) * c.page_bytes;
  }
  if (total_in_use != n_in_use_) return fail("pages in use counter is wrong");
  if (total_bytes != bytes_in_use_) return fail("bytes in use counter is wrong");
  if (bytes_in_use_ > budget_bytes_) return fail("bytes in use exceed the budget");
  return Status::Ok();
}

Status BlockPool::CheckExtents(const SizeClass& c, const std::string& cls) const {
  auto fail = [&](const std::string& m) { return Internal("BlockPool invariant violated: " + m + cls); };
  // Only extents the frontier has reached can hold free pages (O(used pages)).
  const int32_t n_extents =
      static_cast<int32_t>((c.frontier - c.first + c.extent_pages - 1) / c.extent_pages);
  std::vector<uint8_t> listed(static_cast<size_t>(n_extents), 0);
  int32_t prev = -1, count = 0;
  for (int32_t e = c.extent_head; e >= 0; e = c.extent_next[e]) {
    if (e >= n_extents || listed[e] || ++count > n_extents) return fail("extent list is corrupt");
    if (c.extent_prev[e] != prev) return fail("prev link of extent " + std::to_string(e) + " is wrong");
    listed[e] = 1;
    prev = e;
  }
  if (c.extent_tail != prev) return fail("extent tail does not match the last listed extent");
  for (int32_t e = 0; e < n_extents; ++e) {
    int32_t free = 0;
    for (int32_t i = 0; i < ExtentSize(c, e); ++i) {
      const PageId id = c.first + e * c.extent_pages + i;
      free += id < c.frontier && refcount_[id] == 0;
    }
    if (free != c.extent_free[e]) return fail("free count of extent " + std::to_string(e) + " is wrong");
    if ((free == ExtentSize(c, e)) != (listed[e] != 0)) {
      return fail("extent " + std::to_string(e) + (listed[e] ? " is listed but not wholly free" : " is wholly free but not listed"));
    }
  }
  return Status::Ok();
}

}  // namespace kvx::kv
