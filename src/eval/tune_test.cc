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
#include "kv/policy/head_typing.h"
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

  // A head table for `method` in which only the last layer's last head retrieves.
  static std::string WriteHeadTable(const std::string& method) {
    kv::HeadTable table;
    table.method = method;
    table.n_layers = model_->config().n_layers;
    table.n_kv_heads = model_->config().n_kv_heads;
    table.scores.assign(static_cast<size_t>(table.n_layers * table.n_kv_heads), 0.01);
    table.scores.back() = 0.9;
    const std::string path = testing::TempDir() + "/tune_heads_" + method + ".json";
    EXPECT_TRUE(table.Save(path).ok());
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
  // Every other candidate is compared with the chosen one on the same positions.
  for (size_t i = 0; i < r->candidates.size(); ++i) {
    const TuneCandidate& c = r->candidates[i];
    if (static_cast<int>(i) == r->chosen || c.search.empty() || !c.search[0].error.empty()) continue;
    ASSERT_TRUE(c.vs_chosen.has_value()) << c.spec;
    EXPECT_NEAR(c.vs_chosen->diff, c.search[c.vs_chosen->rung].kld - chosen.search[c.vs_chosen->rung].kld, 1e-6)
        << c.spec;
    EXPECT_LE(c.vs_chosen->lo95, c.vs_chosen->hi95) << c.spec;
  }
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

// Head typing in the space: below every other spec's bytes (one session,
// 1024 tokens), a duo or razor spec still fits (its streaming heads keep
// sinks + window), is found, and a real engine filled with it holds no more
// than the bytes the search counted for it.
TEST_F(TuneTest, HeadTypingFitsABudgetNothingElseFits) {
  TuneOptions o = Options(0);
  o.ctx = 1024;
  o.heads.duo = WriteHeadTable("duo");
  o.heads.razor = WriteHeadTable("razor");
  const kv::KVLayout layout = model_->KVLayoutFor(16);
  uint64_t smallest_other = std::numeric_limits<uint64_t>::max();
  for (const std::string& s : DefaultTuneSpace()) {
    const Result<uint64_t> b = SteadyStateBytes(kv::ParseKVSpec(s).value(), layout, o.ctx, 1);
    if (b.ok()) smallest_other = std::min(smallest_other, *b);
  }
  o.mem_bytes = smallest_other - 1;
  const std::vector<int32_t> text = Text(o);
  Result<TuneResult> r = RunTune(*model_, threads_, text, o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GE(r->chosen, 0);
  const TuneCandidate& chosen = r->candidates[r->chosen];
  EXPECT_TRUE(chosen.spec.find("policy=duo") != std::string::npos ||
              chosen.spec.find("policy=razor") != std::string::npos) << chosen.spec;
  EXPECT_LE(chosen.bytes, o.mem_bytes) << chosen.spec;
  engine::EngineOptions eo;
  eo.kv_spec = kv::ParseKVSpec(chosen.spec).value();
  eo.n_ctx = o.ctx;
  auto engine = engine::Engine::Create(model_, threads_, eo).value();
  auto session = engine->NewSession().value();
  std::vector<int32_t> fill;
  while (fill.size() < static_cast<size_t>(o.ctx)) fill.insert(fill.end(), text.begin(), text.end());
  fill.resize(static_cast<size_t>(o.ctx));
  ASSERT_TRUE(session->Feed(fill).ok());
  EXPECT_LE(engine->pool().bytes_in_use(), chosen.bytes) << chosen.spec;
}

// Rung 0 sees a fixed-window policy act: duo's streaming heads keep 16
// sinks + 64 recent tokens, so in a 64-token chunk (the first chunk asked
// for) nothing is evicted and duo scores exactly as f16; the rung-0 chunk is
// doubled until the window evicts at least half of what it does at --ctx,
// and there duo's KLD is above f16's.
TEST_F(TuneTest, Rung0IsLongEnoughForAFixedWindowToEvict) {
  TuneOptions o = Options(F16Bytes());
  o.max_chunk = 0;  // up to --ctx
  const std::string duo = "codec=f16,page=16;policy=duo,heads=" + WriteHeadTable("duo") + ",retrieval=0.0625,sinks=16,window=64";
  o.space = {"codec=f16", duo};
  const std::vector<kv::KVSpec> specs = {kv::ParseKVSpec(o.space[0]).value(), kv::ParseKVSpec(duo).value()};
  EXPECT_EQ(Rung0Chunk(std::span(specs).first(1), model_->KVLayoutFor(16), o), o.first_chunk)
      << "nothing to evict: the first chunk asked for";
  const std::vector<int32_t> text = Text(o);
  Result<TuneResult> r = RunTune(*model_, threads_, text, o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->candidates.size(), 2u);
  const TuneMeasure& f16 = r->candidates[0].search.at(0);
  const TuneMeasure& window = r->candidates[1].search.at(0);
  EXPECT_GT(window.chunk, 3 * (16 + 64) / 2) << "the prefilled 3/4 holds twice the window";
  EXPECT_EQ(window.chunk, f16.chunk) << "every candidate on the same rung-0 chunk";
  EXPECT_GT(window.kld, f16.kld + 3 * window.kld_stderr) << "the window evicted: KLD above f16's";
}

// Ties within error go to the smaller spec, anchored on the best KLD (no
// chains); a difference beyond the combined error keeps the KLD order.
TEST(TuneRankTest, PreferSmallerWithinError) {
  const auto cand = [](double kld, double se, uint64_t bytes) {
    TuneCandidate c;
    TuneMeasure m;
    m.kld = kld;
    m.kld_stderr = se;
    c.search.push_back(m);
    c.bytes = bytes;
    return c;
  };
  // 0: the best point estimate, 28 MB; 1: within its error at 16 MB;
  // 2: smaller, just beyond 0's error (no chain through 1); 3: far worse, tiny.
  const std::vector<TuneCandidate> c = {cand(0.0068, 0.0008, 28), cand(0.0069, 0.0008, 16),
                                        cand(0.0081, 0.0008, 12), cand(0.05, 0.001, 1)};
  std::vector<int> ranked = {0, 1, 2, 3};
  PreferSmallerWithinError(&ranked, c, 0);
  EXPECT_EQ(ranked, (std::vector<int>{1, 0, 2, 3}));
}

// With per-position KL the tie is a paired test on the same positions: a
// spec worse at every position by a hair is not within error even when its
// unpaired standard errors overlap the best one's; one whose differences
// swing both ways is.
TEST(TuneRankTest, PreferSmallerWithinErrorIsPairedWithPositions) {
  const auto cand = [](const std::vector<float>& kl, uint64_t bytes) {
    TuneCandidate c;
    TuneMeasure m;
    MeanAccumulator acc;
    for (float v : kl) acc.Add(v);
    m.kld = acc.Mean();
    m.kld_stderr = acc.StdErr();
    m.chunk = 256;
    m.n_chunks = 1;
    m.kl = kl;
    c.search.push_back(m);
    c.bytes = bytes;
    return c;
  };
  std::vector<float> best(256), hair(256), swing(256);
  for (size_t i = 0; i < best.size(); ++i) {
    best[i] = 0.002f + 0.004f * static_cast<float>((i * 53) % 17) / 16;  // spread: unpaired errors are wide
    hair[i] = best[i] + 0.0001f;                                           // always a hair worse
    swing[i] = best[i] + ((i / 32) % 2 ? 0.0003f : -0.00028f);             // as often better as worse
  }
  const std::vector<TuneCandidate> c = {cand(best, 28), cand(swing, 20), cand(hair, 16)};
  ASSERT_LT(c[2].search[0].kld - c[0].search[0].kld, std::hypot(c[0].search[0].kld_stderr, c[2].search[0].kld_stderr))
      << "unpaired, the hair-worse spec would tie";
  std::vector<int> ranked = {0, 1, 2};
  PreferSmallerWithinError(&ranked, c, 0);
  EXPECT_EQ(ranked, (std::vector<int>{1, 0, 2})) << "swing ties with the best and is smaller; hair is worse";
  ASSERT_TRUE(PairedKld(c[0].search[0], c[2].search[0]).has_value());
  EXPECT_EQ(PairedKld(c[0].search[0], c[2].search[0])->Verdict(), PairedVerdict::kWorse);
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

// Ctrl-C during the retrieval check (the real scorer, kvx eval's passkey
// prompts): the prompts stop at the next one, nothing is judged, and the
// spec chosen on KLD is kept, as a search without retrieval chooses it.
TEST_F(TuneTest, StopDuringRetrievalKeepsTheBestSpecSoFar) {
  TuneOptions o = Options(F16Bytes() / 3);
  const std::vector<int32_t> text = Text(o);
  Result<TuneResult> kld_only = RunTune(*model_, threads_, text, o, {});
  ASSERT_TRUE(kld_only.ok()) << kld_only.status().ToString();
  o.retrieval.tasks = {Task::kPasskey};
  o.retrieval.trials = 2;
  ProgressBar::Options po;
  po.enabled = false;
  ProgressBar progress(po);
  int polls_in_retrieval = 0;
  std::optional<TuneResult> last_written;
  TuneHooks hooks;
  hooks.progress = &progress;
  hooks.on_update = [&](const TuneResult& r) { last_written = r; };
  hooks.stop = [&]() -> std::string {
    if (progress.state().label != "retrieval" && polls_in_retrieval == 0) return "";
    return ++polls_in_retrieval > 3 ? "test stop" : "";  // a few prompts in
  };
  Result<TuneResult> r = RunTune(*model_, threads_, text, o, hooks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(polls_in_retrieval, 3) << "stopped inside the retrieval prompts";
  EXPECT_TRUE(r->stopped);
  EXPECT_EQ(r->stop_reason, "test stop");
  EXPECT_FALSE(r->retrieval.has_value()) << "no verdict from a partial run";
  ASSERT_GE(r->chosen, 0);
  EXPECT_EQ(r->candidates[r->chosen].spec, kld_only->candidates[kld_only->chosen].spec);
  ASSERT_TRUE(last_written.has_value());
  EXPECT_EQ(last_written->candidates[last_written->chosen].spec, r->candidates[r->chosen].spec);
  EXPECT_NE(TuneResultJson(*r, o, "{}").find("\"stopped\": true"), std::string::npos);
}

// The real scorer (kvx eval's passkey prompts on the model): one hit per
// prompt in the order they ran, the same order on every run, and a give_up
// that says stop ends the run there without marking it stopped.
TEST_F(TuneTest, ModelScorerStopsWhereGiveUpSays) {
  RetrievalSettings rs;
  rs.tasks = {Task::kPasskey};
  rs.length = 256;
  rs.trials = 1;
  const RetrievalScorer score = ModelRetrievalScorer(*model_, threads_, rs, nullptr);
  Result<RetrievalRun> all = score("codec=f16", nullptr);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_FALSE(all->stopped);
  EXPECT_TRUE(all->error.empty()) << all->error;
  ASSERT_EQ(all->hits.size(), static_cast<size_t>(rs.Prompts()));
  int asked = 0;
  Result<RetrievalRun> part = score("codec=int8", [&](std::span<const uint8_t> so_far) {
    ++asked;
    return so_far.size() >= 2;
  });
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_FALSE(part->stopped) << "given up, not stopped";
  EXPECT_TRUE(part->error.empty()) << part->error;
  EXPECT_EQ(part->hits.size(), 2u);
  EXPECT_GE(asked, 2);
  Result<RetrievalRun> again = score("codec=f16", nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->hits, all->hits) << "the same prompts in the same order";
  const RetrievalScorer stopped = ModelRetrievalScorer(*model_, threads_, rs, nullptr, [] { return true; });
  Result<RetrievalRun> none = stopped("codec=f16", nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->stopped);
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

// Issue 37's "equal quality means retrieval too": a spec that keeps a tiny
// window (StreamingLLM) loses every needle; with a quality floor every spec
// meets (its KLD forced to pass), it is the smallest and would be chosen on
// KLD alone, but the retrieval verdict (a stubbed score table: f16 and the
// others answer every prompt, the window none) ranks it last.
TEST_F(TuneTest, RetrievalVerdictRejectsASpecThatLosesTheNeedle) {
  const std::string window = "codec=f16,page=16;policy=streamingllm,sinks=4,window=8";
  TuneOptions o = Options(F16Bytes());
  o.space = {"codec=f16", "codec=int8", window};
  o.max_kld = 1e9;
  const std::vector<int32_t> text = Text(o);
  const std::string canonical_window = kv::ParseKVSpec(window).value().ToString();
  Result<TuneResult> kld_only = RunTune(*model_, threads_, text, o, {});
  ASSERT_TRUE(kld_only.ok()) << kld_only.status().ToString();
  ASSERT_EQ(kld_only->candidates[kld_only->chosen].spec, canonical_window) << "smallest, so chosen on KLD alone";

  o.retrieval.tasks = {Task::kPasskey};
  constexpr int kPrompts = 50;
  std::vector<std::string> asked;
  TuneHooks hooks;
  // f16 and the others answer every prompt, the window none; like the real
  // scorer, a run ends when give_up says so.
  hooks.retrieval = [&](const std::string& spec, const RetrievalGiveUp& give_up) -> Result<RetrievalRun> {
    asked.push_back(spec);
    RetrievalRun run;
    for (int i = 0; i < kPrompts; ++i) {
      run.hits.push_back(spec.find("streamingllm") == std::string::npos ? 1 : 0);
      if (give_up && give_up(run.hits)) break;
    }
    return run;
  };
  Result<TuneResult> r = RunTune(*model_, threads_, text, o, hooks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // f16, then the best-ranked finalist (the window: the smallest meeting
  // the floor), stopped at its 4th miss (46/50 would be below f16's
  // interval [0.93, 1]), then the next, which holds: nothing else runs.
  ASSERT_EQ(asked.size(), 3u);
  EXPECT_EQ(asked[0], "codec=f16");
  EXPECT_EQ(asked[1], canonical_window);
  ASSERT_TRUE(r->retrieval.has_value());
  EXPECT_EQ(r->retrieval->n, kPrompts);
  const TuneCandidate& chosen = r->candidates[r->chosen];
  EXPECT_EQ(chosen.spec, asked[2]);
  EXPECT_NE(chosen.spec, canonical_window) << "rejected by retrieval though its KLD passes";
  ASSERT_TRUE(chosen.retrieval.has_value());
  EXPECT_EQ(chosen.retrieval->verdict, "indistinguishable");
  EXPECT_EQ(chosen.retrieval->n, kPrompts);
  EXPECT_TRUE(EqualQuality(chosen, o));
  const auto window_verdict = [&](const TuneResult& result) -> std::optional<RetrievalVerdict> {
    for (const TuneCandidate& c : result.candidates) {
      if (c.spec == canonical_window) return c.retrieval;
    }
    return std::nullopt;
  };
  std::optional<RetrievalVerdict> w = window_verdict(*r);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->verdict, "worse");
  EXPECT_EQ(w->hits, 0);
  EXPECT_EQ(w->n, 4);
  EXPECT_EQ(w->skipped, kPrompts - 4);
  EXPECT_EQ(r->candidates[r->finalists.back()].spec, canonical_window) << "ranked below every finalist";
  for (int i : r->finalists) {
    if (r->candidates[i].spec != canonical_window && i != r->chosen) {
      EXPECT_FALSE(r->candidates[i].retrieval) << "not run";
    }
  }
  // The JSON carries the rate, its interval and the verdict per finalist.
  std::string json = TuneResultJson(*r, o, "{}");
  EXPECT_NE(json.find("\"verdict\": \"worse\""), std::string::npos);
  EXPECT_NE(json.find("\"skipped\": 46"), std::string::npos);
  EXPECT_NE(json.find("\"lo95\""), std::string::npos);
  EXPECT_NE(json.find("\"equal_quality\": true"), std::string::npos);
  // The chart has a second panel: bytes against the judged specs' hit rates.
  const std::string svg = TuneParetoSvg(*r);
  std::string xml_error;
  EXPECT_TRUE(XmlWellFormed(svg, &xml_error)) << xml_error;
  EXPECT_NE(svg.find("retrieval hit rate (f16: 50/50)"), std::string::npos);

  // --retrieval-compare: every finalist and the compared specs answer every prompt.
  asked.clear();
  o.compare_retrieval = true;
  r = RunTune(*model_, threads_, text, o, hooks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> expected = {"codec=f16"};
  for (int i : r->finalists) expected.push_back(r->candidates[i].spec);
  for (const auto& [role, i] : r->retrieval->compared) {
    if (i >= 0 && std::find(expected.begin(), expected.end(), r->candidates[i].spec) == expected.end()) {
      expected.push_back(r->candidates[i].spec);
    }
  }
  std::sort(expected.begin(), expected.end());
  std::sort(asked.begin(), asked.end());
  EXPECT_EQ(asked, expected);
  w = window_verdict(*r);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->n, kPrompts) << "not stopped early";
  EXPECT_EQ(w->skipped, 0);
  EXPECT_EQ(w->verdict, "worse");
  EXPECT_NE(r->candidates[r->chosen].spec, canonical_window);
}

TEST(RetrievalVerdictTest, IntervalAndPairedTest) {
  const std::vector<uint8_t> f16(50, 1);
  std::vector<uint8_t> spec(50, 1);
  EXPECT_EQ(JudgeRetrieval(f16, spec).verdict, "indistinguishable");
  for (int n : {10, 20, 30, 50, 100}) {  // every prompt answered by both is no verdict, at any n
    const std::vector<uint8_t> all(static_cast<size_t>(n), 1);
    EXPECT_EQ(JudgeRetrieval(all, all).verdict, "indistinguishable") << n;
  }
  spec[0] = spec[1] = 0;  // 48/50: inside f16's interval [0.93, 1], 2 discordant prompts (p = 0.5)
  EXPECT_EQ(JudgeRetrieval(f16, spec).verdict, "indistinguishable");
  for (int i = 0; i < 6; ++i) spec[i] = 0;  // 44/50 = 0.88 < 0.93: below the interval
  const RetrievalVerdict v = JudgeRetrieval(f16, spec);
  EXPECT_EQ(v.verdict, "worse");
  EXPECT_EQ(v.only_f16, 6);
  EXPECT_NEAR(v.mcnemar_p, 2.0 / 64, 1e-12);
  // Paired: the same rate as f16 but on other prompts is no verdict; a
  // spec that wins 8 prompts f16 loses, and loses none, is better.
  std::vector<uint8_t> half(50, 0), other(50, 0);
  for (int i = 0; i < 25; ++i) half[i] = 1, other[49 - i] = 1;
  EXPECT_EQ(JudgeRetrieval(half, other).verdict, "indistinguishable");
  std::vector<uint8_t> more = half;
  for (int i = 25; i < 33; ++i) more[i] = 1;
  EXPECT_EQ(JudgeRetrieval(half, more).verdict, "better");
  EXPECT_EQ(JudgeRetrieval(f16, std::vector<uint8_t>(10, 1)).verdict, "worse") << "unpaired sizes";
  EXPECT_FALSE(JudgeRetrieval(f16, std::vector<uint8_t>(10, 1)).error.empty());
  EXPECT_FALSE(JudgeRetrieval(f16, std::vector<uint8_t>(51, 1)).error.empty());
}

// A run stopped early: with f16 at 50/50 (interval [0.93, 1]) three misses
// can still end indistinguishable (47/50, McNemar p = 0.25), a fourth
// cannot (46/50 < 0.93), wherever the misses fall.
TEST(RetrievalVerdictTest, CertainlyWorseOnAPrefix) {
  const std::vector<uint8_t> f16(50, 1);
  std::vector<uint8_t> so_far = {1, 0, 1, 0, 0};
  EXPECT_FALSE(CertainlyWorse(f16, so_far));
  so_far.push_back(0);
  EXPECT_TRUE(CertainlyWorse(f16, so_far));
  const RetrievalVerdict v = JudgeRetrieval(f16, so_far);
  EXPECT_EQ(v.verdict, "worse");
  EXPECT_TRUE(v.error.empty());
  EXPECT_EQ(v.n, 6);
  EXPECT_EQ(v.hits, 2);
  EXPECT_EQ(v.skipped, 44);
  EXPECT_EQ(v.only_f16, 4);
  // Where f16 missed, the spec's misses cost nothing.
  std::vector<uint8_t> f16_missing = f16;
  for (int i = 0; i < 4; ++i) f16_missing[static_cast<size_t>(i)] = 0;
  EXPECT_FALSE(CertainlyWorse(f16_missing, std::vector<uint8_t>(4, 0)));
  EXPECT_TRUE(CertainlyWorse(f16, std::vector<uint8_t>(4, 0)));
  EXPECT_FALSE(CertainlyWorse(f16, {}));
}

}  // namespace
}  // namespace kvx::eval
