// Every policy on every codec setting, on the real recall model
// (../shared/models/recall, head_dim 64): each combination either runs
// (prefill, compress, decode, finite logits) and then holds fewer bytes than
// the same codec without a policy (Quest: the same bytes, it only selects),
// or is refused up front with a clear InvalidArgument/Unimplemented, never
// a crash or a refusal in the middle of a sequence. On f16 and f32 every
// policy must run. The combinations are where bugs hide: the per-policy
// tests each fix one codec.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"
#include "kv/policy/head_typing.h"
#include "model/model.h"
#include "support/test_data.h"
#include "util/thread_pool.h"

namespace kvx {
namespace {

bool AllFinite(const float* x, int n) {
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

TEST(PolicyCodecMatrixTest, EveryCombinationRunsAndFreesOrIsRefusedUpFront) {
  KVX_REQUIRE_SHARED();
  auto model = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int n_vocab = (*model)->config().n_vocab;
  ThreadPool threads(2);

  // A head table for duo/razor with one retrieval-looking head per layer.
  kv::HeadTable heads;
  heads.method = "duo";
  heads.n_layers = (*model)->config().n_layers;
  heads.n_kv_heads = (*model)->config().n_kv_heads;
  for (int i = 0; i < heads.n_layers * heads.n_kv_heads; ++i) heads.scores.push_back(i % 2 ? 0.9 : 0.1);
  const std::string heads_path = testing::TempDir() + "/matrix-heads.json";
  ASSERT_TRUE(heads.Save(heads_path).ok());

  const std::vector<std::string> codecs = {
      "codec=f32", "codec=f16", "codec=int8", "codec=int4,rotate=none", "codec=int2,clip=0", "codec=kivi4,page=32",
      "codec=kivi2,page=32", "codec=kivi4,page=64,group=64,prerope=1", "codec=int4,residual=32",
      "codec=int2,outliers=0.01", "codec=int4,rotate=hadamard", "codec=kivi2,page=32,prerope=1,sinks=1"};
  // Budgets sized for the 320-token prompt: each policy removes about half.
  const std::vector<std::string> policies = {
      "streamingllm,sinks=4,window=128", "h2o,ratio=0.5", "scissorhands,ratio=0.5", "tova,ratio=0.5",
      "snapkv,ratio=0.5", "snapkv,ratio=0.5,kernel=15,pool=max", "pyramidkv,ratio=0.5", "cake,ratio=0.5",
      "adakv,ratio=0.5", "adakv,ratio=0.5,base=tova", "duo,heads=" + heads_path + ",retrieval=0.5,sinks=4,window=64",
      "duo,heads=" + heads_path + ",retrieval=0.5,sinks=4,window=64,mode=continuous",
      "razor,heads=" + heads_path + ",retrieval=0.5,window=64", "quest,budget=128", "mikv,ratio=0.5", "mikv,ratio=0.5,mode=once",
      "kvmerger,ratio=0.5", "minicache", "think,lambda=0.5", "knorm,ratio=0.5", "random,ratio=0.5",
      "snapkv,ratio=0.5;policy=think,lambda=0.5", "h2o,ratio=0.5,mode=continuous", "tova,budget=160,mode=continuous"};

  std::vector<int32_t> prompt;
  for (int i = 0; i < 320; ++i) prompt.push_back(100 + (i * 7919) % (n_vocab - 200));

  // Runs `spec`: nullopt when refused up front (checked here), else the bytes the pool holds after
  // the prompt, Compress and 4 decode steps. Sets `demoted_page_bytes` (0 without a demotion codec).
  size_t demoted_page_bytes = 0;
  auto run = [&](const std::string& spec) -> std::optional<uint64_t> {
    SCOPED_TRACE(spec);
    engine::EngineOptions eo;
    eo.kv_spec = kv::ParseKVSpec(spec).value();
    eo.n_ctx = 512;
    auto engine = engine::Engine::Create(model->get(), &threads, eo);
    if (!engine.ok()) {
      const StatusCode code = engine.status().code();
      EXPECT_TRUE(code == StatusCode::kInvalidArgument || code == StatusCode::kUnimplemented)
          << engine.status().ToString();
      EXPECT_GT(engine.status().message().size(), 20u) << "a refusal says what is wrong";
      return std::nullopt;
    }
    auto session = (*engine)->NewSession();
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    if (!session.ok()) return std::nullopt;
    auto logits = (*session)->Feed(prompt);
    EXPECT_TRUE(logits.ok()) << logits.status().ToString();
    if (!logits.ok()) return std::nullopt;
    EXPECT_TRUE(AllFinite(*logits, n_vocab));
    const Status compressed = (*session)->Compress();
    EXPECT_TRUE(compressed.ok()) << compressed.ToString();
    for (int step = 0; step < 4; ++step) {
      int32_t next = 0;
      for (int v = 1; v < n_vocab; ++v) next = (*logits)[v] > (*logits)[next] ? v : next;
      logits = (*session)->Feed(std::vector<int32_t>{next});
      EXPECT_TRUE(logits.ok()) << logits.status().ToString();
      if (!logits.ok()) return std::nullopt;
      EXPECT_TRUE(AllFinite(*logits, n_vocab)) << "decode step " << step;
    }
    demoted_page_bytes = (*engine)->kv_manager().kv((*session)->id()).DemotedPageBytes();
    return (*engine)->kv_manager().BytesInUse();
  };
  const auto& config = (*model)->config();
  const int tables = config.n_layers * config.n_kv_heads;

  int ran = 0, refused = 0;
  for (const std::string& codec : codecs) {
    const std::optional<uint64_t> full = run(codec);
    ASSERT_TRUE(full.has_value()) << codec << " alone must run";
    const bool float_codec = codec == "codec=f16" || codec == "codec=f32";
    for (const std::string& policy : policies) {
      const std::string spec = codec + ";policy=" + policy;
      const std::optional<uint64_t> bytes = run(spec);
      if (!bytes.has_value()) {
        ++refused;
        EXPECT_FALSE(float_codec) << spec << ": every policy runs on " << codec;
        continue;
      }
      ++ran;
      if (policy.rfind("quest", 0) == 0) {
        EXPECT_EQ(*bytes, *full) << spec << ": Quest selects pages to read, it keeps them all";
      } else if (policy.rfind("mikv", 0) == 0 && !float_codec) {
        // MiKV moves entries to int2 pages instead of dropping them: on a quantized layer a demoted
        // entry saves little, and an eviction compacts what it grew (docs/kv-merging.md). What
        // compaction cannot win back is rounding: the last demoted page partly filled while the
        // pages its entries came from stay partly live. So at most one demoted page per table more
        // than the codec alone (at 320 tokens, kivi4 with page=64 is there: 5 pages a head).
        EXPECT_GT(demoted_page_bytes, 0u) << spec;
        EXPECT_LE(*bytes, *full + tables * demoted_page_bytes) << spec << ": demotion grew the cache";
      } else {
        EXPECT_LT(*bytes, *full) << spec << ": the policy freed nothing";
      }
    }
  }
  // Most combinations compose; the refusals are the documented ones (think and minicache on sealed or
  // quantized pages, mikv's int2 demotion on 2-bit layers, quest on pre-RoPE keys).
  EXPECT_GT(ran, 3 * refused) << ran << " ran, " << refused << " refused";
  RecordProperty("combinations_run", ran);
  RecordProperty("combinations_refused", refused);
}

}  // namespace
}  // namespace kvx
