// GgufWriter tests (validation, layout, files) and the randomized corruption
// test: thousands of seeded mutations of a realistic small file must each
// parse to OK or to an error status, never crash or read out of bounds (the
// suite also runs under ASan+UBSan, and every parse gets an exact-size heap
// copy so a one-byte overread is caught).
#include "gguf/gguf_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "gguf/gguf_file.h"
#include "support/test_data.h"

namespace kvx::gguf {
namespace {

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find \"" << (needle) << "\" in: " << (haystack)

Value Int(ValueType t, int64_t v) { Value x; x.type = t; x.data = v; return x; }
Value Uint(ValueType t, uint64_t v) { Value x; x.type = t; x.data = v; return x; }
Value Arr(ValueType elem, std::vector<Value> items) {
  Value x;
  x.type = ValueType::kArray;
  x.array_type = elem;
  x.data = std::move(items);
  return x;
}

TEST(GgufWriterTest, HeaderLayoutIsStandard) {
  GgufWriter w;
  w.SetUint32("a", 7);
  const std::vector<uint8_t> b = w.WriteToBuffer();
  // magic, version 3, n_tensors 0, n_kv 1, key "a", type uint32 (4), value 7.
  const uint8_t want[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                          1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'a',
                          4, 0, 0, 0, 7, 0, 0, 0};
  ASSERT_EQ(b.size(), 64u);  // padded to the 32-byte default alignment
  EXPECT_EQ(std::memcmp(b.data(), want, sizeof(want)), 0);
  for (size_t i = sizeof(want); i < b.size(); ++i) EXPECT_EQ(b[i], 0) << i;
}

TEST(GgufWriterTest, SetReplacesInPlaceAndRemove) {
  GgufWriter w;
  w.SetUint32("first", 1);
  w.SetString("second", "x");
  w.SetUint32("first", 2);
  EXPECT_EQ(w.n_metadata(), 2u);
  std::vector<uint8_t> buf = w.WriteToBuffer();
  auto g = GgufFile::Parse(buf.data(), buf.size());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->metadata()[0].first, "first");
  EXPECT_EQ((*g)->GetUint("first").value(), 2u);
  EXPECT_TRUE(w.Remove("first"));
  EXPECT_FALSE(w.Remove("first"));
  EXPECT_EQ(w.n_metadata(), 1u);
}

TEST(GgufWriterTest, AlignmentKey) {
  GgufWriter w;
  EXPECT_EQ(w.alignment(), 32u);
  ASSERT_TRUE(w.SetValue("general.alignment", Uint(ValueType::kUint32, 128)).ok());
  EXPECT_EQ(w.alignment(), 128u);
  EXPECT_EQ(w.SetValue("general.alignment", Uint(ValueType::kUint32, 48)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.SetValue("general.alignment", Uint(ValueType::kUint64, 64)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.alignment(), 128u);
  EXPECT_EQ(w.WriteToBuffer().size() % 128, 0u);
  EXPECT_TRUE(w.Remove("general.alignment"));
  EXPECT_EQ(w.alignment(), 32u);
}

TEST(GgufWriterTest, SetValueRejectsInconsistentValues) {
  GgufWriter w;
  auto code = [&](Value v) { return w.SetValue("k", std::move(v)).code(); };
  const StatusCode kBad = StatusCode::kInvalidArgument;
  EXPECT_EQ(code(Uint(ValueType::kUint8, 256)), kBad);
  EXPECT_EQ(code(Uint(ValueType::kUint16, 70000)), kBad);
  EXPECT_EQ(code(Uint(ValueType::kUint32, 1ull << 32)), kBad);
  EXPECT_EQ(code(Int(ValueType::kInt8, -129)), kBad);
  EXPECT_EQ(code(Int(ValueType::kInt32, 1ll << 31)), kBad);
  EXPECT_EQ(code(Int(ValueType::kUint32, 5)), kBad);  // wrong alternative
  EXPECT_EQ(code(Uint(ValueType::kString, 5)), kBad);
  EXPECT_EQ(code(Uint(ValueType::kBool, 1)), kBad);
  EXPECT_EQ(code(Uint(ValueType::kFloat32, 1)), kBad);
  EXPECT_EQ(code(Uint(ValueType::kArray, 1)), kBad);
  EXPECT_EQ(code(Uint(static_cast<ValueType>(13), 1)), kBad);
  EXPECT_EQ(code(Arr(ValueType::kInt32, {Uint(ValueType::kUint32, 1)})), kBad);
  EXPECT_EQ(code(Arr(static_cast<ValueType>(99), {})), kBad);
  const Status s = w.SetValue("k", Arr(ValueType::kInt32, {Int(ValueType::kInt32, 1ll << 40)}));
  EXPECT_CONTAINS(s.message(), "does not fit in int32");
  // Nesting: 8 levels are fine, 9 are refused (the reader's limit).
  auto nest = [](int levels) {
    Value v = Arr(ValueType::kInt32, {});
    for (int i = 1; i < levels; ++i) v = Arr(ValueType::kArray, {v});
    return v;
  };
  EXPECT_TRUE(w.SetValue("k", nest(8)).ok());
  EXPECT_EQ(code(nest(9)), kBad);
  EXPECT_EQ(w.n_metadata(), 1u);  // only the valid value was stored
}

TEST(GgufWriterTest, AddTensorValidates) {
  GgufWriter w;
  const std::vector<uint8_t> b16(16);
  EXPECT_TRUE(w.AddTensor("t", TensorType::kF32, {4}, b16).ok());
  EXPECT_CONTAINS(w.AddTensor("t", TensorType::kF32, {4}, b16).message(), "already added");
  EXPECT_EQ(w.AddTensor("", TensorType::kF32, {4}, b16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("a", TensorType::kF32, {}, b16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("a", TensorType::kF32, {1, 1, 1, 1, 4}, b16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(w.AddTensor("a", TensorType::kQ8_0, {16}, b16).message(),
                  "not a multiple of the q8_0 block size 32");
  EXPECT_CONTAINS(w.AddTensor("a", TensorType::kF32, {5}, b16).message(),
                  "16 bytes given but f32 with these dims needs 20");
  EXPECT_EQ(w.AddTensor("a", static_cast<TensorType>(4), {4}, b16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("a", TensorType::kF32, {1ull << 40, 1ull << 40}, b16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.n_tensors(), 1u);
}

TEST(GgufWriterTest, WriteToFileMatchesBuffer) {
  GgufWriter w(GgufWriterOptions{.alignment = 64});
  w.SetString("general.architecture", "llama");
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  ASSERT_TRUE(w.AddTensorRef("x", TensorType::kF32, {100, 3}, x.data(), x.size() * 4).ok());
  ASSERT_TRUE(w.AddTensor("y", TensorType::kI8, {3}, std::vector<uint8_t>{1, 2, 3}).ok());
  const std::string path = testing::TempDir() + "/writer.gguf";
  ASSERT_TRUE(w.WriteToFile(path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(disk, w.WriteToBuffer());
  for (const auto& entry : std::filesystem::directory_iterator(testing::TempDir())) {
    EXPECT_EQ(entry.path().filename().string().find(".writer.gguf.kvx-tmp"), std::string::npos) << "left behind";
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->FindTensor("x")->n_bytes, 1200u);
  EXPECT_EQ(std::memcmp((*f)->FindTensor("x")->data, x.data(), 1200), 0);
  EXPECT_EQ((*f)->FindTensor("y")->data[2], 3);

  const Status bad = w.WriteToFile("/nonexistent/dir/out.gguf");
  EXPECT_EQ(bad.code(), StatusCode::kIoError);
  EXPECT_CONTAINS(bad.message(), "/nonexistent/dir/out.gguf");
}

// Re-encoding a real model (written by llama.cpp's converters / gguf-py)
// with GgufWriter reproduces the file byte for byte: the writer's layout is
// the one llama.cpp writes and reads. Vocab-only files were written without
// the padding after the header; ours adds it (both are readable).
TEST(GgufWriterTest, ReencodesRealModelsByteForByte) {
  KVX_REQUIRE_SHARED();
  for (const char* rel : {"models/stories260K/stories260K-F32.gguf",
                          "models/tinystories656K/TinyStories-656K-F32.gguf",
                          "models/probe/probe-llama-6L-d256-f16.gguf",
                          "models/vocab/ggml-vocab-llama-spm.gguf"}) {
    SCOPED_TRACE(rel);
    auto f = GgufFile::Open(testing::SharedPath(rel));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    GgufWriter w(GgufWriterOptions{.alignment = static_cast<uint32_t>((*f)->alignment())});
    for (const auto& [key, value] : (*f)->metadata()) ASSERT_TRUE(w.SetValue(key, value).ok());
    for (const TensorInfo& t : (*f)->tensors()) {
      ASSERT_TRUE(w.AddTensorRef(t.name, t.type, t.dims, t.data, t.n_bytes).ok());
    }
    const std::vector<uint8_t> ours = w.WriteToBuffer();
    std::ifstream in(testing::SharedPath(rel), std::ios::binary);
    const std::vector<uint8_t> orig((std::istreambuf_iterator<char>(in)), {});
    ASSERT_GE(ours.size(), orig.size());
    EXPECT_TRUE(std::equal(orig.begin(), orig.end(), ours.begin()));
    if ((*f)->tensors().empty()) {
      EXPECT_LT(ours.size() - orig.size(), 32u);
      for (size_t i = orig.size(); i < ours.size(); ++i) EXPECT_EQ(ours[i], 0);
    } else {
      EXPECT_EQ(ours.size(), orig.size());
    }
  }
}

// ---- randomized corruption ----

// A small file with every feature a real model uses: strings, arrays,
// nested arrays, a non-default alignment key, several tensor types.
std::vector<uint8_t> RealisticFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "tiny-corruption-target");
  w.SetUint32("llama.block_count", 1);
  w.SetUint32("llama.embedding_length", 32);
  w.SetUint64("llama.context_length", 128);
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "cd", "", "e"});
  w.SetFloat32Array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -4, -5});
  w.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetInt8("test.i8", -1);
  w.SetFloat64("test.f64", 2.5);
  Value inner = Arr(ValueType::kUint16, {Uint(ValueType::kUint16, 1), Uint(ValueType::kUint16, 2)});
  EXPECT_TRUE(w.SetValue("test.nested", Arr(ValueType::kArray, {inner, inner})).ok());
  std::vector<uint8_t> emb(32 * 8 * 2), q(34 * 4), norm(32 * 4);
  for (size_t i = 0; i < emb.size(); ++i) emb[i] = static_cast<uint8_t>(i);
  EXPECT_TRUE(w.AddTensor("token_embd.weight", TensorType::kF16, {32, 8}, emb).ok());
  EXPECT_TRUE(w.AddTensor("blk.0.attn_q.weight", TensorType::kQ8_0, {32, 4}, q).ok());
  EXPECT_TRUE(w.AddTensor("output_norm.weight", TensorType::kF32, {32}, norm).ok());
  return w.WriteToBuffer();
}

// Parses an exact-size heap copy and, on success, touches every value and
// every tensor byte so out-of-range pointers would be caught.
StatusCode ParseAndTouch(const std::vector<uint8_t>& bytes) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() + 1]);  // +1: size 0 is legal
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  auto f = GgufFile::Parse(copy.get(), bytes.size(), "mutant");
  if (!f.ok()) {
    EXPECT_FALSE(f.status().message().empty());
    return f.status().code();
  }
  size_t chars = 0;
  for (const auto& [key, value] : (*f)->metadata()) {
    chars += GgufFile::ValueToString(value, 1000).size();
    (void)(*f)->GetUint(key);
    (void)(*f)->GetFloat(key);
    (void)(*f)->GetStringArray(key);
    (void)(*f)->GetIntArray(key);
  }
  EXPECT_GT(chars + 1, 0u);
  uint64_t sum = 0;
  for (const TensorInfo& t : (*f)->tensors()) {
    EXPECT_GE(t.data, copy.get());
    EXPECT_LE(t.data + t.n_bytes, copy.get() + bytes.size());
    EXPECT_EQ(t.n_bytes, RowBytes(t.type, t.dims[0]) * (t.dims[0] ? t.n_elements / t.dims[0] : 0));
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  }
  EXPECT_GE(sum, 0u);
  return StatusCode::kOk;
}

TEST(GgufCorruptionTest, EveryTruncationFails) {
  const std::vector<uint8_t> file = RealisticFile();
  ASSERT_EQ(ParseAndTouch(file), StatusCode::kOk);
  auto parsed = GgufFile::Parse(file.data(), file.size());
  ASSERT_TRUE(parsed.ok());
  // Cutting into the header or any tensor's data must be an error. (Cutting
  // only the trailing padding after the last tensor is harmless.)
  const TensorInfo& last = (*parsed)->tensors().back();
  const size_t needed = (*parsed)->data_offset() + last.offset + last.n_bytes;
  for (size_t n = 0; n < file.size(); ++n) {
    const std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(n));
    const StatusCode c = ParseAndTouch(cut);
    if (n < needed) {
      EXPECT_NE(c, StatusCode::kOk) << "prefix " << n;
    }
  }
}

TEST(GgufCorruptionTest, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> file = RealisticFile();
  auto parsed = GgufFile::Parse(file.data(), file.size());
  ASSERT_TRUE(parsed.ok());
  // Most mutations target the header (everything before the data section),
  // where a flipped byte changes how the rest is interpreted.
  const size_t header = (*parsed)->data_offset();
  const uint64_t kInteresting[] = {0, 1, 2, 3, 4, 8, 9, 12, 13, 31, 32, 33, 255, 256,
                                   0x7FFFFFFFull, 0x80000000ull, 0xFFFFFFFFull, 1ull << 32,
                                   1ull << 62, 1ull << 63, ~0ull, ~0ull - 7, file.size(),
                                   file.size() + 1, header};
  std::mt19937_64 rng(20240607);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::map<StatusCode, int> outcomes;
  std::set<std::string> messages;
  constexpr int kIterations = 6000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::vector<uint8_t> m = file;
    const int n_mutations = 1 + static_cast<int>(pick(3));
    for (int k = 0; k < n_mutations; ++k) {
      const size_t region = pick(8) == 0 ? m.size() : std::min(header, m.size());
      if (region == 0) break;
      const size_t at = pick(region);
      switch (pick(6)) {
        case 0:  // flip one bit
          m[at] ^= static_cast<uint8_t>(1u << pick(8));
          break;
        case 1: {  // an interesting u64 (lengths, counts, offsets, dims)
          const uint64_t v = kInteresting[pick(std::size(kInteresting))];
          std::memcpy(m.data() + at, &v, std::min<size_t>(8, m.size() - at));
          break;
        }
        case 2: {  // an interesting u32 (types, n_dims, versions)
          const uint32_t v = static_cast<uint32_t>(kInteresting[pick(std::size(kInteresting))]);
          std::memcpy(m.data() + at, &v, std::min<size_t>(4, m.size() - at));
          break;
        }
        case 3: {  // a run of 0xFF
          const size_t len = std::min<size_t>(1 + pick(64), m.size() - at);
          std::memset(m.data() + at, 0xFF, len);
          break;
        }
        case 4:  // random byte
          m[at] = static_cast<uint8_t>(rng());
          break;
        case 5:  // delete or insert bytes: everything after shifts
          if (pick(2) == 0) {
            m.erase(m.begin() + static_cast<std::ptrdiff_t>(at),
                    m.begin() + static_cast<std::ptrdiff_t>(std::min(m.size(), at + 1 + pick(8))));
          } else {
            m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), 1 + pick(8),
                     static_cast<uint8_t>(rng()));
          }
          break;
      }
    }
    if (pick(10) == 0 && !m.empty()) m.resize(pick(m.size()));  // and truncate
    const StatusCode c = ParseAndTouch(m);
    ++outcomes[c];
    if (c != StatusCode::kOk) {
      auto f = GgufFile::Parse(m.data(), m.size());
      messages.insert(f.status().message());
    }
  }
  // The mutations must exercise both outcomes and many distinct errors, or
  // the test is not testing much.
  EXPECT_GT(outcomes[StatusCode::kOk], 50);
  EXPECT_GT(outcomes[StatusCode::kDataLoss], kIterations / 4);
  EXPECT_GE(outcomes.size(), 3u);
  EXPECT_GT(messages.size(), 20u);

}

}  // namespace
}  // namespace kvx::gguf
