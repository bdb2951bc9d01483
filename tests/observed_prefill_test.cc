// Column sums on the real recall model (kv/attention.h, WantsColumnSums):
// an H2O and a SnapKV compression after a prompt keep the same tokens
// whether the prompt's attention reaches the policy as column sums from the
// kernels' tiles or row by row (ColumnSumsAllowed(false), the reference
// path). ~5 s on 2 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"
#include "kv/attention.h"
#include "kv/kv_spec.h"
#include "model/model.h"
#include "support/test_data.h"

namespace kvx {
namespace {

// The positions every (layer, kv head) holds after prefilling `tokens` and
// compressing once.
std::vector<std::vector<int32_t>> KeptAfterCompression(const model::Model& model, ThreadPool* threads,
                                                       const std::string& spec, const std::vector<int32_t>& tokens) {
  engine::EngineOptions eo;
  eo.n_ctx = 1024;
  auto parsed = kv::ParseKVSpec(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  eo.kv_spec = *parsed;
  auto engine = engine::Engine::Create(&model, threads, eo);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  auto session = (*engine)->NewSession();
  EXPECT_TRUE(session.ok());
  EXPECT_TRUE((*session)->Feed(tokens).ok());
  EXPECT_TRUE((*session)->Compress().ok());
  const kv::SequenceKV& kv = (*session)->kv();
  const kv::KVLayout& L = kv.layout();
  std::vector<std::vector<int32_t>> kept;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const kv::PageTable& t = kv.table(l, h);
      std::vector<int32_t> live;
      for (int s = 0; s < t.length(); ++s) {
        const int32_t p = kv::PagePositions(kv.pool().PageData(t.pages()[s / L.page_tokens]))[s % L.page_tokens];
        if (p != kv::kDeadPosition) live.push_back(p);
      }
      kept.push_back(live);
    }
  }
  return kept;
}

TEST(ObservedPrefillTest, ColumnSumsKeepTheTokensThePerRowPathKeeps) {
  KVX_REQUIRE_SHARED();
  auto model = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  std::ifstream in(testing::SharedPath("golden/recall_val.txt"));
  std::string text(4000, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && static_cast<unsigned char>(text.back()) >= 0x80) text.pop_back();  // no cut character
  auto encoded = (*model)->tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  std::vector<int32_t> tokens = *encoded;
  tokens.resize(std::min<size_t>(tokens.size(), 500));
  ASSERT_GE(tokens.size(), 400u);
  for (const std::string spec : {"codec=f16;policy=h2o,ratio=0.5,mode=once", "codec=f16;policy=snapkv,ratio=0.5",
                                 "codec=int8;policy=h2o,ratio=0.3,mode=once"}) {
    SCOPED_TRACE(spec);
    const auto columns = KeptAfterCompression(**model, &threads, spec, tokens);
    kv::ColumnSumsAllowed().store(false);
    const auto rows = KeptAfterCompression(**model, &threads, spec, tokens);
    kv::ColumnSumsAllowed().store(true);
    ASSERT_EQ(columns.size(), rows.size());
    size_t differ = 0, total = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_LT(rows[i].size(), tokens.size()) << "nothing was evicted";
      total += rows[i].size();
      differ += columns[i] != rows[i];
    }
    EXPECT_EQ(differ, 0u) << "of " << rows.size() << " (layer, kv head) chains holding " << total << " tokens";
  }
}

}  // namespace
}  // namespace kvx
