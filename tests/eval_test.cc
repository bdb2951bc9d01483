// kvx eval end to end: the library on a synthetic model (no shared data
// needed) and the command line on each real model of ../shared/models.
//   * a spec compared with itself gives KLD exactly 0 and 100% top-1
//     agreement; ppl equals eval::Perplexity (`kvx perplexity`) exactly;
//   * every result carries measured KV bytes and the compression vs f16;
//   * the JSON report has every documented field; the SVGs are well-formed.
#include "eval/eval.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <string>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "eval/report.h"
#include "eval/svg.h"
#include "model/synthetic_model.h"
#include "support/models.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using nlohmann::json;
using testing::BinaryDir;
using testing::SharedPath;
using testing::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunKvx(const std::string& args) {
  const std::string cmd = BinaryDir() + "/kvx " + args + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string& SyntheticModel() {
  static const std::string path = [] {
    const std::string p = TempDir() + "/eval_tiny.gguf";
    model::SyntheticModelOptions o;
    o.shape = "tiny";
    o.type = gguf::TensorType::kF32;
    o.init_std = 0.5f;  // sharp distributions, so codecs make visible differences
    EXPECT_TRUE(model::WriteSyntheticModel(o, p).ok());
    return p;
  }();
  return path;
}

std::string SomeText() {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "word" + std::to_string(i * 7919 % 97) + " and more text here. ";
  return text;
}

TEST(EvalTest, SelfSpecGivesZeroKldAndPplMatchesPerplexity) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPpl, eval::Task::kKld, eval::Task::kCopy};
  o.baseline = "codec=f32";
  o.specs = {"codec=f32", "codec=f16,page=8"};
  o.n_ctx = 128;
  o.chunk = 64;
  o.max_chunks = 3;
  o.text = SomeText();
  o.text_name = "synthetic";
  o.copy_span = 8;
  o.copy_trials = 2;
  int updates = 0;
  bool first_update_incomplete = false;
  eval::EvalHooks hooks;
  hooks.on_update = [&](const eval::EvalReport& r) {
    if (updates++ == 0) first_update_incomplete = !r.complete;
  };
  auto report = eval::RunEval(**model, &threads, o, hooks);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->complete);
  EXPECT_TRUE(first_update_incomplete);
  EXPECT_GE(updates, 4);
  ASSERT_EQ(report->specs.size(), 3u);
  const eval::SpecResult& base = report->specs[0];
  const eval::SpecResult& self = report->specs[1];
  const eval::SpecResult& f16 = report->specs[2];
  EXPECT_TRUE(base.is_baseline);
  EXPECT_FALSE(base.kld.has_value());  // no KLD of the baseline against itself
  ASSERT_TRUE(self.kld && self.kld->ok);
  EXPECT_EQ(self.kld->mean, 0.0);
  EXPECT_EQ(self.kld->p99, 0.0);
  EXPECT_EQ(self.kld->max, 0.0);
  EXPECT_EQ(self.kld->top1, 1.0);
  EXPECT_EQ(self.kld->n_positions, 3 * 31);
  EXPECT_EQ(self.ppl->ppl, base.ppl->ppl);
  ASSERT_TRUE(f16.kld && f16.kld->ok);
  EXPECT_GT(f16.kld->mean, 0.0);
  EXPECT_LT(f16.kld->mean, 1e-3);
  EXPECT_GE(f16.kld->p99, f16.kld->median);
  EXPECT_GE(f16.kld->max, f16.kld->p99);
  EXPECT_EQ(f16.canonical, "codec=f16,page=8");

  // ppl is exactly what eval::Perplexity (kvx perplexity) computes.
  engine::EngineOptions eo;
  eo.kv_spec = kv::ParseKVSpec("codec=f16,page=8").value();
  eo.n_ctx = 128;
  auto rt = engine::Engine::Create(&**model, &threads, eo);
  ASSERT_TRUE(rt.ok());
  auto session = (*rt)->NewSession();
  ASSERT_TRUE(session.ok());
  auto tokens = (*model)->tokenizer().Encode(o.text, true, false);
  ASSERT_TRUE(tokens.ok());
  eval::PerplexityOptions po;
  po.n_ctx = 64;
  po.max_chunks = 3;
  auto ppl = eval::Perplexity(session->get(), *tokens, po);
  ASSERT_TRUE(ppl.ok());
  EXPECT_EQ(f16.ppl->ppl, ppl->ppl);
  EXPECT_EQ(f16.ppl->ppl_stderr, ppl->ppl_stderr);
  EXPECT_EQ(f16.ppl->n_scored, ppl->n_scored);
  // Zero chunks is an error, never PPL = 0/0 = -nan.
  po.max_chunks = 0;
  auto none = eval::Perplexity(session->get(), *tokens, po);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--chunks"), std::string::npos) << none.status().message();

  // KV bytes: measured from the pools.
  EXPECT_GT(base.ppl->kv.peak_bytes, f16.ppl->kv.peak_bytes);
  EXPECT_EQ(f16.ppl->kv.peak_tokens, 64);
  EXPECT_EQ(f16.ppl->kv.f16_bytes, 64u * report->model.f16_bytes_per_token);
  EXPECT_EQ(report->model.f16_bytes_per_token, 2u * 2u * 2u * 2u * 16u);  // K+V, f16, 2 layers, 2 heads, dim 16
  EXPECT_NEAR(f16.ppl->kv.CompressionVsF16(), 1.0, 0.2);
  EXPECT_NEAR(base.ppl->kv.CompressionVsF16(), 0.5, 0.1);
  // copy's longest sequence: [BOS] span, filler of the longest distance
  // (128 - 1 - 2 x 8), the repeat without its last token.
  ASSERT_TRUE(f16.copy && f16.copy->ok);
  const int bos = (*model)->tokenizer().add_bos() ? 1 : 0;
  EXPECT_EQ(f16.copy->kv.peak_tokens, bos + 8 + 111 + 7);
  EXPECT_EQ(f16.kv.peak_bytes, f16.copy->kv.peak_bytes);
  ASSERT_EQ(f16.copy->sources.size(), 2u);
  EXPECT_GT(f16.copy->sources[0].chance, 0.0);
  EXPECT_EQ(f16.copy->sources[1].source, "text");

  // Reports are consistent with the results.
  const json j = eval::ReportToJson(*report);
  EXPECT_EQ(j["results"][1]["kld"]["mean"].get<double>(), 0.0);
  EXPECT_EQ(j["results"][1]["kld"]["top1"].get<double>(), 1.0);
  const std::string md = eval::ReportToMarkdown(*report, false);
  EXPECT_NE(md.find("| 1 | `codec=f32,page=16` |"), std::string::npos) << md;
  std::string err;
  EXPECT_TRUE(eval::XmlWellFormed(eval::ParetoSvg(*report), &err)) << err;
}

// ppl and kld over SomeText() on the synthetic model, against f32, at
// context 128: the split-protocol tests' common options.
eval::EvalOptions TextTaskOptions(std::vector<std::string> specs) {
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPpl, eval::Task::kKld};
  o.baseline = "codec=f32";
  o.specs = std::move(specs);
  o.n_ctx = 128;
  o.text = SomeText();
  o.text_name = "synthetic";
  return o;
}

// With a policy that compresses once, ppl/kld split each chunk: the first
// kld_context of it is prefilled and compressed, the rest scored token by
// token, for the baseline and every spec alike. A spec equal to the
// baseline still gives KLD exactly 0; the compressed spec holds fewer bytes
// and differs; --compress none, which would keep the policy from running, is
// refused.
TEST(EvalTest, OnceCompressionSplitsPplAndKldChunks) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = TextTaskOptions({"codec=f32", "codec=f32;policy=snapkv,ratio=0.5,window=4,sinks=2"});
  o.chunk = 64;
  o.max_chunks = 3;
  o.kld_context = 0.75;
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->specs.size(), 3u);
  const eval::SpecResult& base = report->specs[0];
  const eval::SpecResult& self = report->specs[1];
  const eval::SpecResult& snap = report->specs[2];
  ASSERT_TRUE(self.kld && self.kld->ok && snap.kld && snap.kld->ok);
  EXPECT_EQ(base.ppl->context, 48);
  EXPECT_EQ(snap.kld->context, 48);
  EXPECT_EQ(self.kld->n_positions, 3 * (64 - 1 - 48));
  EXPECT_EQ(snap.ppl->n_scored, 3 * (64 - 1 - 48));
  EXPECT_EQ(self.kld->mean, 0.0);
  EXPECT_EQ(self.ppl->ppl, base.ppl->ppl);
  EXPECT_GT(snap.kld->mean, 1e-4);  // about half of the context is gone
  EXPECT_LT(snap.kld->kv.peak_bytes, self.kld->kv.peak_bytes);

  // --compress none never asks a once policy to run: refused, rather than a
  // row under the policy's name for a cache it never touched.
  o.compress = "none";
  const auto refused = eval::RunEval(**model, &threads, o, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("--compress none never asks"), std::string::npos);
  o.specs = {"codec=f32"};  // no policy: one prefill, the second half scored (llama.cpp's protocol)
  auto plain = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->specs[1].kld->context, 0);
  EXPECT_EQ(plain->specs[1].kld->n_positions, 3 * 31);

  for (double bad : {1.5, 63.0}) {  // not a whole token count; leaves fewer than 2 tokens of 64 to score
    o.kld_context = bad;
    EXPECT_EQ(eval::RunEval(**model, &threads, o, {}).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// --kld-context in tokens with --kld-score: each chunk is the context, the
// scored tokens and one more, whatever the model's context; the scored
// count is exact. Contradictions are refused.
TEST(EvalTest, KldContextInTokensWithScoredCount) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = TextTaskOptions({"codec=f32;policy=snapkv,ratio=0.5,window=4,sinks=2"});
  o.max_chunks = 2;
  o.kld_context = 40;
  o.kld_score = 16;
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->settings.chunk, 57);
  const eval::SpecResult& snap = report->specs[1];
  ASSERT_TRUE(snap.kld && snap.kld->ok);
  EXPECT_EQ(snap.kld->context, 40);
  EXPECT_EQ(snap.kld->n_positions, 2 * 16);
  const nlohmann::json j = eval::ReportToJson(*report);
  EXPECT_EQ(j["settings"]["ppl"]["kld_score"], 16);
  auto back = eval::ReportFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(eval::ReportToJson(*back), j);

  o.specs = {"codec=int8"};  // a codec alone: the same scored positions, not the chunk's second half
  auto codec = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(codec.ok()) << codec.status().ToString();
  ASSERT_TRUE(codec->specs[1].kld && codec->specs[1].kld->ok);
  EXPECT_EQ(codec->specs[1].kld->context, 40);
  EXPECT_EQ(codec->specs[1].kld->n_positions, 2 * 16);

  o.specs = {"codec=f32;policy=snapkv,ratio=0.5,window=4,sinks=2"};
  o.chunk = 64;  // contradicts 40 + 16 + 1
  EXPECT_EQ(eval::RunEval(**model, &threads, o, {}).status().code(), StatusCode::kInvalidArgument);
  o.chunk = 0;
  o.kld_score = 100;  // 141 tokens per chunk > context 128
  EXPECT_EQ(eval::RunEval(**model, &threads, o, {}).status().code(), StatusCode::kInvalidArgument);
  o.kld_context = 0.5;  // a share has no scored count
  o.kld_score = 16;
  EXPECT_EQ(eval::RunEval(**model, &threads, o, {}).status().code(), StatusCode::kInvalidArgument);
}

// --storage-codec: the context's full blocks go through the tier block
// format and back. Lossless gives KLD exactly 0 (the pages byte for byte);
// a lossy level a KLD above 0 from blocks several times smaller; the KV
// bytes are the stored block's, over its 256 tokens.
// The options of the --storage-codec tests: kld of f16 against f16 on one
// 400-token chunk (context 300: one block of 256, 44 tokens fed again).
eval::EvalOptions StorageCodecOptions() {
  eval::EvalOptions o;
  o.tasks = {eval::Task::kKld};
  o.baseline = "codec=f16";
  o.specs = {"codec=f16"};
  o.n_ctx = 512;
  o.chunk = 400;
  o.max_chunks = 1;
  o.text = SomeText();
  o.text_name = "synthetic";
  return o;
}

TEST(EvalTest, StorageCodecSendsTheContextThroughTheTierFormat) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = StorageCodecOptions();
  auto kld_at = [&](const char* level) {
    o.storage_codec = level;
    auto report = eval::RunEval(**model, &threads, o, {});
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    const eval::KldResult kld = report.ok() ? report->specs[1].kld.value_or(eval::KldResult{}) : eval::KldResult{};
    EXPECT_TRUE(kld.ok) << level << ": " << kld.error;
    return kld;
  };
  const eval::KldResult exact = kld_at("lossless"), lossy = kld_at("low");
  EXPECT_EQ(exact.mean, 0.0);
  EXPECT_EQ(exact.kv.peak_tokens, 256);
  EXPECT_GT(lossy.mean, 0.0);
  EXPECT_LT(lossy.kv.peak_bytes * 3, exact.kv.peak_bytes);
  o.tasks = {eval::Task::kKld, eval::Task::kCopy};
  EXPECT_EQ(eval::RunEval(**model, &threads, o, {}).status().code(), StatusCode::kInvalidArgument);
}

// --storage-codec on a retrieval task: each prompt but its last token goes
// through the tier block format and back before the answer, as a tier hit
// serves it. Lossless restores the pages byte for byte, so every answer is
// the baseline's (same codec) word for word; its KV bytes are the blocks'
// (one block of 256 tokens of each 400-token prompt); `low` stores less.
TEST(EvalTest, StorageCodecSendsRetrievalPromptsThroughTheTierFormat) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = StorageCodecOptions();
  o.tasks = {eval::Task::kPasskey};
  o.lengths = {400};
  o.depths = {0.25, 0.75};
  o.passkey_trials = 2;
  auto run_at = [&](const char* level) {
    o.storage_codec = level;
    auto report = eval::RunEval(**model, &threads, o, {});
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : eval::EvalReport{};
  };
  const eval::EvalReport exact = run_at("lossless"), low = run_at("low");
  ASSERT_EQ(exact.specs.size(), 2u);
  const eval::RetrievalResult& base = *exact.specs[0].passkey;
  const eval::RetrievalResult& trip = *exact.specs[1].passkey;
  ASSERT_TRUE(trip.ok) << trip.error;
  ASSERT_EQ(trip.cells.size(), base.cells.size());
  for (size_t c = 0; c < base.cells.size(); ++c) EXPECT_EQ(trip.cells[c].example, base.cells[c].example) << c;
  EXPECT_EQ(trip.hits, base.hits);
  EXPECT_EQ(trip.kv.peak_tokens, 256);
  ASSERT_TRUE(low.specs[1].passkey->ok) << low.specs[1].passkey->error;
  EXPECT_LT(low.specs[1].passkey->kv.peak_bytes * 3, trip.kv.peak_bytes);
  // compact: the spec's transform is calibrated (once, before its first
  // prompt, while its pool is empty) and every prompt goes through it.
  o.storage_calib = TempDir() + "/eval_retrieval_calib.txt";
  std::string calib;
  for (int i = 0; i < 300; ++i) calib += "calibration " + std::to_string(i * 7919 % 97) + " text. ";
  std::ofstream(o.storage_calib) << calib;
  o.storage_calib_tokens = 400;
  const eval::EvalReport compact = run_at("compact");
  ASSERT_TRUE(compact.specs[1].passkey->ok) << compact.specs[1].passkey->error;
  EXPECT_EQ(compact.specs[1].passkey->n, base.n);
}

// --storage-codec compact: each spec's transform is calibrated on
// --storage-calib first (another text than the eval's), then the context's
// blocks go through it: smaller than at `low`, a finite KLD above 0 (not a
// small one: this random model's KV has no correlated channels for the PCA
// to find, so the default rates drop most of it; the KLD is measured on
// the recall model, docs/tiers.md); a calibration text that cannot be read
// is that spec's error, not a crash.
TEST(EvalTest, CompactCalibratesThenSendsTheContextThroughItsTransform) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = StorageCodecOptions();
  o.storage_calib = TempDir() + "/eval_calib.txt";
  std::string calib;
  for (int i = 0; i < 300; ++i) calib += "other" + std::to_string(i * 104729 % 89) + " words, in another order. ";
  std::ofstream(o.storage_calib) << calib;
  o.storage_calib_tokens = 1200;
  auto kld_at = [&](const char* level) {
    o.storage_codec = level;
    auto report = eval::RunEval(**model, &threads, o, {});
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? report->specs[1].kld.value_or(eval::KldResult{}) : eval::KldResult{};
  };
  const eval::KldResult low = kld_at("low"), compact = kld_at("compact");
  ASSERT_TRUE(compact.ok) << compact.error;
  EXPECT_GT(compact.mean, 0.0);
  EXPECT_TRUE(std::isfinite(compact.mean));
  EXPECT_LT(compact.kv.peak_bytes, low.kv.peak_bytes);
  o.storage_calib = TempDir() + "/no_such_calibration.txt";
  const eval::KldResult missing = kld_at("compact");
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.error.find("--storage-codec compact"), std::string::npos) << missing.error;
}

// A policy that acts between steps (a StreamingLLM window) changes no logit
// over one whole-chunk prefill; the split feeds the tail step by step, so
// the window's evictions show in the KLD.
TEST(EvalTest, ContinuousPoliciesSplitTheChunksToo) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o = TextTaskOptions({"codec=f32;policy=streamingllm,sinks=2,window=8"});
  o.chunk = 64;
  o.max_chunks = 2;
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const eval::SpecResult& window = report->specs[1];
  ASSERT_TRUE(window.kld && window.kld->ok);
  EXPECT_EQ(window.kld->context, 48);
  EXPECT_GT(window.kld->mean, 1e-4);
  EXPECT_LT(window.kld->kv.peak_bytes, report->specs[0].ppl->kv.peak_bytes);
}

TEST(EvalTest, BudgetExhaustionIsReportedPerSpecAndTheRunGoesOn) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok());
  ThreadPool threads(2);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPpl, eval::Task::kKld};
  o.specs = {"codec=f16;budget=8K", "codec=f16"};
  o.n_ctx = 128;
  o.chunk = 64;
  o.max_chunks = 2;
  o.text = SomeText();
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->specs.size(), 3u);
  EXPECT_FALSE(report->specs[1].ppl->ok);
  EXPECT_NE(report->specs[1].ppl->error.find("budget"), std::string::npos) << report->specs[1].ppl->error;
  EXPECT_FALSE(report->specs[1].kld->ok);
  EXPECT_TRUE(report->specs[2].kld->ok);
  EXPECT_NE(eval::SummaryTable(*report).find("error:"), std::string::npos);
}

TEST(EvalTest, SetupErrorsAreClear) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok());
  ThreadPool threads(1);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPpl};
  o.specs = {"codec=nope"};
  o.text = SomeText();
  o.n_ctx = 128;
  auto bad_spec = eval::RunEval(**model, &threads, o, {});
  ASSERT_FALSE(bad_spec.ok());
  EXPECT_NE(bad_spec.status().message().find("codec=nope"), std::string::npos) << bad_spec.status().message();
  o.specs = {};
  o.text = "";
  auto no_text = eval::RunEval(**model, &threads, o, {});
  ASSERT_FALSE(no_text.ok());
  EXPECT_NE(no_text.status().message().find("-f FILE"), std::string::npos);
  EXPECT_FALSE(eval::ParseTasks("ppl,bogus").ok());
  EXPECT_EQ(eval::ParseTasks("all")->size(), 12u);
  EXPECT_EQ(*eval::ParseTasks("niah"),
            (std::vector<eval::Task>{eval::Task::kNiahWord, eval::Task::kNiahNumber, eval::Task::kNiahUuid}));
  EXPECT_EQ(eval::ParseTasks("ruler,passkey")->size(), 7u);
  EXPECT_NE(eval::ParseTasks("niah_bogus").status().message().find("niah_multivalue"), std::string::npos);
  EXPECT_EQ(*eval::ParseTasks(" kld , ppl "), (std::vector<eval::Task>{eval::Task::kPpl, eval::Task::kKld}));
}

// The command line on every real model: a small run of every task, f32
// baseline vs f16 and vs itself.
TEST(EvalTest, CommandLineOnRealModels) {
  KVX_REQUIRE_SHARED();
  for (const testing::RealModel& m : testing::RealModels()) {
    SCOPED_TRACE(m.name);
    const std::string dir = TempDir() + "/eval_" + m.name;
    const std::string json_path = dir + ".json";
    const CommandResult r =
        RunKvx("eval -m " + SharedPath(m.model_path) + " --kv codec=f16 --kv codec=f32 -f " +
               SharedPath("golden/stories_eval.txt") + " --data " + SharedPath("data") +
               " --tasks ppl,kld,copy,passkey,lines,needle"
               " -c 512 --chunk 128 --chunks 2 --copy-trials 2 --lengths 256,512 --depths 0,1 --passkey-trials 1"
               " --lines 2 --lines-trials 2 -t 2 --json " +
               json_path + " --report " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("| # | spec | KV bytes (peak) | vs f16 | PPL |"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\r"), std::string::npos);  // no progress bar when stderr is not a terminal

    const json j = json::parse(ReadAll(json_path));
    EXPECT_EQ(j["schema"], "kvx.eval/1");
    EXPECT_TRUE(j["complete"].get<bool>());
    for (const char* k : {"path", "name", "arch", "n_layers", "n_kv_heads", "head_dim", "n_ctx_train", "n_vocab",
                          "f16_bytes_per_token"}) {
      EXPECT_TRUE(j["model"].contains(k)) << k;
    }
    for (const char* k :
         {"tasks", "baseline", "specs", "n_ctx", "seed", "text", "ppl", "copy", "passkey", "lines", "needle"}) {
      EXPECT_TRUE(j["settings"].contains(k)) << k;
    }
    ASSERT_EQ(j["results"].size(), 3u);
    for (const json& s : j["results"]) {
      SCOPED_TRACE(s["spec"].get<std::string>());
      EXPECT_TRUE(s["done"].get<bool>());
      for (const char* task : {"ppl", "copy", "passkey", "lines", "needle"}) {
        ASSERT_TRUE(s.contains(task)) << task;
        const json& t = s[task];
        EXPECT_TRUE(t["ok"].get<bool>()) << task << ": " << t.dump();
        EXPECT_GT(t["kv"]["peak_bytes"].get<uint64_t>(), 0u) << task;
        EXPECT_GT(t["kv"]["peak_tokens"].get<int64_t>(), 0) << task;
        EXPECT_GT(t["kv"]["compression_vs_f16"].get<double>(), 0.0) << task;
      }
      EXPECT_GT(s["ppl"]["ppl"].get<double>(), 1.0);
      for (const char* k : {"accuracy", "score", "cells", "metric", "n"}) EXPECT_TRUE(s["needle"].contains(k)) << k;
      for (const char* k : {"span", "skip", "sources"}) EXPECT_TRUE(s["copy"].contains(k)) << k;
      EXPECT_EQ(s["copy"]["sources"].size(), 2u);
    }
    const json& base = j["results"][0];
    const json& f16 = j["results"][1];
    const json& self = j["results"][2];
    EXPECT_TRUE(base["baseline"].get<bool>());
    EXPECT_FALSE(base.contains("kld"));
    // The spec against itself: exactly 0 and 100%.
    EXPECT_EQ(self["kld"]["mean"].get<double>(), 0.0);
    EXPECT_EQ(self["kld"]["p99"].get<double>(), 0.0);
    EXPECT_EQ(self["kld"]["top1"].get<double>(), 1.0);
    EXPECT_EQ(self["ppl"]["ppl"].get<double>(), base["ppl"]["ppl"].get<double>());
    EXPECT_EQ(self["copy"]["sources"][0]["accuracy"], base["copy"]["sources"][0]["accuracy"]);
    // f16 is close to f32 and holds about half the bytes.
    for (const char* k : {"mean", "mean_stderr", "median", "p90", "p99", "max", "top1", "top1_stderr", "n_positions"}) {
      EXPECT_TRUE(f16["kld"].contains(k)) << k;
    }
    EXPECT_GE(f16["kld"]["mean"].get<double>(), 0.0);
    EXPECT_LT(f16["kld"]["mean"].get<double>(), 1e-3);
    EXPECT_GT(f16["kld"]["top1"].get<double>(), 0.95);
    const double ratio = static_cast<double>(base["ppl"]["kv"]["peak_bytes"].get<uint64_t>()) /
                         static_cast<double>(f16["ppl"]["kv"]["peak_bytes"].get<uint64_t>());
    EXPECT_GT(ratio, 1.5);
    EXPECT_LE(ratio, 2.0);
    EXPECT_GT(f16["kv"]["compression_vs_f16"].get<double>(), 0.8);
    EXPECT_LE(f16["kv"]["compression_vs_f16"].get<double>(), 1.0);

    // Report folder: the same JSON, Markdown, well-formed SVGs.
    EXPECT_EQ(json::parse(ReadAll(dir + "/report.json")), j);
    EXPECT_NE(ReadAll(dir + "/report.md").find("![quality vs KV bytes](pareto.svg)"), std::string::npos);
    for (const std::string svg : {"pareto.svg", "needle-0.svg", "needle-1.svg", "passkey-2.svg"}) {
      const std::string doc = ReadAll(dir + "/" + svg);
      std::string err;
      EXPECT_TRUE(eval::XmlWellFormed(doc, &err)) << svg << ": " << err;
      EXPECT_NE(doc.find("<svg"), std::string::npos) << svg;
    }
  }
}

// vt needs no data: on the synthetic model every part of a RULER task runs
// (planning, greedy answers stopped at the line end, scoring, the cells the
// baseline solves) and the report reads back from its JSON unchanged.
TEST(EvalTest, RulerTaskOnSyntheticModelAndJsonRoundTrip) {
  auto model = model::Model::Load(SyntheticModel());
  ASSERT_TRUE(model.ok());
  ThreadPool threads(2);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPasskey, eval::Task::kVt};
  o.specs = {"codec=f32", "codec=int2"};
  o.n_ctx = 2048;
  o.lengths = {1536, 2048};
  o.depths = {0.0, 1.0};
  o.ruler_trials = 2;
  o.passkey_trials = 1;
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  for (const eval::SpecResult& s : report->specs) {
    ASSERT_TRUE(s.vt && s.vt->ok) << s.spec;
    EXPECT_EQ(s.vt->metric, "values_found");
    EXPECT_EQ(s.vt->n, 8);
    ASSERT_EQ(s.vt->cells.size(), 4u);
    for (const eval::CellResult& c : s.vt->cells) {
      EXPECT_EQ(c.n, 2);
      EXPECT_LE(c.prompt_tokens_sum / c.n + eval::RulerDefaultGen(eval::Task::kVt), c.cell.length);
      EXPECT_GE(c.Score(), 0.0);
      EXPECT_LE(c.Score(), 1.0);
    }
    EXPECT_LE(s.vt->kv.peak_tokens, 2048);
  }
  // The spec equal to the baseline matches it cell for cell.
  const eval::SolvedCells self = eval::BaselineSolved(*report->specs[0].vt, *report->specs[1].vt);
  EXPECT_EQ(self.Accuracy(), self.n > 0 ? 1.0 : 0.0);
  EXPECT_EQ(report->specs[1].vt->score_sum, report->specs[0].vt->score_sum);

  const nlohmann::json j = eval::ReportToJson(*report);
  ASSERT_TRUE(j["results"][2]["vt"].contains("baseline_solved"));
  // Per-prompt outcomes: every prompt once, by its id in the plan, with its
  // depth; the spec equal to the baseline agrees on every prompt, so the
  // paired test finds no discordant prompt.
  for (const char* task : {"passkey", "vt"}) {
    const nlohmann::json& t = j["results"][1][task];
    ASSERT_EQ(t["prompts"].size(), t["n"].get<size_t>()) << task;
    std::set<int> ids;
    for (const auto& p : t["prompts"]) {
      ids.insert(p["id"].get<int>());
      EXPECT_TRUE(p.contains("depth"));
    }
    EXPECT_EQ(ids.size(), t["n"].get<size_t>());
    EXPECT_EQ(t["vs_baseline"]["n"], t["n"]);
    EXPECT_EQ(t["vs_baseline"]["baseline_only"].get<int>() + t["vs_baseline"]["spec_only"].get<int>(), 0);
    EXPECT_EQ(t["vs_baseline"]["verdict"], "indistinguishable");
    EXPECT_EQ(t["score_ci95"].size(), 2u);
    EXPECT_FALSE(j["results"][0][task].contains("vs_baseline"));  // the baseline against itself
  }
  EXPECT_EQ(j["results"][2]["vt"]["baseline_solved"]["cells"], 4);
  EXPECT_EQ(j["settings"]["ruler"]["n_gen"]["vt"], eval::RulerDefaultGen(eval::Task::kVt));
  // The Wilson interval holds the rate.
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& vt = j["results"][i]["vt"];
    EXPECT_LE(vt["accuracy_ci95"][0].get<double>(), vt["accuracy"].get<double>());
    EXPECT_GE(vt["accuracy_ci95"][1].get<double>(), vt["accuracy"].get<double>());
  }
  EXPECT_TRUE(j["results"][2]["vt"].contains("vs_baseline"));
  auto back = eval::ReportFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(eval::ReportToJson(*back), j);
  EXPECT_EQ(eval::ReportToMarkdown(*back, true), eval::ReportToMarkdown(*report, true));
  EXPECT_EQ(eval::HeatMapSvg(*back, 2, eval::Task::kVt), eval::HeatMapSvg(*report, 2, eval::Task::kVt));
  const std::string md = eval::ReportToMarkdown(*report, true);
  EXPECT_NE(md.find("## Retrieval on the cells the baseline solves"), std::string::npos) << md;
  EXPECT_NE(md.find("## vt: share of the values found by depth × length"), std::string::npos);
  EXPECT_NE(md.find("](vt-2.svg)"), std::string::npos);
}

// Every RULER task on the model trained to retrieve, through the command
// line, one prompt per cell.
TEST(EvalTest, RulerTasksOnTheRecallModel) {
  KVX_REQUIRE_SHARED();
  const std::string dir = TempDir() + "/eval_recall";
  const CommandResult r = RunKvx("eval -m " + SharedPath("models/recall/recall-llama-8L-d512-f16.gguf") +
                                 " --kv codec=f16,page=32 --tasks passkey,ruler --data " + SharedPath("data") +
                                 " -c 1024 --lengths 768,1024 --depths 0,1 --passkey-trials 1 --ruler-trials 1"
                                 " -t 2 --report " +
                                 dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| niah_word | niah_number | niah_uuid | niah_multikey | niah_multivalue | vt |"),
            std::string::npos)
      << r.output;
  const json j = json::parse(ReadAll(dir + "/report.json"));
  for (const char* task : {"niah_word", "niah_number", "niah_uuid", "niah_multikey", "niah_multivalue", "vt"}) {
    SCOPED_TRACE(task);
    for (const json& s : j["results"]) {
      const json& t = s[task];
      ASSERT_TRUE(t["ok"].get<bool>()) << t.dump();
      EXPECT_EQ(t["metric"], "values_found");
      EXPECT_EQ(t["n"], 4);
      EXPECT_EQ(t["cells"].size(), 4u);
      EXPECT_LE(t["kv"]["peak_tokens"].get<int>(), 1024);
      EXPECT_TRUE(t.contains("baseline_solved"));
    }
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + task + "-1.svg"));
    EXPECT_EQ(j["settings"]["ruler"]["n_gen"][task], eval::RulerDefaultGen(*eval::TaskByName(task)));
  }
  // The model retrieves: at 1k tokens its passkey and single number needle
  // are found (README: 100% passkey up to 4k).
  EXPECT_EQ(j["results"][0]["passkey"]["accuracy"].get<double>(), 1.0);
  EXPECT_GT(j["results"][0]["niah_number"]["accuracy"].get<double>(), 0.0);
}

TEST(EvalTest, CommandLineErrors) {
  const CommandResult unknown = RunKvx("eval -m " + SyntheticModel() + " --tasks ppl,bogus -q");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown task 'bogus'"), std::string::npos) << unknown.output;
  const CommandResult spec = RunKvx("eval -m " + SyntheticModel() + " --tasks copy --kv codec=nope -q");
  EXPECT_EQ(spec.exit_code, 1) << spec.output;
  EXPECT_NE(spec.output.find("codec=nope"), std::string::npos) << spec.output;
  const CommandResult data = RunKvx("eval -m " + SyntheticModel() + " --tasks needle --data /nonexistent -q");
  EXPECT_EQ(data.exit_code, 1) << data.output;
  EXPECT_NE(data.output.find("--data"), std::string::npos) << data.output;
  const CommandResult essays = RunKvx("eval -m " + SyntheticModel() + " --tasks niah_uuid --data /nonexistent -q");
  EXPECT_EQ(essays.exit_code, 1) << essays.output;
  EXPECT_NE(essays.output.find("--data"), std::string::npos) << essays.output;
  const CommandResult short_vt = RunKvx("eval -m " + SyntheticModel() + " --tasks vt -c 512 --lengths 100 -q");
  EXPECT_EQ(short_vt.exit_code, 1) << short_vt.output;
  EXPECT_NE(short_vt.output.find("vt: length 100 is too short"), std::string::npos) << short_vt.output;
  const CommandResult render = RunKvx("eval --render /nonexistent.json --report " + TempDir() + "/r -q");
  EXPECT_EQ(render.exit_code, 1) << render.output;
  const CommandResult no_model = RunKvx("eval --tasks vt -q");
  EXPECT_EQ(no_model.exit_code, 1) << no_model.output;
  EXPECT_NE(no_model.output.find("-m MODEL is required"), std::string::npos) << no_model.output;
}

}  // namespace
}  // namespace kvx
