// End-to-end tests of the `kvx` command line: every command runs, and bad
// input (missing/truncated/hostile files, unknown architectures, prompts
// longer than the context, invalid UTF-8, unknown --kv options) gives a clear
// error and exit code 1, never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf/gguf_writer.h"
#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::BinaryDir;
using testing::SharedPath;
using testing::TempDir;

struct CommandResult {
  int exit_code = -1;   // -1 when killed by a signal
  std::string output;   // stdout and stderr together
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

std::string TinyModel() {
  static const std::string path = [] {
    const std::string p = TempDir() + "/tiny.gguf";
    RunKvx("gen-model --shape tiny --type q8_0 -o " + p);
    return p;
  }();
  return path;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void ExpectError(const std::string& args, const std::string& needle) {
  const CommandResult r = RunKvx(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(CliTest, HelpForEveryCommand) {
  for (const char* cmd : {"", "run ", "inspect ", "perplexity ", "gen-model ", "bench ", "plan "}) {
    const CommandResult r = RunKvx(std::string(cmd) + "--help");
    EXPECT_EQ(r.exit_code, 0) << cmd << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
  }
}

TEST(CliTest, GenModelRunAndInspect) {
  const CommandResult run = RunKvx("run -m " + TinyModel() + " -p 'hello world' -n 8 -t 2 --ignore-eos");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("generation: 8 tokens"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("KV in use"), std::string::npos);
  const CommandResult inspect = RunKvx("inspect " + TinyModel());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(inspect.output.find("bytes/token"), std::string::npos);
  const CommandResult list = RunKvx("gen-model --list");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_NE(list.output.find("smollm2-135m"), std::string::npos);
}

// Several --kv: one process decodes each spec in interleaved rounds and
// prints each spec's median and its ratio to the first spec.
TEST(CliTest, BenchComparesSeveralSpecsInOneRun) {
  const std::string json = TempDir() + "/bench-compare.json";
  const CommandResult bench = RunKvx("bench -m " + TinyModel() +
                                     " -t 2 --depths 128 -n 2 -r 3 --kv codec=f16 --kv codec=int8 --json " + json);
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("vs first"), std::string::npos) << bench.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["order"], nlohmann::json({0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(j["decode"][1]["kv_spec"], "codec=int8,page=16");
}

// With a policy, bench fills the depth by a real forward pass and compresses
// once before decoding: the decode runs over (and reports) what was kept.
TEST(CliTest, BenchWithAPolicyDecodesOverTheCompressedCache) {
  const std::string json = TempDir() + "/bench-policy.json";
  const CommandResult bench = RunKvx("bench -m " + TinyModel() +
                                     " -t 2 --depths 256 -p 16 -n 2 -r 1 --kv 'codec=f16;policy=snapkv,ratio=0.5' --json " +
                                     json);
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["decode"].size(), 1u);
  const double full = 256 * j["kv_bytes_per_token"].get<double>();
  const double held = j["decode"][0]["kv_bytes"].get<double>();
  EXPECT_LT(held, 0.7 * full) << "snapkv at ratio 0.5 should hold about half of " << full << " bytes";
  EXPECT_GT(held, 0.3 * full);
  EXPECT_GT(j["decode"][0]["rss_bytes"].get<double>(), 0);
}

TEST(CliTest, BenchAndPlan) {
  const std::string json = TempDir() + "/bench.json";
  const CommandResult bench =
      RunKvx("bench -m " + TinyModel() + " -t 2 --depths 0,64 -p 32 -n 4 -r 1 --seqs 2 --seq-depths 0 --profile --json " +
             json);
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("% of bound"), std::string::npos) << bench.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_GT(j["decode"][1]["kv_bytes"].get<double>(), j["decode"][0]["kv_bytes"].get<double>());
  EXPECT_GT(j["bandwidth"]["read_gbps"].get<double>(), 0);
  // One bound for the run: the faster of the two read probes.
  EXPECT_GT(j["bound"]["stream_read_gbps"].get<double>(), 0);
  EXPECT_EQ(j["bound"]["read_gbps"].get<double>(),
            std::max(j["bound"]["stream_read_gbps"].get<double>(), j["bandwidth"]["read_gbps"].get<double>()));
  for (const auto& d : j["decode"]) {
    EXPECT_EQ(d["bound_gbps"].get<double>(), j["bound"]["read_gbps"].get<double>());
    EXPECT_DOUBLE_EQ(d["bound_tok_s"].get<double>(),
                     d["bound_gbps"].get<double>() * 1e9 / d["bytes_per_token"].get<double>());
  }
  // --profile: the phases of prefill and of a batched step, within the step's time.
  for (const auto* p : {&j["prefill"]["profile"], &j["batch"][0]["profile"]}) {
    double sum = 0;
    for (const auto& [name, ms] : (*p)["phase_ms"].items()) sum += ms.get<double>();
    EXPECT_GT((*p)["phase_ms"]["matmuls"].get<double>(), 0) << p->dump();
    EXPECT_GT((*p)["phase_ms"]["attention"].get<double>(), 0) << p->dump();
    EXPECT_LE(sum, (*p)["step_ms"].get<double>() * (1 + 1e-9)) << p->dump();
  }
  EXPECT_GT(j["batch"][0]["profile"]["phase_ms"]["sampling"].get<double>(), 0);
  EXPECT_NE(bench.output.find("| matmuls |"), std::string::npos) << bench.output;
  // Prefill's bound: matmul ops at the matmuls' peak, attention ops at the FMA peak.
  const auto& pf = j["prefill"];
  const double fma = j["peak_flops"]["gflops"].get<double>();
  const double matmul_peak = pf["peak_kind"] == "int8" ? j["peak_int8"]["gops"].get<double>() : fma;
  const double mm = pf["matmul_ops"].get<double>(), at = pf["attention_ops"].get<double>();
  EXPECT_GT(at, 0);
  const double bound = (mm + at) / (mm / matmul_peak + at / fma);
  EXPECT_NEAR(pf["bound_gops"].get<double>(), bound, 1e-9 * bound);
  EXPECT_NEAR(pf["pct_of_bound"].get<double>(), 100 * pf["gflops"].get<double>() / bound, 1e-6);
  EXPECT_NEAR(pf["pct_of_peak"].get<double>(), 100 * pf["gflops"].get<double>() / matmul_peak, 1e-6);
  const CommandResult plan = RunKvx("plan --shape smollm2-135m --ctx 4096 --mem 1G --kv codec=f16 -t 2");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("concurrency"), std::string::npos);
  // A policy's steady-state bytes size the sequences: SnapKV removing half
  // of a 4k context fits about twice the sequences of plain f16.
  const CommandResult snapkv =
      RunKvx("plan --shape smollm2-135m --ctx 4096 --mem 1G --kv 'codec=f16;policy=snapkv,ratio=0.5' -t 2");
  ASSERT_EQ(snapkv.exit_code, 0) << snapkv.output;
  auto concurrency = [](const std::string& out) {
    const std::string row = "| concurrency (sequences that fit) | ";
    const size_t at = out.find(row);
    return at == std::string::npos ? -1L : std::atol(out.c_str() + at + row.size());
  };
  EXPECT_GT(concurrency(plan.output), 0) << plan.output;
  EXPECT_GE(concurrency(snapkv.output), 2 * concurrency(plan.output) - 1) << snapkv.output;
  const CommandResult measured = RunKvx("plan -m " + TinyModel() + " --ctx 128 --mem 64M --measure -t 2");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("measured/bound"), std::string::npos);
  ExpectError("bench -m " + TinyModel() + " --depths 0,x", "--depths");
}

TEST(CliTest, SameSeedSameText) {
  const std::string args = "run -m " + TinyModel() + " -p 'the cat' -n 16 --temp 1.0 --top-k 0 --min-p 0 ";
  const CommandResult a = RunKvx(args + "--seed 5"), b = RunKvx(args + "--seed 5"), c = RunKvx(args + "--seed 6");
  ASSERT_EQ(a.exit_code, 0);
  auto text = [](const std::string& out) { return out.substr(0, out.find("prompt:")); };
  EXPECT_EQ(text(a.output), text(b.output));
  EXPECT_NE(text(a.output), text(c.output));
}

TEST(CliTest, RunWritesCoherentTextWithRealModel) {
  KVX_REQUIRE_SHARED();
  const CommandResult r =
      RunKvx("run -m " + SharedPath("models/tinystories656K/TinyStories-656K-F32.gguf") +
             " -p 'Once upon a time' -n 40 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Greedy TinyStories continues with a story made of ordinary English words.
  EXPECT_NE(r.output.find(" the "), std::string::npos) << r.output;
}

TEST(CliTest, MissingModelIsAClearError) { ExpectError("run -m /nonexistent.gguf -p hi", "cannot open"); }

TEST(CliTest, TruncatedModelIsAClearError) {
  std::ifstream in(TinyModel(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = TempDir() + "/truncated.gguf";
  WriteFile(path, bytes.substr(0, bytes.size() / 2));
  ExpectError("run -m " + path + " -p hi", "truncated");
  WriteFile(path, "GGUF");
  ExpectError("inspect " + path, "error");
  WriteFile(path, "not a gguf file at all");
  ExpectError("run -m " + path + " -p hi", "GGUF");
}

TEST(CliTest, UnknownArchitectureListsSupportedOnes) {
  gguf::GgufWriter w;
  w.SetString("general.architecture", "gptneox");
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"});
  const std::string path = TempDir() + "/gptneox.gguf";
  ASSERT_TRUE(w.WriteToFile(path).ok());
  ExpectError("run -m " + path + " -p hi", "llama, qwen2");
}

TEST(CliTest, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 200; ++i) prompt += "word ";
  ExpectError("run -m " + TinyModel() + " -c 32 -p '" + prompt + "'", "context");
}

TEST(CliTest, InvalidUtf8Prompt) {
  const std::string path = TempDir() + "/bad_utf8.txt";
  WriteFile(path, "hello \xff\xfe world");
  ExpectError("run -m " + TinyModel() + " -f " + path, "UTF-8");
}

TEST(CliTest, UnknownKvOption) {
  ExpectError("run -m " + TinyModel() + " -p hi --kv codec=f16,bogus=1", "bogus");
  ExpectError("run -m " + TinyModel() + " -p hi --kv codec=int3", "int3");
}

TEST(CliTest, KvBudgetExhaustedIsAClearError) {
  ExpectError("run -m " + TinyModel() + " -p 'hello there' -n 100 --kv 'budget=4K'", "budget");
}

TEST(CliTest, PerplexityNeedsEnoughText) {
  const std::string path = TempDir() + "/short.txt";
  WriteFile(path, "too short");
  ExpectError("perplexity -m " + TinyModel() + " -f " + path + " -c 64", "at least");
}

// The generated text before run's stats line, and the stats line's KV bytes.
std::pair<std::string, std::string> TextAndKvBytes(const std::string& output) {
  const size_t stats = output.rfind("prompt: ");
  const size_t kv = output.find("KV in use: ", stats);
  if (stats == std::string::npos || kv == std::string::npos) return {output, ""};
  return {output.substr(0, stats), output.substr(kv, output.find(' ', kv + 11) - kv)};
}

// kvx tune writes the file that --kv @FILE reads: run, eval and serve run the
// spec it chose exactly as if it were given as text. It also caches the
// result, which --kv auto finds for the same model (tune_cache.h).
TEST(CliTest, TunedSpecLoadsWithKvAtFileInRunEvalAndServe) {
  const std::string dir = TempDir(), out = dir + "/tuned.json", text = dir + "/tune_text.txt";
  const std::string cache = dir + "/tune_cache";
  std::filesystem::remove_all(cache);
  setenv("KVX_TUNE_CACHE", cache.c_str(), 1);  // never the user's cache; the children inherit it
  ExpectError("run -m " + TinyModel() + " -p hi --kv auto", "kvx tune -m " + TinyModel());
  std::string words;
  for (int i = 0; words.size() < 12000; ++i) words += "word" + std::to_string(i * 7919 % 1000) + " and more text. ";
  WriteFile(text, words);
  // Head typing's duo table is calibrated on other text than the KLD text (the same file is refused).
  const std::string heads_text = dir + "/heads_text.txt";
  WriteFile(heads_text, "other " + words);
  const std::string tune_args = "tune -m " + TinyModel() + " --mem 40K --ctx 256 -f " + text +
                                " --first-chunk 64 --max-chunk 128 -t 2 -q -o " + out + " --svg " + dir + "/tuned.svg";
  ExpectError(tune_args + " --heads-text " + text, "would leak");
  const CommandResult tune = RunKvx(tune_args + " --heads-text " + heads_text);
  ASSERT_EQ(tune.exit_code, 0) << tune.output;
  EXPECT_NE(tune.output.find("chosen: --kv '"), std::string::npos) << tune.output;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string spec = j.at("spec").get<std::string>();
  ASSERT_FALSE(spec.empty());
  EXPECT_LE(j.at("chosen").at("bytes").get<uint64_t>(), 40u * 1024);

  const std::string run = "run -m " + TinyModel() + " -p 'hello world' -n 12 --temp 0 --ignore-eos -t 2 --kv ";
  const CommandResult by_file = RunKvx(run + "@" + out), by_text = RunKvx(run + "'" + spec + "'");
  ASSERT_EQ(by_file.exit_code, 0) << by_file.output;
  ASSERT_EQ(by_text.exit_code, 0) << by_text.output;
  EXPECT_EQ(TextAndKvBytes(by_file.output), TextAndKvBytes(by_text.output));

  const std::string report = dir + "/tuned_eval.json";
  const CommandResult eval = RunKvx("eval -m " + TinyModel() + " --kv @" + out +
                                    " --tasks copy --copy-trials 1 -c 256 -t 2 -q --json " + report);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  std::ifstream rin(report);
  EXPECT_EQ(nlohmann::json::parse(rin).at("results").at(1).at("canonical").get<std::string>(), spec);

  // serve prints the spec it runs once it listens; it is then stopped by the timeout.
  const testing::CommandOutcome serve = testing::RunCommand(
      {BinaryDir() + "/kvx", "serve", "-m", TinyModel(), "--kv", "@" + out, "--port", "0", "-t", "1"}, 2);
  EXPECT_NE(serve.output.find("--kv '" + spec + "'"), std::string::npos) << serve.output;

  // --kv auto: the cached result of this model and budget, logged with its file.
  const testing::CommandOutcome serve_auto = testing::RunCommand(
      {BinaryDir() + "/kvx", "serve", "-m", TinyModel(), "--kv", "auto", "--port", "0", "-t", "1"}, 2);
  EXPECT_NE(serve_auto.output.find("--kv '" + spec + "'"), std::string::npos) << serve_auto.output;
  EXPECT_NE(serve_auto.output.find(cache + "/"), std::string::npos) << serve_auto.output;
  const CommandResult by_auto = RunKvx(run + "auto:40K");
  ASSERT_EQ(by_auto.exit_code, 0) << by_auto.output;
  EXPECT_EQ(TextAndKvBytes(by_auto.output).second, TextAndKvBytes(by_text.output).second);
  ExpectError("run -m " + TinyModel() + " -p hi --kv auto:41K", "--mem 41984");
  unsetenv("KVX_TUNE_CACHE");

  ExpectError("run -m " + TinyModel() + " -p hi --kv @" + dir + "/no_such_tuned.json", "no_such_tuned.json");
  ExpectError("serve -m " + TinyModel() + " --kv @" + text, "not valid JSON");
}

}  // namespace
}  // namespace kvx
