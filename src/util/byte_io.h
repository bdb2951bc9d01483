// ByteWriter / ByteReader: little-endian field-by-field serialization for
// kvx's binary formats (session files, engine/session_file.h; tier blocks,
// kv/tier/block_format.h). The reader is bounds-checked: the first overrun
// records what was being read and every later read returns zeros, so a
// decoder checks ok() once per section and reports Error() — a truncated or
// damaged input is a DataLoss naming the field, never an out-of-bounds read
// or a huge allocation (Fits() refuses a length the input cannot hold before
// anything is allocated).
//
// Thread-safety: value types; one thread per object.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace kvx {

class ByteWriter {
 public:
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void U8(uint8_t v) { Bytes(&v, 1); }
  void U32(uint32_t v) { Bytes(&v, 4); }
  void U64(uint64_t v) { Bytes(&v, 8); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  // `document` names the input in errors ("session file", "tier block").
  ByteReader(std::span<const uint8_t> in, const char* document) : in_(in), document_(document) {}
  bool Take(void* p, size_t n, const char* what) {
    // An empty section (an empty vector's data() may be null) reads nothing:
    // memcpy/memset with a null pointer is undefined even for 0 bytes.
    if (n == 0) return ok_;
    if (!ok_ || n > in_.size() - pos_) {
      if (ok_) what_ = what;
      ok_ = false;
      std::memset(p, 0, n);
      return false;
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  uint8_t U8(const char* what) {
    uint8_t v = 0;
    Take(&v, 1, what);
    return v;
  }
  uint32_t U32(const char* what) {
    uint32_t v = 0;
    Take(&v, 4, what);
    return v;
  }
  uint64_t U64(const char* what) {
    uint64_t v = 0;
    Take(&v, 8, what);
    return v;
  }
  // A run of `n` elements of `size` bytes, refused before allocating when
  // the input cannot hold it.
  bool Fits(uint64_t n, size_t size, const char* what) {
    if (ok_ && n <= (in_.size() - pos_) / size) return true;
    if (ok_) what_ = what;
    ok_ = false;
    return false;
  }
  std::string Str(const char* what) {
    const uint32_t n = U32(what);
    if (!Fits(n, 1, what)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::span<const uint8_t> Span(size_t n, const char* what) {
    if (!Fits(n, 1, what)) return {};
    std::span<const uint8_t> s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  template <class T>
  void Array(std::vector<T>* v, uint64_t n, const char* what) {
    v->clear();
    if (!Fits(n, sizeof(T), what)) return;
    v->resize(n);
    Take(v->data(), n * sizeof(T), what);
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  Status Error() const {
    return DataLoss(std::string(document_) + " is malformed: " + what_ + " runs past the end of its data");
  }

 private:
  std::span<const uint8_t> in_;
  const char* document_;
  size_t pos_ = 0;
  bool ok_ = true;
  const char* what_ = "";
};

}  // namespace kvx
