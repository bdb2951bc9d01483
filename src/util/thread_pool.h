// ThreadPool: a fixed set of worker threads that run parallel loops.
// The calling thread takes part in the work, so a pool of N threads uses
// N-1 workers. Work is split into contiguous ranges by index, so results
// are deterministic as long as each index writes only its own outputs.
//
// Latency: decoding one token runs a few hundred small parallel loops (each
// a few microseconds of work), so dispatch must cost well under a
// microsecond. Workers therefore spin on an atomic job counter after each
// loop (`pause`, then sched_yield so a busy machine's other threads, ours
// included, can run) for kSpinMicros before they sleep on a futex
// (std::atomic::wait). The caller publishes a job with one atomic increment
// and makes a wake-up system call only when some worker is asleep. It waits
// for the workers the same way. An idle pool costs no CPU after kSpinMicros.
//
// Both loops cut [0, n) into ranges ("chunks") and give each thread a share
// of consecutive chunks (thread t, the caller being 0, the t-th of size()
// almost equal shares). A thread claims its own share's chunks front to
// back, each with a compare-and-swap on a word only it uses until then (no
// cache-line transfer: 64 one-index claims on 2 threads took ~2 us against
// ~6 us on one shared word, ops_bench ThreadPoolDynamic/grain:1); when its
// share is done it takes what is left of the others' shares, also front to
// back (a matmul's weight stream stays in order). So a worker
// that is late (asleep, or descheduled on a loaded machine) simply runs
// fewer chunks, possibly none, instead of stalling the loop for a whole
// time slice.
//   * ParallelFor: min(size(), n) chunks of almost equal length; on an idle
//     machine each thread runs its own.
//   * ParallelForDynamic: chunks of `grain` indices, for load balancing.
// Which thread runs which chunk varies from run to run, so use them when each
// index's result does not depend on that (true for loops that split outputs).
//
// Accounting (set_loop_stats): where the threads' time goes inside the
// loops, for measuring what a parallel step loses beyond its work (ops_bench
// StepAccount). Off by default, when it costs one test per chunk.
//
// Thread-safety: the loops must be called from one thread at a time, and
// not from inside a loop body (no nesting).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvx {

// A non-owning reference to a callable (like std::function_ref, C++26): no
// allocation, one indirect call. The referenced callable must outlive the
// FunctionRef (true for a lambda passed as an argument to ParallelFor).
template <class Sig>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f)  // NOLINT: implicit, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  // How long an idle worker (or the waiting caller) spins before sleeping.
  static constexpr int kSpinMicros = 500;

  // n_threads <= 0 means "all hardware threads".
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  using RangeFn = FunctionRef<void(size_t, size_t, int)>;

  // Calls fn(begin, end, thread_index) once for each of min(size(), n)
  // contiguous ranges of (almost) equal length covering [0, n); thread_index
  // (in [0, size()), 0 = the caller) is the thread running the call, and no
  // two concurrent calls share one. Returns when all ranges are done.
  void ParallelFor(size_t n, RangeFn fn);

  // Calls fn(begin, end, thread_index) once for each range of `grain`
  // indices (the last may be shorter) covering [0, n); a thread may run
  // several (its own share's, then others', in increasing order). Returns
  // when all ranges are done.
  // grain 0 means 1.
  void ParallelForDynamic(size_t n, size_t grain, RangeFn fn);

  // Thread time inside the loops that ran on several threads (a loop run
  // inline by the caller alone is not counted), in nanoseconds summed over
  // the loops. Per loop of wall time W, each of the size() threads spends W
  // as: waiting for its first chunk (late), in chunks (busy), claiming
  // between chunks (claims), done before the thread that finished last
  // (imbalance), and from that last chunk's end to the caller's return (join).
  struct LoopStats {
    int64_t loops = 0;
    int64_t wall_ns = 0;       // the caller's time in the loops, publication to return
    int64_t busy_ns = 0;       // inside fn
    int64_t late_ns = 0;       // publication to a thread's first chunk (all of W if it ran none)
    int64_t imbalance_ns = 0;  // a thread's last chunk's end to the last thread's
    int64_t join_ns = 0;       // the last chunk's end to the caller's return, each thread that ran
    int64_t claims_ns = 0;     // the rest: between a thread's chunks
    void Add(const LoopStats& o);
  };
  // Adds every following loop to *stats until called with nullptr. Call
  // between loops, from the thread that runs them.
  void set_loop_stats(LoopStats* stats) { loop_stats_ = stats; }

 private:
  struct Shared;
  struct ShareWord;
  struct ThreadTimes;
  void AccountLoop(int64_t start_ns);
  void Run(size_t n, size_t grain, uint64_t n_chunks, RangeFn fn);
  static int64_t RunClaimedChunks(Shared& s, uint32_t epoch, int thread, int n_shares);
  void WorkerLoop(int index);

  int n_threads_;
  std::unique_ptr<Shared> shared_;
  std::vector<std::thread> workers_;
  LoopStats* loop_stats_ = nullptr;
};

}  // namespace kvx
