// libFuzzer target for the GGUF reader. Every input must parse to OK or to an
// error status; on OK every value and every tensor byte is touched (so
// ASan sees any out-of-range pointer), and the parsed file is re-encoded with
// GgufWriter and parsed again: whatever the reader accepts, the writer must
// reproduce (same metadata, tensors, bytes).
//
// Seed corpus: fuzz/corpus/gguf/ (tiny valid files made with GgufWriter).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace {

using kvx::gguf::GgufFile;
using kvx::gguf::GgufWriter;
using kvx::gguf::TensorInfo;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "gguf_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

uint64_t Touch(const GgufFile& f, const uint8_t* begin, size_t size) {
  uint64_t sum = 0;
  for (const auto& [key, value] : f.metadata()) {
    sum += GgufFile::ValueToString(value, 64).size();
    sum += f.GetUint(key).ok() + f.GetInt(key).ok() + f.GetFloat(key).ok();
    sum += f.GetBool(key).ok() + f.GetString(key).ok() + f.GetStringArray(key).ok();
    sum += f.GetFloatArray(key).ok() + f.GetIntArray(key).ok();
    if (f.Find(key) != &value) Fail("Find", key);
  }
  for (const TensorInfo& t : f.tensors()) {
    if (t.n_bytes > 0 && (t.data < begin || t.data + t.n_bytes > begin + size)) {
      Fail("tensor out of range", t.name);
    }
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
    if (f.FindTensor(t.name) != &t) Fail("FindTensor", t.name);
  }
  return sum;
}

void RoundTrip(const GgufFile& f) {
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) {
    const kvx::Status s = w.SetValue(key, value);
    if (!s.ok()) Fail("writer rejected a parsed value", s.ToString());
  }
  for (const TensorInfo& t : f.tensors()) {
    const kvx::Status s = w.AddTensorRef(t.name, t.type, t.dims, t.data, t.n_bytes);
    if (!s.ok()) Fail("writer rejected a parsed tensor", s.ToString());
  }
  const std::vector<uint8_t> buf = w.WriteToBuffer();
  auto g = GgufFile::Parse(buf.data(), buf.size(), "re-encoded");
  if (!g.ok()) Fail("re-encoded file does not parse", g.status().ToString());
  if ((*g)->metadata().size() != f.metadata().size() ||
      (*g)->tensors().size() != f.tensors().size() || (*g)->alignment() != f.alignment()) {
    Fail("re-encoded file differs", f.name());
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& a = f.tensors()[i];
    const TensorInfo& b = (*g)->tensors()[i];
    if (a.name != b.name || a.dims != b.dims || a.type != b.type || a.n_bytes != b.n_bytes ||
        (a.n_bytes > 0 && std::memcmp(a.data, b.data, a.n_bytes) != 0)) {
      Fail("re-encoded tensor differs", a.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = GgufFile::Parse(data, size, "fuzz");
  if (!f.ok()) {
    if (f.status().message().empty()) Fail("empty error message", f.status().ToString());
    return 0;
  }
  volatile uint64_t sink = Touch(**f, data, size);
  (void)sink;
  RoundTrip(**f);
  return 0;
}
