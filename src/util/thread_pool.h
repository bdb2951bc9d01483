// ThreadPool: a fixed set of worker threads that run ParallelFor loops.
// The calling thread takes part in the work, so a pool of N threads uses
// N-1 workers. Work is split into contiguous ranges by index, so results
// are deterministic as long as each index writes only its own outputs.
//
// Thread-safety: ParallelFor must be called from one thread at a time.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvx {

class ThreadPool {
 public:
  // n_threads <= 0 means "all hardware threads".
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over [0, n) split into size() contiguous
  // ranges (fewer if n is small). Returns when all ranges are done.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t, int)>& fn);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(size_t, size_t, int)>* job_ = nullptr;
  size_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvx
