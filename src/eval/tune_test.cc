// kvx tune's search (eval/tune.h) on a tiny generated model: the chosen spec
// fits the budget (by its size and by the bytes a real engine holds), an
// impossible budget is an error naming the smallest spec, a stopped search
// keeps the best spec measured so far, a quality floor picks the smallest
// spec meeting it.
#include "eval/tune.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <random>

#include "engine/engine.h"
#include "engine/session.h"
#include "eval/svg.h"
#include "kv/block_pool.h"
#include "model/synthetic_model.h"
#include "support/test_data.h"

namespace kvx::eval {
namespace {

constexpr int kCtx = 256;

class TuneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::TempDir() + "/tune_tiny.gguf";
    model::SyntheticModelOptions mo;
    mo.shape = "tiny";
    ASSERT_TRUE(model::WriteSyntheticModel(mo, path).ok());
    model_ = std::move(model::Model::Load(path).value()).release();
    threads_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete threads_;
    delete model_;
  }

  // Random tokens (not BOS/EOS): KLD needs no meaning, only a fixed text.
  static std::vector<int32_t> Text(const TuneOptions& o) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(3, model_->config().n_vocab - 4);
    std::vector<int32_t> t(static_cast<size_t>(TuneTextTokens(o)));
    for (int32_t& x : t) x = tok(rng);
    return t;
  }

  static TuneOptions Options(uint64_t mem) {
    TuneOptions o;
    o.mem_bytes = mem;
    o.ctx = kCtx;
    o.first_chunk = 64;
    o.max_chunk = 128;
    o.batch = 4;
    return o;
  }

  static uint64_t F16Bytes() {
    return SteadyStateBytes(kv::KVSpec{}, model_->KVLayoutFor(16), kCtx, 1).value();
  }

  static std::string WriteResult(const std::string& json) {
    const std::string path = testing::TempDir() + "/tune_result.json";
    std::ofstream(path) << json;
    return path;
  }

  static const model::Model* model_;
  static ThreadPool* threads_;
};

const model::Model* TuneTest::model_ = nullptr;
ThreadPool* TuneTest::threads_ = nullptr;

TEST_F(TuneTest, ChosenSpecFitsTheBudget) {
  const TuneOptions o = Options(F16Bytes() / 3);
  const std::vector<int32_t> text = Text(o);
  Result<TuneResult> r = RunTune(*model_, threads_, text, o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GE(r->chosen, 0);
  EXPECT_FALSE(r->stopped);
  const TuneCandidate& chosen = r->candidates[r->chosen];
  EXPECT_LE(chosen.bytes, o.mem_bytes) << chosen.spec;
  for (const TuneCandidate& c : r->candidates) EXPECT_LE(c.bytes, o.mem_bytes) << c.spec;
  EXPECT_TRUE(chosen.holdout.has_value()) << "the chosen spec is validated on unseen text";
  // The file --kv @FILE reads gives the chosen spec; the chart is well-formed.
  EXPECT_EQ(kv::ExpandKVSpecArg("@" + WriteResult(TuneResultJson(*r, o, "{}"))).value(), chosen.spec);
  std::string xml_error;
  EXPECT_TRUE(XmlWellFormed(TuneParetoSvg(*r), &xml_error)) << xml_error;
  // A real engine with the chosen spec, filled to --ctx, holds no more.
  engine::EngineOptions eo;
  eo.kv_spec = kv::ParseKVSpec(chosen.spec).value();
  eo.n_ctx = kCtx;
  auto engine = engine::Engine::Create(model_, threads_, eo).value();
  auto session = engine->NewSession().value();
  const std::vector<int32_t> fill(text.begin(), text.begin() + kCtx);
  ASSERT_TRUE(session->Feed(fill).ok());
  EXPECT_LE(engine->pool().bytes_in_use(), o.mem_bytes) << chosen.spec;
}

// A policy's evictions count: with several sessions, below every codec-only
// spec's bytes a spec that evicts still fits (SteadyStateBytes scales by what
// policies keep); one session's prefill peak is counted in full.
TEST_F(TuneTest, APolicyFitsABudgetNoCodecAloneFits) {
  constexpr int kSessions = 8;
  uint64_t smallest_codec = std::numeric_limits<uint64_t>::max();
  uint64_t smallest_policy = std::numeric_limits<uint64_t>::max();
  for (const std::string& s : DefaultTuneSpace()) {
    const kv::KVSpec spec = kv::ParseKVSpec(s).value();
    const Result<uint64_t> b = SteadyStateBytes(spec, model_->KVLayoutFor(16), kCtx, kSessions);
    if (!b.ok()) continue;
    uint64_t& smallest = s.find("policy=") == std::string::npos ? smallest_codec : smallest_policy;
    smallest = std::min(smallest, *b);
  }
  ASSERT_LT(smallest_policy, smallest_codec);
  TuneOptions o = Options(smallest_codec - 1);
  o.sessions = kSessions;
  Result<TuneResult> r = RunTune(*model_, threads_, Text(o), o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GE(r->chosen, 0);
  const TuneCandidate& chosen = r->candidates[r->chosen];
  EXPECT_NE(chosen.spec.find("policy="), std::string::npos) << chosen.spec;
  EXPECT_LE(chosen.bytes, o.mem_bytes) << chosen.spec;
}

// One session of a compress-once policy needs its whole prompt in the codec
// before it compresses: it is never smaller than its codec alone.
TEST_F(TuneTest, OneSessionCountsThePrefillPeak) {
  const kv::KVLayout layout = model_->KVLayoutFor(16);
  const uint64_t codec = SteadyStateBytes(kv::ParseKVSpec("codec=int8").value(), layout, kCtx, 1).value();
  const uint64_t snapkv =
      SteadyStateBytes(kv::ParseKVSpec("codec=int8;policy=snapkv,ratio=0.5").value(), layout, kCtx, 1).value();
  EXPECT_GE(snapkv, codec);
  const uint64_t snapkv4 =
      SteadyStateBytes(kv::ParseKVSpec("codec=int8;policy=snapkv,ratio=0.5").value(), layout, kCtx, 4).value();
  EXPECT_LT(snapkv4, 4 * codec);
}

TEST_F(TuneTest, ImpossibleBudgetNamesTheSmallestSpec) {
  const TuneOptions o = Options(1024);
  uint64_t smallest = std::numeric_limits<uint64_t>::max();
  std::string smallest_spec;
  for (const std::string& s : DefaultTuneSpace()) {
    const kv::KVSpec spec = kv::ParseKVSpec(s).value();
    const Result<uint64_t> b = SteadyStateBytes(spec, model_->KVLayoutFor(16), kCtx, 1);
    if (b.ok() && *b < smallest) smallest = *b, smallest_spec = spec.ToString();
  }
  ASSERT_GT(smallest, o.mem_bytes);
  Result<TuneResult> r = RunTune(*model_, threads_, Text(o), o, {});
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("no KV spec fits"), std::string::npos) << m;
  EXPECT_NE(m.find("'" + smallest_spec + "'"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(smallest) + " bytes"), std::string::npos) << m;
}

TEST_F(TuneTest, StopKeepsTheBestSpecSoFar) {
  const TuneOptions o = Options(F16Bytes());
  int updates = 0;
  TuneHooks hooks;
  hooks.on_update = [&](const TuneResult&) { ++updates; };
  hooks.stop = [&]() -> std::string { return updates > 0 ? "test stop" : ""; };  // after the first pass
  Result<TuneResult> r = RunTune(*model_, threads_, Text(o), o, hooks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->stopped);
  EXPECT_EQ(r->stop_reason, "test stop");
  ASSERT_GE(r->chosen, 0);
  int measured = 0;
  const double chosen_kld = r->candidates[r->chosen].search.at(0).kld;
  for (const TuneCandidate& c : r->candidates) {
    if (c.search.empty()) continue;
    ++measured;
    ASSERT_EQ(c.search[0].error, "") << c.spec;
    EXPECT_GE(c.search[0].kld, chosen_kld) << c.spec << " beats the chosen " << r->candidates[r->chosen].spec;
  }
  EXPECT_EQ(measured, o.batch) << "one pass measured";
  EXPECT_LT(measured, static_cast<int>(r->candidates.size()));
}

TEST_F(TuneTest, QualityFloorPicksTheSmallestSpecMeetingIt) {
  TuneOptions o = Options(F16Bytes());
  o.max_kld = 0.001;
  Result<TuneResult> r = RunTune(*model_, threads_, Text(o), o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GE(r->chosen, 0);
  const TuneCandidate& chosen = r->candidates[r->chosen];
  ASSERT_LE(chosen.search.back().kld, *o.max_kld) << chosen.spec;
  // No finalist that meets the floor at the last rung is smaller.
  for (int i : r->finalists) {
    const TuneCandidate& c = r->candidates[i];
    if (c.search.back().kld <= *o.max_kld) {
      EXPECT_GE(c.bytes, chosen.bytes) << c.spec;
    }
  }
  EXPECT_LT(chosen.bytes, F16Bytes()) << "a compressed spec meets a loose floor";
}

}  // namespace
}  // namespace kvx::eval
