#include "model/fingerprint.h"

#include <algorithm>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvx::model {
namespace {

class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Bytes(const void* p, size_t n) { XXH3_64bits_update(state_, p, n); }
  void U64(uint64_t v) { Bytes(&v, sizeof v); }
  void Str(const std::string& s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  void Value(const gguf::Value& v) {
    U64(static_cast<uint64_t>(v.type));
    if (const auto* u = std::get_if<uint64_t>(&v.data)) U64(*u);
    if (const auto* i = std::get_if<int64_t>(&v.data)) U64(static_cast<uint64_t>(*i));
    if (const auto* d = std::get_if<double>(&v.data)) Bytes(d, sizeof *d);
    if (const auto* b = std::get_if<bool>(&v.data)) U64(*b ? 1 : 0);
    if (const auto* s = std::get_if<std::string>(&v.data)) Str(*s);
    if (const auto* a = std::get_if<std::vector<gguf::Value>>(&v.data)) {
      U64(static_cast<uint64_t>(v.array_type));
      U64(a->size());
      for (const gguf::Value& e : *a) Value(e);
    }
  }
  uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

constexpr size_t kRun = 4096;
constexpr size_t kRuns = 16;

}  // namespace

uint64_t ModelFingerprint(const gguf::GgufFile& file) {
  Hasher h;
  for (const auto& [key, value] : file.metadata()) {
    h.Str(key);
    h.Value(value);
  }
  for (const gguf::TensorInfo& t : file.tensors()) {
    h.Str(t.name);
    h.U64(static_cast<uint64_t>(t.type));
    h.U64(t.dims.size());
    for (uint64_t d : t.dims) h.U64(d);
    h.U64(t.n_bytes);
    if (t.data == nullptr || t.n_bytes == 0) continue;
    if (t.n_bytes <= kRun * kRuns) {
      h.Bytes(t.data, t.n_bytes);
      continue;
    }
    // kRuns runs of kRun bytes, the first at 0 and the last ending at n_bytes.
    const uint64_t span = t.n_bytes - kRun;
    for (size_t r = 0; r < kRuns; ++r) h.Bytes(t.data + span * r / (kRuns - 1), kRun);
  }
  return h.Digest();
}

}  // namespace kvx::model
