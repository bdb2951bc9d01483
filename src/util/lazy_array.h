// LazyArray<T>: a growable array of trivially copyable T whose memory the OS
// commits only where it is written. It is an anonymous MAP_NORESERVE mapping:
// every element reads as all-zero bytes until set, and untouched parts cost
// no resident memory. The KV block pool sizes its per-page metadata by the
// budget (possibly millions of pages) but touches only the pages it hands out.
//
// Thread-safety: like std::vector (Resize may move the storage).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace kvx {

template <class T>
class LazyArray {
  static_assert(std::is_trivially_copyable_v<T>, "LazyArray holds raw, zero-initialised memory");

 public:
  LazyArray() = default;
  ~LazyArray() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  LazyArray(const LazyArray&) = delete;
  LazyArray& operator=(const LazyArray&) = delete;
  LazyArray(LazyArray&& o) noexcept { *this = std::move(o); }
  LazyArray& operator=(LazyArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  // Grows to n elements; new elements are zero bytes. Never shrinks. False
  // (and unchanged) when the OS refuses the address space.
  bool Resize(size_t n) {
    if (n <= size_) return true;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t want = (n * sizeof(T) + page - 1) / page * page;
    if (want > bytes_) {
      void* p = data_ == nullptr
                    ? mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                    : mremap(data_, bytes_, want, MREMAP_MAYMOVE);  // keeps contents; the new tail is zero
      if (p == MAP_FAILED) return false;
      data_ = static_cast<T*>(p);
      bytes_ = want;
    }
    size_ = n;
    return true;
  }

  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t bytes_ = 0;
};

}  // namespace kvx
