#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvx {
namespace {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Busy-waits until pred() holds or kSpinMicros pass; returns pred(). The
// first kPauseMicros only pause; after that each round also yields the CPU
// (on an oversubscribed machine the thread we wait for may need it).
constexpr int kPauseMicros = 50;
template <class Pred>
bool SpinFor(Pred pred) {
  if (pred()) return true;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  bool yielding = false;
  for (;;) {
    for (int i = 0; i < 64; ++i) {  // look at the clock only every 64 pauses
      CpuRelax();
      if (pred()) return true;
    }
    if (yielding) std::this_thread::yield();
    const auto waited = Clock::now() - start;
    if (waited >= std::chrono::microseconds(ThreadPool::kSpinMicros)) return pred();
    yielding = waited >= std::chrono::microseconds(kPauseMicros);
  }
}

// A share's claim word: | epoch:24 | end:20 | next:20 |, the chunks
// [next, end) of the share not yet claimed. A thread claims `next` (next+1)
// with a CAS on the whole word, so a late worker can never claim a chunk of a
// newer job (the epoch would differ).
constexpr int kFieldBits = 20;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
constexpr uint64_t kMaxChunks = kFieldMask;
inline uint64_t PackClaim(uint32_t epoch, uint64_t end, uint64_t next) {
  return (static_cast<uint64_t>(epoch & 0xFFFFFF) << (2 * kFieldBits)) | (end << kFieldBits) | next;
}
inline uint32_t ClaimEpoch(uint64_t c) { return static_cast<uint32_t>(c >> (2 * kFieldBits)); }
inline uint64_t ClaimEnd(uint64_t c) { return (c >> kFieldBits) & kFieldMask; }
inline uint64_t ClaimNext(uint64_t c) { return c & kFieldMask; }

}  // namespace

struct alignas(64) ThreadPool::ShareWord {
  std::atomic<uint64_t> word{0};
};

// One thread's chunks in the current loop when it is accounted (LoopStats):
// written by that thread only, read by the caller once the loop is done.
struct alignas(64) ThreadPool::ThreadTimes {
  int64_t first_ns = 0;  // start of its first chunk; 0: none yet
  int64_t last_ns = 0;   // end of its last chunk
  int64_t busy_ns = 0;
};

// Fields written by the caller and read by every worker sit apart from the
// counters the threads update, so finishing threads do not invalidate the
// line the idle ones poll.
struct ThreadPool::Shared {
  // Job description: written before the epoch is published, read by a
  // thread only after it claimed a chunk (the caller cannot finish the job,
  // and overwrite them, before that chunk is done).
  alignas(64) const RangeFn* job = nullptr;
  size_t job_n = 0;
  size_t job_grain = 0;  // chunk c = [c * grain, ...); 0: equal split into job_chunks
  uint64_t job_chunks = 0;
  bool job_timed = false;  // fill `times` (set_loop_stats)
  std::atomic<bool> stop{false};
  // Incremented once per job; idle workers wait for it to change.
  alignas(64) std::atomic<uint32_t> epoch{0};
  std::atomic<int> sleeping_workers{0};
  // One claim word per thread's share of the chunks, each on its own line:
  // until shares run out, a thread's claims touch only its own line.
  std::unique_ptr<ShareWord[]> shares;
  std::unique_ptr<ThreadTimes[]> times;
  // Chunks done in the current job.
  alignas(64) std::atomic<int64_t> done{0};
  std::atomic<int> caller_sleeping{0};
};

ThreadPool::ThreadPool(int n_threads) : shared_(std::make_unique<Shared>()) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  shared_->shares = std::make_unique<ShareWord[]>(static_cast<size_t>(n_threads_));
  shared_->times = std::make_unique<ThreadTimes[]>(static_cast<size_t>(n_threads_));
  for (int i = 1; i < n_threads_; ++i) {
    try {
      workers_.emplace_back([this, i] { WorkerLoop(i); });
    } catch (const std::system_error&) {
      // The OS refused another thread (a low `ulimit -u`, a huge thread
      // count): run with the threads it gave. Letting the exception out
      // would destroy the started threads unjoined, which calls
      // std::terminate. Workers read n_threads_ only after the first Run
      // publishes an epoch, so changing it here is not a race.
      n_threads_ = i;
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  Shared& s = *shared_;
  s.stop.store(true, std::memory_order_relaxed);
  s.epoch.fetch_add(1, std::memory_order_seq_cst);
  s.epoch.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(size_t n, RangeFn fn) {
  if (n == 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  Run(n, 0, std::min<size_t>(n, static_cast<size_t>(n_threads_)), fn);
}

void ThreadPool::ParallelForDynamic(size_t n, size_t grain, RangeFn fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  grain = std::max<size_t>(grain, (n + kMaxChunks - 1) / kMaxChunks);  // chunk count fits the claim word
  if (n_threads_ == 1 || n <= grain) {
    for (size_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain), 0);
    return;
  }
  Run(n, grain, (n + grain - 1) / grain, fn);
}

// Runs chunk c of the current job: [c * grain, ...), or with grain 0 the
// c-th of n_chunks almost equal ranges (the first n % n_chunks one longer).
static void RunChunk(const ThreadPool::RangeFn& fn, size_t n, size_t grain, uint64_t n_chunks, uint64_t c,
                     int thread) {
  size_t b, e;
  if (grain > 0) {
    b = c * grain;
    e = std::min(n, b + grain);
  } else {
    const size_t chunk = n / n_chunks, extra = n % n_chunks;
    b = c * chunk + std::min<size_t>(c, extra);
    e = b + chunk + (c < extra ? 1 : 0);
  }
  fn(b, e, thread);
}

// Claims and runs chunks of job `epoch`: first the thread's own share, then
// what is left of the others', each front to back. In increasing order, a
// thread that takes over a late worker's share runs it as that worker would
// have: a matmul's chunks continue the weight stream its last chunk
// prefetched. Taken back to front, each stolen chunk started cold and
// prefetched the bytes of the chunk just done: on a loaded machine, where the
// caller takes over most of a step, the caller of a 16-row step spent 1.15x
// the CPU time of the whole step on one thread, now 0.99x (ops_bench
// StepAccount, docs/benchmarks.md). Returns how many this thread ran.
int64_t ThreadPool::RunClaimedChunks(Shared& s, uint32_t epoch, int thread, int n_shares) {
  int64_t ran = 0;
  epoch &= 0xFFFFFF;
  for (int k = 0; k < n_shares; ++k) {
    const int owner = (thread + k) % n_shares;
    std::atomic<uint64_t>& claim = s.shares[owner].word;
    uint64_t word = claim.load(std::memory_order_acquire);
    for (;;) {
      if (ClaimEpoch(word) != epoch) return ran;  // the job is over (a newer one may have started)
      const uint64_t next = ClaimNext(word), end = ClaimEnd(word);
      if (next >= end) break;  // this share is done: on to the next
      if (!claim.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        continue;  // word was reloaded
      }
      // Only the steady clock here (no system call): a thread that could be
      // preempted between its last chunk and its `done` would delay the join.
      ThreadTimes* mine = s.job_timed ? &s.times[thread] : nullptr;
      const int64_t t0 = mine != nullptr ? NowNs() : 0;
      if (mine != nullptr && mine->first_ns == 0) mine->first_ns = t0;
      RunChunk(*s.job, s.job_n, s.job_grain, s.job_chunks, next, thread);
      if (mine != nullptr) {
        mine->last_ns = NowNs();
        mine->busy_ns += mine->last_ns - t0;
      }
      ++ran;
      word = claim.load(std::memory_order_acquire);
    }
  }
  return ran;
}

void ThreadPool::Run(size_t n, size_t grain, uint64_t n_chunks, RangeFn fn) {
  Shared& s = *shared_;
  const uint32_t epoch = s.epoch.load(std::memory_order_relaxed) + 1;
  const int64_t start_ns = loop_stats_ != nullptr ? NowNs() : 0;
  s.job_timed = loop_stats_ != nullptr;
  if (s.job_timed) {
    for (int t = 0; t < n_threads_; ++t) s.times[t] = ThreadTimes{};
  }
  s.job = &fn;
  s.job_n = n;
  s.job_grain = grain;
  s.job_chunks = n_chunks;
  s.done.store(0, std::memory_order_relaxed);
  // Thread t's share: chunks [t * n_chunks / T, (t + 1) * n_chunks / T).
  const uint64_t shares = static_cast<uint64_t>(n_threads_);
  for (uint64_t t = 0; t < shares; ++t) {
    s.shares[t].word.store(PackClaim(epoch, (t + 1) * n_chunks / shares, t * n_chunks / shares),
                           std::memory_order_relaxed);
  }
  // seq_cst pairs with the workers' increment of sleeping_workers: either we
  // see a sleeper and wake it, or the sleeper sees the new epoch.
  s.epoch.store(epoch, std::memory_order_seq_cst);
  if (s.sleeping_workers.load(std::memory_order_seq_cst) > 0) s.epoch.notify_all();

  const int64_t mine = RunClaimedChunks(s, epoch, 0, n_threads_);
  const int64_t target = static_cast<int64_t>(n_chunks);
  if (s.done.fetch_add(mine, std::memory_order_acq_rel) + mine != target) {
    auto finished = [&] { return s.done.load(std::memory_order_acquire) == target; };
    if (!SpinFor(finished)) {
      s.caller_sleeping.store(1, std::memory_order_seq_cst);
      for (int64_t d = s.done.load(std::memory_order_seq_cst); d != target; d = s.done.load(std::memory_order_seq_cst)) {
        s.done.wait(d, std::memory_order_seq_cst);
      }
      s.caller_sleeping.store(0, std::memory_order_relaxed);
    }
  }
  s.job = nullptr;
  if (s.job_timed) AccountLoop(start_ns);
}

// Splits the loop that started at start_ns and is done now into the parts of
// LoopStats. Every worker that ran a chunk wrote its times before adding to
// `done`, which the caller read.
void ThreadPool::AccountLoop(int64_t start_ns) {
  const int64_t end_ns = NowNs();
  LoopStats loop;
  loop.loops = 1;
  loop.wall_ns = end_ns - start_ns;
  int64_t last_end = start_ns;
  for (int t = 0; t < n_threads_; ++t) last_end = std::max(last_end, shared_->times[t].last_ns);
  for (int t = 0; t < n_threads_; ++t) {
    const ThreadTimes& tt = shared_->times[t];
    if (tt.first_ns == 0) {  // ran no chunk
      loop.late_ns += loop.wall_ns;
      continue;
    }
    loop.busy_ns += tt.busy_ns;
    loop.late_ns += tt.first_ns - start_ns;
    loop.imbalance_ns += last_end - tt.last_ns;
    loop.join_ns += end_ns - last_end;
  }
  loop.claims_ns = n_threads_ * loop.wall_ns - loop.busy_ns - loop.late_ns - loop.imbalance_ns - loop.join_ns;
  loop_stats_->Add(loop);
}

void ThreadPool::LoopStats::Add(const LoopStats& o) {
  loops += o.loops;
  wall_ns += o.wall_ns;
  busy_ns += o.busy_ns;
  late_ns += o.late_ns;
  imbalance_ns += o.imbalance_ns;
  join_ns += o.join_ns;
  claims_ns += o.claims_ns;
}

void ThreadPool::WorkerLoop(int index) {
  Shared& s = *shared_;
  uint32_t seen = 0;
  for (;;) {
    auto changed = [&] { return s.epoch.load(std::memory_order_acquire) != seen; };
    if (!SpinFor(changed)) {
      s.sleeping_workers.fetch_add(1, std::memory_order_seq_cst);
      while (s.epoch.load(std::memory_order_seq_cst) == seen) s.epoch.wait(seen, std::memory_order_seq_cst);
      s.sleeping_workers.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = s.epoch.load(std::memory_order_acquire);
    if (s.stop.load(std::memory_order_relaxed)) return;
    const int64_t ran = RunClaimedChunks(s, seen, index, n_threads_);
    if (ran == 0) continue;
    // seq_cst pairs with the caller's store of caller_sleeping.
    s.done.fetch_add(ran, std::memory_order_seq_cst);
    if (s.caller_sleeping.load(std::memory_order_seq_cst) != 0) s.done.notify_one();
  }
}

}  // namespace kvx
