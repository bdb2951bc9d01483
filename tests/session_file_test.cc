// Session files end to end: `kvx run --save-session` then `--load-session`
// prints exactly what one uninterrupted run prints (greedy), on a synthetic
// model and on the real models of ../shared; a restored session of a real
// model gives the logits of the session that never left, bit for bit; a
// damaged or foreign file is refused with exit code 1 and a clear message.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "engine/session.h"
#include "engine/session_file.h"
#include "support/models.h"
#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::BinaryDir;
using testing::RunCommand;
using testing::SharedPath;
using testing::TempDir;

std::string Kvx() { return BinaryDir() + "/kvx"; }

// What `kvx run` wrote to stdout: its output up to the stats line (stdout is
// flushed before anything goes to stderr; the text ends with one newline).
std::string GeneratedText(const testing::CommandOutcome& r) {
  const size_t stats = r.output.rfind("prompt: ");
  std::string text = r.output.substr(0, stats == std::string::npos ? r.output.size() : stats);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// Saves after n1 tokens, continues n2 more from the file, and compares with
// one run of n1 + n2 tokens.
void ExpectSplitRunMatchesWhole(const std::string& model, const std::string& kv, const std::string& prompt) {
  SCOPED_TRACE(model + " " + kv);
  const std::string file = TempDir() + "/split.kvxs";
  const std::vector<std::string> base = {Kvx(), "run", "-m", model, "--kv", kv, "--temp", "0", "-t", "2", "--ignore-eos"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunCommand(a);
  };
  const auto first = with({"-p", prompt, "-n", "12", "--save-session", file});
  ASSERT_TRUE(first.exited && first.exit_code == 0) << first.Describe() << "\n" << first.output;
  EXPECT_NE(first.output.find("saved the session"), std::string::npos);
  const auto second = with({"-n", "12", "--load-session", file});
  ASSERT_TRUE(second.exited && second.exit_code == 0) << second.Describe() << "\n" << second.output;
  const auto whole = with({"-p", prompt, "-n", "24"});
  ASSERT_TRUE(whole.exited && whole.exit_code == 0) << whole.Describe() << "\n" << whole.output;
  EXPECT_EQ(GeneratedText(whole), GeneratedText(first) + GeneratedText(second));
  EXPECT_GT(GeneratedText(second).size(), 0u);
}

std::string TinyModel() {
  static const std::string path = [] {
    const std::string p = TempDir() + "/session-tiny.gguf";
    RunCommand({Kvx(), "gen-model", "--shape", "tiny", "--type", "q8_0", "-o", p});
    return p;
  }();
  return path;
}

TEST(SessionFileCliTest, SplitRunMatchesOneRunOnSyntheticModel) {
  for (const char* kv : {"codec=f16", "codec=kivi2,page=16,residual=16", "codec=int8;policy=streamingllm,sinks=4,window=16"}) {
    ExpectSplitRunMatchesWhole(TinyModel(), kv, "hello session");
  }
}

TEST(SessionFileCliTest, SplitRunMatchesOneRunOnRealModels) {
  KVX_REQUIRE_SHARED();
  for (const auto& m : testing::RealModels()) {
    ExpectSplitRunMatchesWhole(SharedPath(m.model_path), "codec=kivi4,page=16,residual=16", "Once upon a time");
  }
}

TEST(SessionFileCliTest, DamagedAndForeignFilesAreRefused) {
  const std::string file = TempDir() + "/cli.kvxs";
  auto saved = RunCommand({Kvx(), "run", "-m", TinyModel(), "-p", "abc", "-n", "4", "--save-session", file});
  ASSERT_TRUE(saved.exited && saved.exit_code == 0) << saved.output;
  std::string bytes;
  {
    std::ifstream f(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto expect_refused = [&](const std::string& content, std::vector<std::string> extra, const std::string& words) {
    const std::string bad = TempDir() + "/bad.kvxs";
    std::ofstream(bad, std::ios::binary) << content;
    std::vector<std::string> a = {Kvx(), "run", "-m", TinyModel(), "-n", "2", "--load-session", bad};
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = RunCommand(a);
    EXPECT_TRUE(r.exited) << r.Describe();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << r.output;
  };
  expect_refused(bytes.substr(0, bytes.size() / 2), {}, "truncated");
  std::string flipped = bytes;
  flipped[flipped.size() - 10] ^= 4;
  expect_refused(flipped, {}, "corrupted");
  expect_refused("hello", {}, "not a kvx session file");
  expect_refused(bytes, {"--kv", "codec=int8"}, "saved with --kv 'codec=f16,page=16'");
  const std::string other = TempDir() + "/session-other.gguf";
  RunCommand({Kvx(), "gen-model", "--shape", "tiny", "--type", "q8_0", "--seed", "9", "-o", other});
  auto r = RunCommand({Kvx(), "run", "-m", other, "-n", "2", "--load-session", file});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("another model"), std::string::npos) << r.output;
}

// The library path on a real model: the restored sequence's logits equal
// those of the sequence that was saved, for every real model and a few specs.
TEST(SessionFileRealModelTest, RestoredLogitsAreBitIdentical) {
  KVX_REQUIRE_SHARED();
  for (const auto& m : testing::RealModels()) {
    for (const char* kv : {"codec=f16", "codec=kivi2,page=32,residual=32,prerope=1", "codec=int4,rotate=hadamard"}) {
      SCOPED_TRACE(m.name + " " + kv);
      engine::EngineOptions eo;
      eo.model_path = SharedPath(m.model_path);
      eo.kv_spec = kv::ParseKVSpec(kv).value();
      eo.n_ctx = 256;
      eo.n_seqs = 3;
      eo.n_threads = 2;
      auto e = engine::Engine::Load(eo);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      auto a = (*e)->NewSession();
      ASSERT_TRUE(a.ok());
      const auto prompt = (*e)->model().tokenizer().Encode("Once upon a time there was a dog who", true, false);
      ASSERT_TRUE(prompt.ok());
      ASSERT_TRUE((*a)->Feed(*prompt).ok());
      for (int i = 0; i < 40; ++i) ASSERT_TRUE((*a)->Feed({static_cast<int32_t>(10 + i)}).ok());
      auto bytes = engine::EncodeSession(**e, (*a)->id(), {});
      ASSERT_TRUE(bytes.ok());
      auto r = engine::DecodeSession(
          **e, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      auto b = (*e)->AdoptSequence(r->seq);
      const int n_vocab = (*e)->model().config().n_vocab;
      for (int i = 0; i < 30; ++i) {
        const int32_t t = static_cast<int32_t>((i * 7 + 3) % n_vocab);
        auto la = (*a)->Feed({t});
        ASSERT_TRUE(la.ok());
        std::vector<float> first(*la, *la + n_vocab);
        auto lb = b->Feed({t});
        ASSERT_TRUE(lb.ok());
        ASSERT_EQ(0, std::memcmp(first.data(), *lb, sizeof(float) * n_vocab)) << "step " << i;
      }
      EXPECT_TRUE((*e)->kv_manager().CheckInvariants().ok());
    }
  }
}

}  // namespace
}  // namespace kvx
