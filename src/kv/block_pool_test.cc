#include "kv/block_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

namespace kvx::kv {
namespace {

#define EXPECT_INVARIANTS(pool) EXPECT_TRUE((pool).CheckInvariants().ok()) << (pool).CheckInvariants().ToString()

std::unique_ptr<BlockPool> MakePool(uint64_t budget, size_t page_bytes) {
  auto r = BlockPool::Create({.budget_bytes = budget, .page_bytes = page_bytes});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(BlockPoolTest, CreateRejectsBudgetBelowOnePage) {
  auto r = BlockPool::Create({.budget_bytes = 100, .page_bytes = 128});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("smaller than one page"), std::string::npos);
  EXPECT_FALSE(BlockPool::Create({.budget_bytes = 1024, .page_bytes = 0}).ok());
}

TEST(BlockPoolTest, PageBytesRoundedToCacheLine) {
  auto pool = MakePool(10000, 100);
  EXPECT_EQ(pool->page_bytes(), 128u);
  EXPECT_EQ(pool->pages_total(), 10000 / 128);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, AllocateFreeRefAndStats) {
  auto pool = MakePool(8 * 256, 256);
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(pool->pages_total(), 8);
  EXPECT_EQ(pool->Stats().bytes_committed_estimate, 0u);
  auto a = pool->Allocate();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 0);  // fresh pages come in address order
  EXPECT_EQ(pool->RefCount(*a), 1);
  EXPECT_FALSE(pool->IsShared(*a));
  EXPECT_EQ(pool->pages_in_use(), 1);
  EXPECT_EQ(pool->bytes_in_use(), 256u);
  EXPECT_INVARIANTS(*pool);

  // Pages are writable and 64-byte aligned.
  uint8_t* data = pool->PageData(*a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 64, 0u);
  std::memset(data, 0xAB, pool->page_bytes());

  pool->Ref(*a);
  EXPECT_TRUE(pool->IsShared(*a));
  EXPECT_EQ(pool->RefCount(*a), 2);
  EXPECT_INVARIANTS(*pool);
  pool->Unref(*a);
  EXPECT_FALSE(pool->IsShared(*a));
  EXPECT_EQ(pool->pages_in_use(), 1);
  EXPECT_INVARIANTS(*pool);
  pool->Unref(*a);
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_EQ(pool->bytes_in_use(), 0u);
  EXPECT_EQ(pool->Stats().bytes_committed_estimate, 256u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, ExhaustionGivesActionableError) {
  auto pool = MakePool(4 * 128, 128);
  std::vector<PageId> ids;
  for (int i = 0; i < 4; ++i) {
    auto r = pool->Allocate();
    ASSERT_TRUE(r.ok());
    ids.push_back(*r);
    EXPECT_INVARIANTS(*pool);
  }
  auto r = pool->Allocate();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("KV budget exhausted: 4 pages of 128 bytes in use (budget 512 bytes)"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("raise the budget"), std::string::npos);
  EXPECT_INVARIANTS(*pool);
  pool->Unref(ids[2]);
  auto again = pool->Allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, ids[2]);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, ReuseOrderIsMostRecentlyFreedFirstThenFresh) {
  auto pool = MakePool(6 * 64, 64);
  PageId a = *pool->Allocate(), b = *pool->Allocate(), c = *pool->Allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  pool->Unref(a);
  pool->Unref(c);
  EXPECT_EQ(pool->FreeListForTest(), (std::vector<PageId>{2, 0, 3, 4, 5}));
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(*pool->Allocate(), c);
  EXPECT_EQ(*pool->Allocate(), a);
  EXPECT_EQ(*pool->Allocate(), 3);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, ReleaseFreeMemoryReturnsWholeOsPages) {
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Pages of os_page / 2 bytes: two pool pages per OS page.
  const size_t pb = os_page / 2;
  auto pool = MakePool(8 * pb, pb);
  std::vector<PageId> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(*pool->Allocate());
    std::memset(pool->PageData(ids.back()), 0x5A, pb);
  }
  EXPECT_EQ(pool->Stats().bytes_committed_estimate, 8 * pb);
  EXPECT_EQ(pool->ReleaseFreeMemory(), 0u);  // nothing free
  // Free pages 1, 2 (one from each of two OS pages) and 4, 5 (one whole OS page).
  for (int i : {1, 2, 4, 5}) pool->Unref(ids[i]);
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(pool->ReleaseFreeMemory(), os_page);
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(pool->Stats().bytes_committed_estimate, 6 * pb);
  // Live pages keep their contents.
  for (int i : {0, 3, 6, 7}) {
    const uint8_t* d = pool->PageData(ids[i]);
    EXPECT_TRUE(std::all_of(d, d + pb, [](uint8_t x) { return x == 0x5A; })) << i;
  }
  // Released pages read back as zero once reallocated (MADV_DONTNEED on private anonymous memory).
  std::vector<PageId> again;
  for (int i = 0; i < 4; ++i) again.push_back(*pool->Allocate());
  for (PageId id : again) {
    if (id == ids[4] || id == ids[5]) {
      const uint8_t* d = pool->PageData(id);
      EXPECT_TRUE(std::all_of(d, d + pb, [](uint8_t x) { return x == 0; })) << id;
    }
  }
  EXPECT_INVARIANTS(*pool);
  // Free everything: the whole mapping is released.
  for (int i : {0, 3, 6, 7}) pool->Unref(ids[i]);
  for (PageId id : again) pool->Unref(id);
  EXPECT_EQ(pool->ReleaseFreeMemory(), 4 * os_page);
  EXPECT_EQ(pool->Stats().bytes_committed_estimate, 0u);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, HugeBudgetCostsNothingUntilTouched) {
  // 64 GiB of address space; only the pages we touch are committed.
  auto r = BlockPool::Create({.budget_bytes = 64ull << 30, .page_bytes = 1 << 20});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  BlockPool& pool = **r;
  EXPECT_EQ(pool.pages_total(), 64 * 1024);
  PageId id = *pool.Allocate();
  std::memset(pool.PageData(id), 1, pool.page_bytes());
  EXPECT_EQ(pool.Stats().bytes_committed_estimate, 1u << 20);
  pool.Unref(id);
  EXPECT_INVARIANTS(pool);
}

// Resident memory of this process in bytes (Linux).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(BlockPoolTest, MetadataGrowsWithUseNotWithBudget) {
  // 64 GiB of 4 KiB pages: 16M pages whose metadata would take ~230 MB if it
  // were sized by the budget. It is committed only for pages handed out.
  const uint64_t before = ResidentBytes();
  auto r = BlockPool::Create({.budget_bytes = 64ull << 30, .page_bytes = 4096});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  BlockPool& pool = **r;
  EXPECT_EQ(pool.AddSizeClass(1024).value(), 1);  // a second 64M-page class, also free
  std::vector<PageId> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(*pool.AllocateAfter(0, ids.empty() ? kNoPage : ids.back()));
  EXPECT_LT(ResidentBytes() - before, 64ull << 20);
  EXPECT_EQ(ids.back(), ids.front() + 999);
  for (PageId id : ids) pool.Unref(id);
  EXPECT_INVARIANTS(pool);
}

TEST(BlockPoolTest, RandomizedStressKeepsInvariants) {
  std::mt19937 rng(1234);
  auto pool = MakePool(64 * 64, 64);
  std::vector<PageId> held;  // one entry per reference we hold
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      auto r = pool->Allocate();
      if (pool->pages_in_use() == pool->pages_total() && !r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
      }
      if (r.ok()) {
        held.push_back(*r);
      } else {
        EXPECT_EQ(pool->pages_free(), 0);
      }
    } else if (op < 6 && !held.empty()) {
      const PageId id = held[rng() % held.size()];
      pool->Ref(id);
      held.push_back(id);
    } else if (op < 9 && !held.empty()) {
      const size_t i = rng() % held.size();
      pool->Unref(held[i]);
      held[i] = held.back();
      held.pop_back();
    } else {
      pool->ReleaseFreeMemory();
    }
    if (step % 50 == 0 || step > 4900) {
      ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString() << " at step " << step;
    }
    // Refcounts match our own bookkeeping.
    if (step % 500 == 0) {
      for (PageId id = 0; id < pool->pages_total(); ++id) {
        EXPECT_EQ(pool->RefCount(id), std::count(held.begin(), held.end(), id));
      }
    }
  }
  for (PageId id : held) pool->Unref(id);
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_INVARIANTS(*pool);
}

TEST(BlockPoolTest, SizeClassesShareOneBudget) {
  auto pool = MakePool(10 * 256, 256);  // class 0: 256-byte pages
  auto small = pool->AddSizeClass(100);  // rounds to 128
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(*small, 1);
  EXPECT_EQ(*pool->AddSizeClass(128), 1);  // same rounded size: same class
  EXPECT_EQ(*pool->AddSizeClass(256), 0);
  EXPECT_EQ(pool->num_size_classes(), 2);
  EXPECT_EQ(pool->page_bytes(1), 128u);
  EXPECT_FALSE(pool->AddSizeClass(4096).ok());  // the 2560-byte budget cannot hold one such page
  EXPECT_INVARIANTS(*pool);

  // 6 big pages (1536 bytes) + 8 small ones (1024) = 2560 = the budget.
  std::vector<PageId> big, tiny;
  for (int i = 0; i < 6; ++i) big.push_back(*pool->Allocate(0));
  for (int i = 0; i < 8; ++i) tiny.push_back(*pool->Allocate(1));
  EXPECT_EQ(pool->bytes_in_use(), 2560u);
  EXPECT_EQ(pool->pages_in_use(), 14);
  for (PageId id : big) EXPECT_EQ(pool->SizeClassOf(id), 0);
  for (PageId id : tiny) {
    EXPECT_EQ(pool->SizeClassOf(id), 1);
    EXPECT_EQ(pool->PageBytesOf(id), 128u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->PageData(id)) % 64, 0u);
    std::memset(pool->PageData(id), 0x11, 128);
  }
  auto r = pool->Allocate(1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("2 page sizes"), std::string::npos) << r.status().message();
  EXPECT_INVARIANTS(*pool);
  // Freeing a big page makes room for two small ones but not for a big one plus a small one.
  pool->Unref(big.back());
  big.pop_back();
  EXPECT_TRUE(pool->Allocate(1).ok());
  EXPECT_TRUE(pool->Allocate(1).ok());
  EXPECT_FALSE(pool->Allocate(0).ok());
  EXPECT_EQ(pool->pages_free(), 0);
  EXPECT_INVARIANTS(*pool);
  EXPECT_EQ(pool->FreeListForTest(1).size(), static_cast<size_t>(2560 / 128 - 10));
  EXPECT_GT(pool->Stats().bytes_committed_estimate, 0u);
}

TEST(BlockPoolTest, SizeClassLimitsAndRelease) {
  auto pool = MakePool(64 * 1024, 1024);
  EXPECT_FALSE(pool->AddSizeClass(128 * 1024).ok());  // budget smaller than one page
  for (int i = 1; i < BlockPool::kMaxSizeClasses; ++i) ASSERT_TRUE(pool->AddSizeClass(1024 + 64 * i).ok());
  EXPECT_FALSE(pool->AddSizeClass(64).ok());  // too many classes
  std::vector<PageId> ids;
  for (int c = 0; c < pool->num_size_classes(); ++c) ids.push_back(*pool->Allocate(c));
  EXPECT_INVARIANTS(*pool);
  for (PageId id : ids) pool->Unref(id);
  pool->ReleaseFreeMemory();
  EXPECT_EQ(pool->bytes_in_use(), 0u);
  EXPECT_INVARIANTS(*pool);
}

}  // namespace
}  // namespace kvx::kv

namespace kvx::kv {
namespace {

// Tables growing in turn (as the layers of a forward pass do) still get
// consecutive pages: each starts in its own wholly free extent and continues
// right after its last page.
TEST(BlockPoolTest, AllocateAfterKeepsEachTableContiguous) {
  const size_t pb = 4096;
  const int per_extent = static_cast<int>(BlockPool::kExtentBytes / pb);
  auto pool = MakePool(8 * per_extent * pb, pb);
  constexpr int kTables = 4;
  std::vector<std::vector<PageId>> tables(kTables);
  for (int step = 0; step < per_extent; ++step) {
    for (auto& t : tables) t.push_back(*pool->AllocateAfter(0, t.empty() ? kNoPage : t.back()));
  }
  for (const auto& t : tables) {
    EXPECT_EQ(t.front() % per_extent, 0) << "a table starts at an extent boundary";
    for (size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i], t[i - 1] + 1);
  }
  EXPECT_INVARIANTS(*pool);
  // Past its extent a table continues into the next one when that is free.
  const PageId last = tables[kTables - 1].back();
  EXPECT_EQ(*pool->AllocateAfter(0, last), last + 1);
  EXPECT_INVARIANTS(*pool);
}

// Extents are a preference only: with every extent partly used, the free
// pages between the runs are still handed out, and releasing a run makes its
// extent preferred again.
TEST(BlockPoolTest, AllocateAfterFallsBackToAnyFreePage) {
  const size_t pb = 4096;
  const int per_extent = static_cast<int>(BlockPool::kExtentBytes / pb);
  auto pool = MakePool(2 * per_extent * pb, pb);
  const PageId a = *pool->AllocateAfter(0, kNoPage);
  const PageId b = *pool->AllocateAfter(0, kNoPage);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, per_extent);
  std::vector<PageId> rest;
  for (int i = 0; i < 2 * per_extent - 2; ++i) {
    auto r = pool->AllocateAfter(0, kNoPage);
    ASSERT_TRUE(r.ok()) << i;
    rest.push_back(*r);
  }
  EXPECT_FALSE(pool->AllocateAfter(0, a).ok());  // budget exhausted: clear error, nothing changed
  EXPECT_INVARIANTS(*pool);
  for (PageId id : rest) pool->Unref(id);
  pool->Unref(b);  // extent 1 wholly free again
  EXPECT_EQ(*pool->AllocateAfter(0, kNoPage), per_extent);
  EXPECT_INVARIANTS(*pool);
}

}  // namespace
}  // namespace kvx::kv
