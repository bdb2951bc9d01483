// AlignedBuffer: a growable byte buffer whose start is aligned to 4096 bytes
// and whose memory is kept across uses (Clear keeps the capacity). The KV
// tiers encode every block into one (kv/tier/block_format.h's BlockEncoder):
// a reused buffer costs no page faults per block, as a new 6 MB allocation
// does (glibc maps and unmaps it), and its alignment lets the disk tier hand
// it to the device without a copy through the page cache (O_DIRECT).
//
// Thread-safety: a value type; one thread per object.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

namespace kvx {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_.get()), size_}; }

  void Clear() { size_ = 0; }
  // Makes room for `n` bytes without changing the size.
  void Reserve(size_t n) {
    if (n <= capacity_) return;
    const size_t grown = std::max(n, capacity_ * 2);
    const size_t cap = (grown + kAlignment - 1) / kAlignment * kAlignment;
    std::unique_ptr<uint8_t[], Free> bigger(static_cast<uint8_t*>(::operator new[](cap, std::align_val_t(kAlignment))));
    if (size_ > 0) std::memcpy(bigger.get(), data_.get(), size_);
    data_ = std::move(bigger);
    capacity_ = cap;
  }
  // Sets the size to `n`; bytes beyond the old size are uninitialized.
  void Resize(size_t n) {
    Reserve(n);
    size_ = n;
  }
  // Appends, as ByteWriter does (util/byte_io.h), so one serializer writes
  // into either.
  void Bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = size_;
    Resize(size_ + n);
    std::memcpy(data_.get() + at, p, n);
  }
  void U8(uint8_t v) { Bytes(&v, 1); }
  void U32(uint32_t v) { Bytes(&v, 4); }
  void U64(uint64_t v) { Bytes(&v, 8); }

 private:
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(kAlignment)); }
  };
  std::unique_ptr<uint8_t[], Free> data_;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace kvx
