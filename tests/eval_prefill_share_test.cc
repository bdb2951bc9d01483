// kvx eval's prefill cache (eval/prefill_cache.h) on the real recall model:
// a report run with it equals, field for field, the report of the same run
// where every spec prefills every prompt itself, in both compression
// moments; the specs whose policies allow it really took their prefill from
// another spec, and those whose policies depend on the whole prompt (H2O's
// sums) or that first ran a codec did not.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "eval/eval.h"
#include "eval/report.h"
#include "model/model.h"
#include "support/test_data.h"

namespace kvx {
namespace {

// The report without what may differ: timings and the reuse counts.
nlohmann::json Comparable(const eval::EvalReport& report) {
  nlohmann::json j = eval::ReportToJson(report);
  j.erase("created_utc");
  for (nlohmann::json& r : j.at("results")) {
    r.erase("seconds");
    r.erase("prefill_reused");
    for (auto& [task, value] : r.items()) {
      if (value.is_object()) value.erase("seconds");
    }
  }
  return j;
}

TEST(EvalPrefillShareTest, ReportsAreTheSameWithAndWithoutTheSharedPrefill) {
  KVX_REQUIRE_SHARED();
  auto model = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPasskey, eval::Task::kNiahMultikey};
  o.baseline = "codec=f16";
  // Shared: think (a ring of queries) and quest (nothing observed) take the
  // baseline's prefill; int4+snapkv takes int4+tova's and kivi2+tova
  // kivi2+snapkv's (column sums: the same arithmetic whatever the window).
  // Not shared: h2o (sums over every query), the first spec of each codec,
  // and the first column-sum spec of each codec: an observer changes a
  // prompt call's arithmetic (kv::ObserverParticipation), so snapkv and tova
  // do not take the prefill of their codec's spec without a policy. (With
  // it, tova on the default, rotated int4 kept other entries than with its
  // own prefill.) A continuous policy is not shared either: PrefillCacheTest
  // pins which.
  o.specs = {"codec=f16;policy=snapkv,ratio=0.5", "codec=f16;policy=think,lambda=0.5", "codec=f16;policy=quest,budget=256",
             "codec=f16;policy=h2o,ratio=0.5,mode=once", "codec=int4", "codec=int4;policy=tova,ratio=0.5,mode=once",
             "codec=int4;policy=snapkv,ratio=0.5",
             // KIVI with pre-RoPE keys: sealed pages and f16 staging pages in the copy
             "codec=kivi2,page=32,prerope=1,sinks=1;policy=snapkv,ratio=0.75",
             "codec=kivi2,page=32,prerope=1,sinks=1;policy=tova,ratio=0.5,mode=once"};
  const std::vector<bool> reused = {false, false, true, true, false, false, false, true, false, true};
  o.n_ctx = 1536;
  o.n_batch = 256;  // 6 calls a prompt: 4 of them shared
  o.lengths = {1536};
  o.depths = {0.5};
  o.passkey_trials = 1;
  o.ruler_trials = 1;
  o.data_dir = testing::SharedPath("data");  // niah's essays (ctest runs in the build folder)
  for (const std::string compress : {"excluded", "included"}) {
    SCOPED_TRACE(compress);
    o.compress = compress;
    o.prefill_cache_mib = 0;
    auto alone = eval::RunEval(**model, &threads, o, {});
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    o.prefill_cache_mib = 256;
    auto shared = eval::RunEval(**model, &threads, o, {});
    ASSERT_TRUE(shared.ok()) << shared.status().ToString();
    ASSERT_EQ(shared->specs.size(), reused.size());
    for (size_t r = 0; r < reused.size(); ++r) {
      EXPECT_EQ(alone->specs[r].prefill_reused, 0) << shared->specs[r].spec;
      // Whole calls of 256 tokens (about 1500-token prompts: 4 of their 6 calls, two prompts).
      if (reused[r]) {
        EXPECT_GE(shared->specs[r].prefill_reused, 2 * 3 * 256) << shared->specs[r].spec;
        EXPECT_EQ(shared->specs[r].prefill_reused % 256, 0) << shared->specs[r].spec;
      } else {
        EXPECT_EQ(shared->specs[r].prefill_reused, 0) << shared->specs[r].spec;
      }
    }
    EXPECT_EQ(Comparable(*shared), Comparable(*alone));
    // The comparison sees what the policies did: they are not all alike.
    EXPECT_NE(shared->specs[1].kv.peak_bytes, shared->specs[0].kv.peak_bytes);
  }
}

}  // namespace
}  // namespace kvx
