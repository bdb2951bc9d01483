// Chunk reuse on a real model (the probe, f32 weights): chunks computed
// alone, imported at new positions and repaired. With every token
// recomputed the logits are a full prefill's up to float rounding (the one
// assembly step and the prefill's steps sum attention in other orders:
// measured: at most 4e-6 on logits of magnitude ~10); naive concatenation is
// not; blend picks the tokens whose cached K/V are wrong.
#include "engine/chunk_assembly.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "support/test_data.h"

namespace kvx::engine {
namespace {

constexpr double kRoundingTolerance = 1e-4;

struct Fixture {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ChunkAssembler> assembler;
};

Fixture Make(const std::string& spec_text, int n_ctx = 512) {
  Fixture f;
  EngineOptions o;
  o.model_path = testing::SharedPath("models/probe/probe-llama-6L-d256-f32.gguf");
  o.n_threads = 2;
  o.n_ctx = n_ctx;
  auto spec = kv::ParseKVSpec(spec_text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  o.kv_spec = *spec;
  auto engine = Engine::Load(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  f.engine = std::move(engine).value();
  auto assembler = ChunkAssembler::Create(f.engine.get(), 64 << 20);
  EXPECT_TRUE(assembler.ok()) << assembler.status().ToString();
  if (assembler.ok()) f.assembler = std::move(assembler).value();
  return f;
}

std::vector<int32_t> Tokens(const Engine& e, const std::string& text, bool bos = false) {
  auto t = e.model().tokenizer().Encode(text, bos, false);
  EXPECT_TRUE(t.ok());
  return *t;
}

// The chunks of every test: 7 tokens (less than a page of 16), not a whole
// number of pages, several pages.
std::vector<std::vector<int32_t>> Chunks(const Engine& e) {
  return {Tokens(e, "The cat sat on the mat."),
          Tokens(e, "It is a truth universally acknowledged, that a single man in possession of a good fortune."),
          Tokens(e, "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
                    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.")};
}

std::vector<float> FullPrefill(Engine& e, const std::vector<int32_t>& prefix, const std::vector<std::vector<int32_t>>& chunks,
                               const std::vector<int32_t>& suffix, const std::vector<std::vector<int32_t>>& gaps = {}) {
  ChunkPrompt prompt{prefix, chunks, gaps, suffix, {}};
  const std::vector<int32_t> all = prompt.Tokens();
  auto s = e.NewSession();
  EXPECT_TRUE(s.ok());
  auto logits = (*s)->Feed(all);
  EXPECT_TRUE(logits.ok()) << logits.status().ToString();
  return std::vector<float>(*logits, *logits + e.model().config().n_vocab);
}

std::vector<float> Assembled(Fixture& f, const std::vector<int32_t>& prefix, const std::vector<std::vector<int32_t>>& chunks,
                             const std::vector<int32_t>& suffix, const std::string& repair, ChunkUsage* usage = nullptr,
                             const std::vector<std::vector<int32_t>>& gaps = {}) {
  auto r = ParseChunkRepair(repair);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  auto s = f.engine->NewSession();
  EXPECT_TRUE(s.ok());
  auto logits = f.assembler->Assemble(s->get(), prefix, chunks, suffix, *r, usage, gaps);
  EXPECT_TRUE(logits.ok()) << logits.status().ToString();
  if (!logits.ok()) return {};
  EXPECT_TRUE(f.engine->kv_manager().CheckInvariants().ok());
  return std::vector<float>(*logits, *logits + f.engine->model().config().n_vocab);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class ChunkAssemblyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (testing::SharedDir().empty()) GTEST_SKIP() << "shared test data not found (set KVX_SHARED or place ../shared beside the repository)";
    f_ = Make(GetParam());
    ASSERT_NE(f_.assembler, nullptr);
    prefix_ = Tokens(*f_.engine, "Read the texts below.", /*bos=*/true);
    chunks_ = Chunks(*f_.engine);
    suffix_ = Tokens(*f_.engine, " Question: who sat on the mat? Answer:");
  }
  Fixture f_;
  std::vector<int32_t> prefix_, suffix_;
  std::vector<std::vector<int32_t>> chunks_;
};

TEST_P(ChunkAssemblyTest, EveryTokenRecomputedGivesTheFullPrefill) {
  const std::vector<float> full = FullPrefill(*f_.engine, prefix_, chunks_, suffix_);
  for (const std::string repair : {"blend,r=1,layer=0", "blend,r=1,layer=3", "epic,k=1000", "full"}) {
    ChunkUsage usage;
    const std::vector<float> got = Assembled(f_, prefix_, chunks_, suffix_, repair, &usage);
    const double diff = MaxAbsDiff(got, full);
    EXPECT_LT(diff, kRoundingTolerance) << repair;
    RecordProperty("max_abs_logit_diff_" + repair, std::to_string(diff));
    EXPECT_EQ(usage.recomputed_tokens, usage.chunk_tokens) << repair;
  }
}

// A chunk is tokenized as it reads inside the running prompt: chunks whose
// texts concatenate to a plain prompt's text give its tokens (no
// SentencePiece space prefix at a chunk's start, the first's included: its
// own leading space stands for it), so `full` repair gives the plain
// prefill's logits, and a chunk's tokens do not depend on its place. The
// split needle's seam, "The pass key is" | " 4321", is one of them. Where a
// merge crosses the seam (inside a word: "Th" | "e cat") the tokens cannot
// be the plain prompt's. Seen failing with the space prefix on every chunk.
TEST_P(ChunkAssemblyTest, ChunksTokenizeAsTheRunningText) {
  const model::Tokenizer& tok = f_.engine->model().tokenizer();
  const std::vector<std::string> texts = {" Read the texts below.\n", "The cat sat on the mat.",
                                          " It is a truth universally acknowledged.", " The pass key is",
                                          " 4321. Remember it.", ""};
  const std::string question = "\nWhat is the pass key? The pass key is";
  std::string plain;
  for (const std::string& t : texts) plain += t;
  plain = plain.substr(1) + question;  // the first chunk's space is the plain prompt's added one
  auto chunked = MakeChunkPrompt(tok, texts, question, /*parse_special=*/false, *ParseChunkRepair("full"));
  ASSERT_TRUE(chunked.ok()) << chunked.status().ToString();
  const std::vector<int32_t> plain_tokens = Tokens(*f_.engine, plain, /*bos=*/true);
  ASSERT_EQ(chunked->Tokens(), plain_tokens);

  auto s = f_.engine->NewSession();
  ASSERT_TRUE(s.ok());
  auto logits = (*s)->Feed(plain_tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  const std::vector<float> plain_logits(*logits, *logits + f_.engine->model().config().n_vocab);
  const std::vector<float> got = Assembled(f_, chunked->prefix, chunked->chunks, chunked->suffix, "full");
  EXPECT_LT(MaxAbsDiff(got, plain_logits), kRoundingTolerance);

  // A chunk's tokens (its key) do not depend on where it is placed.
  const std::vector<std::string> reordered = {texts[2], texts[0]};
  auto moved = MakeChunkPrompt(tok, reordered, question, false, {});
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->chunks[1], chunked->chunks[0]);
  EXPECT_EQ(moved->chunks[0], chunked->chunks[2]);

  const std::vector<std::string> in_word = {" Th", "e cat sat on the mat."};
  auto cut = MakeChunkPrompt(tok, in_word, "", false, {});
  ASSERT_TRUE(cut.ok());
  EXPECT_NE(cut->Tokens(), Tokens(*f_.engine, "The cat sat on the mat.", /*bos=*/true));
}

// Prompt text between chunks (a chat template's text between content parts,
// ChunkPrompt::gaps) is computed in context through every layer, never
// taken from the cache nor counted as chunk tokens: with every chunk token
// recomputed the logits are a full prefill's. Seen failing with the gap
// rows left to the cached K/V (then zeros).
TEST_P(ChunkAssemblyTest, GapsBetweenChunksAreComputedInContext) {
  const std::vector<std::vector<int32_t>> gaps = {Tokens(*f_.engine, "\nAnd the next text:\n"), {}};
  const std::vector<float> full = FullPrefill(*f_.engine, prefix_, chunks_, suffix_, gaps);
  for (const std::string repair : {"blend,r=1,layer=0", "epic,k=1000", "full"}) {
    ChunkUsage usage;
    const std::vector<float> got = Assembled(f_, prefix_, chunks_, suffix_, repair, &usage, gaps);
    EXPECT_LT(MaxAbsDiff(got, full), kRoundingTolerance) << repair;
    EXPECT_EQ(usage.gap_tokens, static_cast<int64_t>(gaps[0].size()));
    EXPECT_EQ(usage.recomputed_tokens, usage.chunk_tokens) << repair;
  }
  ChunkUsage usage;
  Assembled(f_, prefix_, chunks_, suffix_, "none", &usage, gaps);
  EXPECT_EQ(usage.recomputed_tokens, 0);
  EXPECT_EQ(usage.chunk_tokens, static_cast<int64_t>(chunks_[0].size() + chunks_[1].size() + chunks_[2].size()));
}

TEST_P(ChunkAssemblyTest, NaiveConcatenationDiffers) {
  const std::vector<float> full = FullPrefill(*f_.engine, prefix_, chunks_, suffix_);
  ChunkUsage usage;
  const std::vector<float> none = Assembled(f_, prefix_, chunks_, suffix_, "none", &usage);
  EXPECT_GT(MaxAbsDiff(none, full), 0.05);
  EXPECT_EQ(usage.recomputed_tokens, 0);
  EXPECT_EQ(usage.computed_tokens, usage.chunk_tokens);  // first sight: every chunk computed alone
  // The second time every chunk comes from the cache.
  Assembled(f_, prefix_, chunks_, suffix_, "none", &usage);
  EXPECT_EQ(usage.cached_tokens, usage.chunk_tokens);
  EXPECT_EQ(usage.computed_tokens, 0);
}

TEST_P(ChunkAssemblyTest, EdgeCasesMatchTheirFullPrefill) {
  const auto& A = chunks_[0];
  const auto& B = chunks_[1];
  const auto& C = chunks_[2];
  struct Case {
    const char* name;
    std::vector<int32_t> prefix;
    std::vector<std::vector<int32_t>> chunks;
    std::vector<int32_t> suffix;
  };
  const std::vector<Case> cases = {
      {"only cached chunks", {}, {A, B, C}, {}},
      {"reordered", prefix_, {C, A, B}, suffix_},
      {"repeated", prefix_, {A, B, A}, suffix_},
      {"empty chunk", prefix_, {A, {}, B}, suffix_},
      {"one chunk, no prefix", {}, {C}, suffix_},
  };
  Assembled(f_, prefix_, chunks_, suffix_, "none");  // every chunk cached
  for (const Case& c : cases) {
    std::vector<std::vector<int32_t>> present;
    for (const auto& chunk : c.chunks) {
      if (!chunk.empty()) present.push_back(chunk);
    }
    const std::vector<float> full = FullPrefill(*f_.engine, c.prefix, present, c.suffix);
    ChunkUsage usage;
    EXPECT_LT(MaxAbsDiff(Assembled(f_, c.prefix, c.chunks, c.suffix, "blend,r=1", &usage), full), kRoundingTolerance)
        << c.name;
    EXPECT_EQ(usage.cached_tokens, usage.chunk_tokens) << c.name;
    // Without repair it runs too (the last token is always computed).
    ChunkUsage none;
    EXPECT_FALSE(Assembled(f_, c.prefix, c.chunks, c.suffix, "none", &none).empty()) << c.name;
    EXPECT_EQ(none.recomputed_tokens, c.suffix.empty() ? 1 : 0) << c.name;
  }
}

// Layer 0's K/V depend on the token and its position only, so a cached
// chunk placed at a new position must store there what a full prefill
// stores: this checks the keys' re-rotation R(p + j) = R(p) R(j).
TEST_P(ChunkAssemblyTest, CachedKeysAtNewPositionsEqualAFullPrefillsAtLayerZero) {
  auto full = f_.engine->NewSession();
  ASSERT_TRUE(full.ok());
  std::vector<int32_t> all = prefix_;
  for (const auto& c : chunks_) all.insert(all.end(), c.begin(), c.end());
  ASSERT_TRUE((*full)->Feed(all).ok());
  auto s = f_.engine->NewSession();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(f_.assembler->Assemble(s->get(), prefix_, chunks_, {}, *ParseChunkRepair("none")).ok());
  const kv::KVLayout& layout = f_.engine->kv_manager().spec().layout;
  std::vector<float> k1(layout.head_dim), v1(layout.head_dim), k2(layout.head_dim), v2(layout.head_dim);
  double worst = 0;
  for (int h = 0; h < layout.n_kv_heads; ++h) {
    for (int slot = static_cast<int>(prefix_.size()); slot + 1 < static_cast<int>(all.size()); ++slot) {
      int32_t p1 = 0, p2 = 0;
      (*full)->kv().ReadEntry(0, h, slot, k1.data(), v1.data(), &p1);
      (*s)->kv().ReadEntry(0, h, slot, k2.data(), v2.data(), &p2);
      ASSERT_EQ(p1, p2);
      for (int i = 0; i < layout.head_dim; ++i) {
        worst = std::max({worst, std::fabs(double(k1[i]) - k2[i]), std::fabs(double(v1[i]) - v2[i])});
      }
    }
  }
  EXPECT_LT(worst, 1e-2);  // f16 pages: one more rounding of the rotated key
  RecordProperty("max_abs_layer0_kv_diff", std::to_string(worst));
}

// The prefix can come from a prefix hit: a session forked from one that
// holds it, assembled with an empty prefix.
TEST_P(ChunkAssemblyTest, PrefixFromAForkedSession) {
  const std::vector<float> full = FullPrefill(*f_.engine, prefix_, chunks_, suffix_);
  auto holder = f_.engine->NewSession();
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE((*holder)->Feed(prefix_).ok());
  auto fork = f_.engine->ForkSession(**holder, static_cast<int>(prefix_.size()));
  ASSERT_TRUE(fork.ok());
  ChunkUsage usage;
  auto logits = f_.assembler->Assemble(fork->get(), {}, chunks_, suffix_, *ParseChunkRepair("blend,r=1"), &usage);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  EXPECT_LT(MaxAbsDiff(std::vector<float>(*logits, *logits + f_.engine->model().config().n_vocab), full),
            kRoundingTolerance);
  EXPECT_EQ(usage.prefix_tokens, 0);
}

TEST_P(ChunkAssemblyTest, EpicRecomputesTheFirstTokensOfEachChunk) {
  ChunkUsage usage;
  Assembled(f_, prefix_, chunks_, suffix_, "epic,k=4", &usage);
  std::vector<int32_t> want;
  int32_t at = static_cast<int32_t>(prefix_.size());
  for (const auto& c : chunks_) {
    for (int j = 0; j < 4; ++j) want.push_back(at + j);
    at += static_cast<int32_t>(c.size());
  }
  EXPECT_EQ(usage.recomputed_positions, want);
}

INSTANTIATE_TEST_SUITE_P(Keys, ChunkAssemblyTest, ::testing::Values("codec=f32", "codec=f32,prerope=1", "codec=f16"),
                         [](const auto& info) { return info.index == 0 ? std::string("roped_f32") : info.index == 1 ? std::string("prerope_f32") : std::string("roped_f16"); });

// Plants wrong K/V for three tokens of a cached chunk (the image of the chunk
// with those tokens replaced, filed under the real chunk's key): at check
// layer 0 a correct cached token deviates from its recomputation only by
// rounding, so blend with r = 3/n must pick exactly the planted three.
TEST(ChunkAssemblyPlantedTest, BlendSelectsThePlantedTokens) {
  KVX_REQUIRE_SHARED();
  Fixture f = Make("codec=f32");
  ASSERT_NE(f.assembler, nullptr);
  const std::vector<int32_t> prefix = Tokens(*f.engine, "Read the texts below.", true);
  const std::vector<int32_t> chunk = Chunks(*f.engine)[2];
  const std::vector<int> planted = {5, 17, 30};
  std::vector<int32_t> wrong = chunk;
  for (int p : planted) wrong[p] = wrong[p] == 100 ? 101 : 100;
  auto alone = f.engine->NewSession();
  ASSERT_TRUE(alone.ok());
  ASSERT_TRUE((*alone)->Feed(wrong).ok());
  auto image = f.engine->kv_manager().ExportSequence((*alone)->id());
  ASSERT_TRUE(image.ok());
  // Filed under the real tokens (with their block hashes, as an import checks).
  image->tokens = chunk;
  image->block_hashes.clear();
  const int T = f.engine->kv_manager().spec().layout.page_tokens;
  uint64_t seed = image->salt;
  for (size_t b = 0; (b + 1) * T <= chunk.size(); ++b) {
    seed = kv::BlockHash(seed, std::span<const int32_t>(&chunk[b * T], T));
    image->block_hashes.push_back(seed);
  }
  ASSERT_NE(f.assembler->cache().Insert(f.assembler->Key(0, chunk), *image), nullptr);
  const std::vector<int32_t> suffix = Tokens(*f.engine, " Answer:");
  const int32_t at = static_cast<int32_t>(prefix.size());
  // Keys only, values only, both; and with the first two tokens of the
  // chunk recomputed besides (k=2: EPIC + blend), the planted three on top.
  for (const char* extra : {"", ",dev=k", ",dev=v", ",k=2"}) {
    SCOPED_TRACE(extra);
    auto blend = ParseChunkRepair("blend,layer=0,r=" + std::to_string(3.0 / static_cast<double>(chunk.size())) + extra);
    ASSERT_TRUE(blend.ok()) << blend.status().ToString();
    auto s = f.engine->NewSession();
    ASSERT_TRUE(s.ok());
    ChunkUsage usage;
    ASSERT_TRUE(f.assembler->Assemble(s->get(), prefix, {&chunk, 1}, suffix, *blend, &usage).ok());
    EXPECT_EQ(usage.cached_tokens, static_cast<int64_t>(chunk.size()));
    std::vector<int32_t> want;
    if (std::string(extra) == ",k=2") want = {at, at + 1};
    for (int p : planted) want.push_back(at + p);
    EXPECT_EQ(usage.recomputed_positions, want);
  }
}

TEST(ChunkAssemblyErrorsTest, ClearErrors) {
  KVX_REQUIRE_SHARED();
  Fixture f = Make("codec=f32", /*n_ctx=*/64);
  ASSERT_NE(f.assembler, nullptr);
  auto s = f.engine->NewSession();
  ASSERT_TRUE(s.ok());
  const std::vector<std::vector<int32_t>> too_long = {std::vector<int32_t>(65, 100)};
  auto r = f.assembler->Assemble(s->get(), {}, too_long, std::vector<int32_t>{100}, ChunkRepair{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chunk 0 holds 65 tokens, more than the context (64)"), std::string::npos)
      << r.status().ToString();
  const std::vector<std::vector<int32_t>> two = {std::vector<int32_t>(40, 100), std::vector<int32_t>(40, 101)};
  r = f.assembler->Assemble(s->get(), {}, two, std::vector<int32_t>{100}, ChunkRepair{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than the context"), std::string::npos) << r.status().ToString();
  EXPECT_EQ((*s)->n_past(), 0);
  r = f.assembler->Assemble(s->get(), {}, {}, {}, ChunkRepair{});
  EXPECT_FALSE(r.ok());
  ChunkRepair deep;
  deep.mode = ChunkRepairMode::kBlend;
  deep.blend_layer = 6;
  r = f.assembler->Assemble(s->get(), {}, two, {}, deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("beyond the model's last layer 5"), std::string::npos);

  // Formats where re-encoding at new positions would quantize twice.
  for (const char* spec : {"codec=int8", "codec=kivi4,page=32", "codec=kivi4,page=32,prerope=1"}) {
    EngineOptions o;
    o.model_path = testing::SharedPath("models/probe/probe-llama-6L-d256-f32.gguf");
    o.n_ctx = 64;
    o.kv_spec = *kv::ParseKVSpec(spec);
    auto e = Engine::Load(o);
    ASSERT_TRUE(e.ok());
    auto a = ChunkAssembler::Create(e->get(), 1 << 20);
    ASSERT_FALSE(a.ok()) << spec;
    EXPECT_NE(a.status().message().find("chunk reuse"), std::string::npos) << a.status().ToString();
  }
  EngineOptions o;
  o.model_path = testing::SharedPath("models/probe/probe-llama-6L-d256-f32.gguf");
  o.n_ctx = 64;
  o.kv_spec = *kv::ParseKVSpec("codec=int8,prerope=1");
  auto e = Engine::Load(o);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(ChunkAssembler::Create(e->get(), 1 << 20).ok());
}

// Eviction composes after assembly (a once-mode policy compresses the
// assembled prompt); a continuous one would evict from a chunk computed
// alone, which chunk reuse refuses.
TEST(ChunkAssemblyPolicyTest, OnceModePoliciesCompressTheAssembledPrompt) {
  KVX_REQUIRE_SHARED();
  Fixture once = Make("codec=f16;policy=snapkv,ratio=0.5,window=4,mode=once");
  ASSERT_NE(once.assembler, nullptr);
  const std::vector<int32_t> prefix = Tokens(*once.engine, "Read the texts below.", true);
  const std::vector<int32_t> suffix = Tokens(*once.engine, " Answer:");
  auto s = once.engine->NewSession();
  ASSERT_TRUE(s.ok());
  const auto chunks = Chunks(*once.engine);
  ASSERT_TRUE(once.assembler->Assemble(s->get(), prefix, chunks, suffix, ChunkRepair{}).ok());
  const int live_before = (*s)->kv().LiveEntries(0, 0);
  ASSERT_TRUE((*s)->Compress().ok());
  EXPECT_LT((*s)->kv().LiveEntries(0, 0), live_before);
  EXPECT_TRUE(once.engine->kv_manager().CheckInvariants().ok());

  Fixture continuous = Make("codec=f16;policy=h2o,budget=8");
  ASSERT_NE(continuous.assembler, nullptr);
  auto c = continuous.engine->NewSession();
  ASSERT_TRUE(c.ok());
  auto r = continuous.assembler->Assemble(c->get(), prefix, chunks, suffix, ChunkRepair{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mode=once"), std::string::npos) << r.status().ToString();
}

// Chunks are tokenized one by one: a chunk cut inside a multi-byte character
// is not valid UTF-8 and is refused naming the chunk.
TEST(ChunkAssemblyErrorsTest, ChunkCutInsideACharacterIsRefused) {
  KVX_REQUIRE_SHARED();
  Fixture f = Make("codec=f32", 64);
  const std::string text = "caf\xc3\xa9 au lait";
  const std::vector<std::string> whole = {text.substr(0, 5), text.substr(5)};
  EXPECT_TRUE(TokenizeChunks(f.engine->model().tokenizer(), whole, true).ok());
  const std::vector<std::string> cut = {text.substr(0, 4), text.substr(4)};
  auto r = TokenizeChunks(f.engine->model().tokenizer(), cut, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chunk 0"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos) << r.status().ToString();
}

TEST(ChunkRepairTest, Parses) {
  EXPECT_EQ(ParseChunkRepair("none")->mode, ChunkRepairMode::kNone);
  EXPECT_EQ(ParseChunkRepair("full")->mode, ChunkRepairMode::kFull);
  EXPECT_EQ(ParseChunkRepair("epic,k=16")->epic_tokens, 16);
  auto b = ParseChunkRepair("blend,r=0.3,layer=2");
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->blend_ratio, 0.3);
  EXPECT_EQ(b->blend_layer, 2);
  EXPECT_EQ(b->ToString(), "blend,r=0.3,layer=2");
  EXPECT_EQ(ParseChunkRepair(b->ToString())->ToString(), b->ToString());
  auto both = ParseChunkRepair("blend,r=0.05,k=16,dev=v");
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->epic_tokens, 16);
  EXPECT_EQ(both->blend_deviation, ChunkRepair::Deviation::kV);
  EXPECT_EQ(both->ToString(), "blend,r=0.05,layer=1,k=16,dev=v");
  EXPECT_EQ(ParseChunkRepair("epic")->epic_tokens, 4);
  EXPECT_EQ(ParseChunkRepair("blend")->epic_tokens, 0);
  for (const char* bad : {"", "blnd", "blend,r=2", "blend,r=", "epic,k=-1", "epic,r=0.1", "none,k=1", "blend,layer=x",
                          "blend,dev=q", "full,dev=k"}) {
    auto r = ParseChunkRepair(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("valid:"), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace kvx::engine
