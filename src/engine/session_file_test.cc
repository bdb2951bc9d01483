// Session files: a restored sequence continues exactly as if never saved
// (bit-identical logits, across codecs, sealing, sinks, pre-RoPE keys,
// rotation and an eviction policy's dead slots), into the same engine or a
// fresh one; every damaged or foreign file is refused with a clear error and
// leaves the manager unchanged.
#include "engine/session_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/scheduler_test_util.h"
#include "engine/session.h"

namespace kvx::engine {
namespace {

using scheduler_test::LoadEngine;

// The session tests' models: f32 weights, so a restored session's logits can
// be compared bit for bit.
std::string WriteModel(const std::string& name, uint64_t seed = 1) {
  return scheduler_test::WriteTinyModel(name, gguf::TensorType::kF32, seed);
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + salt * 101 + 5) % 512);
  return t;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Feeds `tokens` one step at a time (decode) and returns every step's logits.
std::vector<std::vector<float>> Continue(Session& s, const std::vector<int32_t>& tokens, int chunk) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    std::vector<int32_t> part(tokens.begin() + i, tokens.begin() + std::min(tokens.size(), i + chunk));
    auto r = s.Feed(part);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return out;
    out.emplace_back(*r, *r + s.model().config().n_vocab);
  }
  return out;
}

const char* kSpecs[] = {
    "codec=f16",
    "codec=f32,page=8",
    "codec=int8,prerope=1",
    "codec=int4,rotate=hadamard,sinks=4",
    "codec=kivi2,page=16,residual=16",
    "codec=kivi4,page=16,sinks=16,rotate=values",
    "codec=f16,page=8;policy=streamingllm,sinks=4,window=20",
    "codec=kivi2,page=16;policy=streamingllm,sinks=4,window=40",
};

TEST(SessionFileTest, RestoredSessionContinuesBitIdentically) {
  const std::string path = WriteModel("session.gguf");
  // The same model under another file name has the same identity.
  const std::string copy = ::testing::TempDir() + "/session-copy.gguf";
  std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
  for (const char* spec : kSpecs) {
    for (bool compress : {true, false}) {
      SCOPED_TRACE(std::string(spec) + (compress ? " zstd" : " raw"));
      auto engine = LoadEngine(path, spec);
      auto other = LoadEngine(copy, spec, /*n_ctx=*/200, /*n_seqs=*/2);  // another pool size and context
      ASSERT_TRUE(engine && other);
      auto a = engine->NewSession(/*salt=*/77);
      ASSERT_TRUE(a.ok());
      std::vector<int32_t> prompt = Tokens(61, 1);
      ASSERT_TRUE((*a)->Feed(prompt).ok());
      for (int32_t t : Tokens(6, 2)) ASSERT_TRUE((*a)->Feed({t}).ok());
      const int held = (*a)->n_past();

      std::vector<float> logits(512, 0.5f);
      SessionFileOptions so;
      so.compress = compress;
      const std::vector<int32_t> pending = {5, 6};
      auto file = EncodeSession(*engine, (*a)->id(), {.logits = logits, .pending = pending}, so);
      ASSERT_TRUE(file.ok()) << file.status().ToString();

      auto same = DecodeSession(*engine, Bytes(*file));
      ASSERT_TRUE(same.ok()) << same.status().ToString();
      EXPECT_EQ(same->logits, logits);
      EXPECT_EQ(same->pending, pending);
      auto fresh = DecodeSession(*other, Bytes(*file));
      ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
      ASSERT_TRUE(engine->kv_manager().CheckInvariants().ok()) << engine->kv_manager().CheckInvariants().ToString();
      ASSERT_TRUE(other->kv_manager().CheckInvariants().ok()) << other->kv_manager().CheckInvariants().ToString();
      EXPECT_EQ(engine->kv_manager().tokens(same->seq), engine->kv_manager().tokens((*a)->id()));
      EXPECT_EQ(engine->kv_manager().block_hashes(same->seq), engine->kv_manager().block_hashes((*a)->id()));
      EXPECT_EQ(engine->kv_manager().salt(same->seq), 77u);
      auto b = engine->AdoptSequence(same->seq);
      auto c = other->AdoptSequence(fresh->seq);
      EXPECT_EQ(b->n_past(), held);
      EXPECT_EQ(b->kv().BytesInUse(), (*a)->kv().BytesInUse());

      // Continue all three with the same tokens: decode steps, then a chunk.
      const std::vector<int32_t> more = Tokens(40, 3);
      auto la = Continue(**a, more, 1), lb = Continue(*b, more, 1), lc = Continue(*c, more, 1);
      ASSERT_EQ(la.size(), more.size());
      ASSERT_EQ(lb.size(), la.size());
      ASSERT_EQ(lc.size(), la.size());
      for (size_t i = 0; i < la.size(); ++i) {
        ASSERT_EQ(0, std::memcmp(la[i].data(), lb[i].data(), la[i].size() * sizeof(float))) << "step " << i;
        ASSERT_EQ(0, std::memcmp(la[i].data(), lc[i].data(), la[i].size() * sizeof(float))) << "step " << i;
      }
      auto ca = Continue(**a, Tokens(9, 4), 9), cc = Continue(*c, Tokens(9, 4), 9);
      ASSERT_EQ(ca.size(), 1u);
      ASSERT_EQ(cc.size(), 1u);
      EXPECT_EQ(0, std::memcmp(ca[0].data(), cc[0].data(), ca[0].size() * sizeof(float)));
      EXPECT_TRUE(other->kv_manager().CheckInvariants().ok());
    }
  }
}

// The restored session is not merely close: a session given a neighbour's
// file would differ (the comparison above can fail).
TEST(SessionFileTest, AnotherSequencesFileGivesOtherLogits) {
  const std::string path = WriteModel("session-neg.gguf");
  auto engine = LoadEngine(path, "codec=f16");
  ASSERT_TRUE(engine);
  auto a = engine->NewSession();
  auto n = engine->NewSession();
  ASSERT_TRUE(a.ok() && n.ok());
  ASSERT_TRUE((*a)->Feed(Tokens(30, 1)).ok());
  std::vector<int32_t> other = Tokens(30, 1);
  other[3] = (other[3] + 1) % 512;  // one token differs
  ASSERT_TRUE((*n)->Feed(other).ok());
  auto file = EncodeSession(*engine, (*n)->id(), {});
  ASSERT_TRUE(file.ok());
  auto r = DecodeSession(*engine, Bytes(*file));
  ASSERT_TRUE(r.ok());
  auto b = engine->AdoptSequence(r->seq);
  auto la = Continue(**a, {7}, 1), lb = Continue(*b, {7}, 1);
  ASSERT_EQ(la.size(), 1u);
  ASSERT_EQ(lb.size(), 1u);
  EXPECT_NE(0, std::memcmp(la[0].data(), lb[0].data(), la[0].size() * sizeof(float)));
}

// What a session file cannot store (pages merged across layers, pruned or
// demoted pages) is refused by one check whose message names the kind, why,
// and what to do; the sequence is left as it was.
TEST(SessionFileTest, UnstorablePageFormatsAreRefusedByName) {
  const std::string path = WriteModel("session-unstorable.gguf");
  struct Case {
    const char* spec;
    const char* words;  // the kind the message must name
    const char* fix;    // and the way out it must give
  };
  for (const Case& c : {Case{"codec=f16,page=8;policy=minicache,start=0",
                             "pages merged across layers (policy=minicache", "save (export) before compressing"},
                        Case{"codec=f16,page=8;policy=think,keep=8,recent=16,window=4",
                             "key-channel-pruned pages (policy think", "save (export) before compressing"},
                        Case{"codec=int8,page=8;policy=think,keep=8,recent=16,window=4",  // quantized pruned pages
                             "key-channel-pruned pages (policy think", "save (export) before compressing"},
                        Case{"codec=f16,page=8;policy=mikv,ratio=0.75,window=8,sinks=0,mode=once",
                             "demoted pages (policy mikv / fate=demote", "or use fate=drop"}}) {
    SCOPED_TRACE(c.spec);
    auto engine = LoadEngine(path, c.spec);
    ASSERT_TRUE(engine);
    auto s = engine->NewSession();
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Feed(Tokens(96, 3)).ok());
    auto before = EncodeSession(*engine, (*s)->id(), {});
    ASSERT_TRUE(before.ok()) << before.status().ToString();  // storable until compressed
    ASSERT_TRUE((*s)->Compress().ok());
    const int64_t pages = engine->pool().pages_in_use();
    auto r = EncodeSession(*engine, (*s)->id(), {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().ToString();
    EXPECT_NE(r.status().message().find("session files cannot store"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.fix), std::string::npos) << r.status().ToString();
    EXPECT_EQ(engine->pool().pages_in_use(), pages);
    EXPECT_TRUE(engine->kv_manager().CheckInvariants().ok());
  }
}

// Recomputes an uncompressed file's checksums after its body was edited, so
// the structural checks behind them are what is tested.
std::string Reseal(std::string file) {
  const uint64_t body = file.size() - kSessionHeaderBytes;
  std::memcpy(&file[24], &body, 8);
  std::memcpy(&file[16], &body, 8);
  const uint64_t h = XXH3_64bits(file.data() + kSessionHeaderBytes, body);
  std::memcpy(&file[32], &h, 8);
  const uint64_t hh = XXH3_64bits(file.data(), kSessionHeaderBytes - 8);
  std::memcpy(&file[40], &hh, 8);
  return file;
}

class SessionFileCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = WriteModel("session-bad.gguf");
    engine_ = LoadEngine(path_, "codec=kivi2,page=16,residual=16,sinks=16");
    ASSERT_TRUE(engine_);
    auto s = engine_->NewSession();
    ASSERT_TRUE(s.ok());
    session_ = std::move(s).value();
    ASSERT_TRUE(session_->Feed(Tokens(70, 5)).ok());
    SessionFileOptions raw;
    raw.compress = false;
    auto f = EncodeSession(*engine_, session_->id(), {}, raw);
    auto z = EncodeSession(*engine_, session_->id(), {});
    ASSERT_TRUE(f.ok() && z.ok());
    raw_ = *f;
    zstd_ = *z;
    pages_ = engine_->pool().pages_in_use();
  }
  // Decodes and expects a refusal with `code` whose message contains `words`,
  // the manager unchanged.
  void ExpectRefused(const std::string& bytes, StatusCode code, const std::string& words) {
    auto r = DecodeSession(*engine_, Bytes(bytes));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
    EXPECT_EQ(engine_->pool().pages_in_use(), pages_);
    EXPECT_EQ(engine_->kv_manager().num_sequences(), 1);
    EXPECT_TRUE(engine_->kv_manager().CheckInvariants().ok());
  }
  std::string path_, raw_, zstd_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Session> session_;
  int64_t pages_ = 0;
};

TEST_F(SessionFileCorruptionTest, TruncatedFilesAreRefused) {
  for (const std::string* f : {&raw_, &zstd_}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{47}, size_t{48}, size_t{49}, f->size() / 2, f->size() - 1}) {
      SCOPED_TRACE(n);
      auto r = DecodeSession(*engine_, Bytes(f->substr(0, n)));
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
      EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().ToString();
    }
    ExpectRefused(*f + "x", StatusCode::kDataLoss, "longer than its header says");
  }
}

TEST_F(SessionFileCorruptionTest, EveryFlippedByteIsRefused) {
  // Every header byte, then bytes spread over the body (each costs a decode).
  for (const std::string* f : {&raw_, &zstd_}) {
    std::vector<size_t> at;
    for (size_t i = 0; i < kSessionHeaderBytes; ++i) at.push_back(i);
    for (size_t i = kSessionHeaderBytes; i < f->size(); i += f->size() / 97 + 1) at.push_back(i);
    at.push_back(f->size() - 1);
    for (size_t i : at) {
      SCOPED_TRACE(i);
      std::string bad = *f;
      bad[i] = static_cast<char>(bad[i] ^ 0x10);
      auto r = DecodeSession(*engine_, Bytes(bad));
      ASSERT_FALSE(r.ok()) << "flipping byte " << i << " was accepted";
      EXPECT_EQ(engine_->pool().pages_in_use(), pages_);
    }
  }
  std::string bad = zstd_;
  bad[bad.size() / 2] ^= 1;
  ExpectRefused(bad, StatusCode::kDataLoss, "checksum mismatch");
  bad = zstd_;
  bad[20] ^= 1;  // a size field of the header
  ExpectRefused(bad, StatusCode::kDataLoss, "header is corrupted");
  bad = zstd_;
  bad[0] = 'X';
  ExpectRefused(bad, StatusCode::kInvalidArgument, "not a kvx session file");
}

TEST_F(SessionFileCorruptionTest, OtherVersionIsRefused) {
  std::string v2 = raw_;
  const uint32_t version = kSessionFileVersion + 1;
  std::memcpy(&v2[8], &version, 4);
  ExpectRefused(Reseal(v2), StatusCode::kUnimplemented, "version 2");
}

TEST_F(SessionFileCorruptionTest, OtherModelIsRefused) {
  const std::string other_path = WriteModel("session-other.gguf", /*seed=*/2);  // same shape, other weights
  auto other = LoadEngine(other_path, "codec=kivi2,page=16,residual=16,sinks=16");
  ASSERT_TRUE(other);
  auto r = DecodeSession(*other, Bytes(zstd_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("another model"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(other->kv_manager().num_sequences(), 0);
}

TEST_F(SessionFileCorruptionTest, OtherKVSpecIsRefused) {
  for (const char* spec : {"codec=kivi2,page=16,residual=32,sinks=16", "codec=f16", "codec=kivi2,page=32,sinks=16",
                           "codec=kivi2,page=16,residual=16,sinks=16;policy=streamingllm"}) {
    SCOPED_TRACE(spec);
    auto other = LoadEngine(path_, spec);
    ASSERT_TRUE(other);
    auto r = DecodeSession(*other, Bytes(zstd_));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("saved with --kv 'codec=kivi2,page=16,residual=16,sinks=16'"),
              std::string::npos)
        << r.status().ToString();
  }
  // Only the budget differs: accepted.
  auto bigger = LoadEngine(path_, "codec=kivi2,page=16,residual=16,sinks=16;budget=64M");
  ASSERT_TRUE(bigger);
  EXPECT_TRUE(DecodeSession(*bigger, Bytes(zstd_)).ok());
}

TEST_F(SessionFileCorruptionTest, PoolTooSmallLeavesItUnchanged) {
  // A pool sized for 20 tokens cannot take 70.
  auto small = LoadEngine(path_, "codec=kivi2,page=16,residual=16,sinks=16", /*n_ctx=*/80, /*n_seqs=*/1);
  ASSERT_TRUE(small);
  auto s = small->NewSession();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Feed(Tokens(60, 9)).ok());
  const int64_t before = small->pool().pages_in_use();
  auto r = DecodeSession(*small, Bytes(zstd_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_EQ(small->pool().pages_in_use(), before);
  EXPECT_TRUE(small->kv_manager().CheckInvariants().ok());
  // And a context too short for the saved tokens.
  auto short_ctx = LoadEngine(path_, "codec=kivi2,page=16,residual=16,sinks=16", /*n_ctx=*/64, /*n_seqs=*/1);
  ASSERT_TRUE(short_ctx);
  auto r2 = DecodeSession(*short_ctx, Bytes(zstd_));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("context length"), std::string::npos) << r2.status().ToString();
}

// Bodies damaged behind valid checksums (a bug or a crafted file): the
// structural checks refuse what would break an invariant; whatever they let
// through (page payload bytes are data) restores into a consistent manager.
TEST_F(SessionFileCorruptionTest, DamagedBodiesBehindValidChecksumsNeverBreakTheManager) {
  std::mt19937 rng(7);
  int refused = 0, accepted = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bad = raw_;
    const int edits = 1 + trial % 3;
    for (int e = 0; e < edits; ++e) {
      const size_t i = kSessionHeaderBytes + rng() % (bad.size() - kSessionHeaderBytes);
      bad[i] = static_cast<char>(trial % 2 ? rng() : bad[i] ^ (1 << (rng() % 8)));
    }
    if (trial % 50 == 0) bad.resize(bad.size() - 1 - rng() % 100);  // short body, sizes resealed
    auto r = DecodeSession(*engine_, Bytes(Reseal(bad)));
    ASSERT_TRUE(engine_->kv_manager().CheckInvariants().ok()) << engine_->kv_manager().CheckInvariants().ToString();
    if (!r.ok()) {
      ++refused;
      EXPECT_TRUE(r.status().code() == StatusCode::kDataLoss || r.status().code() == StatusCode::kInvalidArgument)
          << r.status().ToString();
      continue;
    }
    ++accepted;
    // What was accepted runs.
    auto s = engine_->AdoptSequence(r->seq);
    (void)s->Feed({1});
    ASSERT_TRUE(engine_->kv_manager().CheckInvariants().ok());
  }
  EXPECT_GT(refused, 20);
  EXPECT_GT(accepted, 10);  // most payload bytes are data
}

TEST_F(SessionFileCorruptionTest, StructuralDamageIsNamed) {
  // The body of an uncompressed file starts with the fingerprint (8 bytes);
  // find the first page table's length field by encoding an empty session.
  auto empty = engine_->NewSession();
  ASSERT_TRUE(empty.ok());
  SessionFileOptions raw;
  raw.compress = false;
  auto e = EncodeSession(*engine_, (*empty)->id(), {}, raw);
  ASSERT_TRUE(e.ok());
  // An empty session's file ends with its tables: 4 tables x (u32 0, u32 0),
  // after 4 zero bytes (no logits) and 4 (no hashes) and n=0 tokens.
  std::string bad = *e;
  const size_t tables_at = bad.size() - 4 * 8;
  uint32_t one = 1;
  std::memcpy(&bad[tables_at], &one, 4);  // first table claims a slot but lists no page
  auto r = DecodeSession(*engine_, Bytes(Reseal(bad)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("table (layer 0, kv head 0)"), std::string::npos) << r.status().ToString();
}

TEST_F(SessionFileCorruptionTest, SaveAndLoadFiles) {
  const std::string file = ::testing::TempDir() + "/s.kvxs";
  ASSERT_TRUE(SaveSessionFile(*engine_, session_->id(), file).ok());
  auto r = LoadSessionFile(*engine_, file);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto missing = LoadSessionFile(*engine_, file + ".nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto dir = LoadSessionFile(*engine_, ::testing::TempDir());
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
  auto nowhere = SaveSessionFile(*engine_, session_->id(), "/nonexistent-dir/x.kvxs");
  EXPECT_EQ(nowhere.code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace kvx::engine
