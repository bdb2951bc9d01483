// The tier block format and the tiers on a 256-token block of the
// smollm2-135m KV shape (30 layers, 3 kv heads, head dim 64) in f16:
// 5.9 MB per block. BM_TierEncode / BM_TierDecode: the format alone
// (bytes_per_second = the block's bytes), without and with zstd;
// BM_TierImport: decode + LoadImage + KVManager::ImportSequence (what a
// hit costs before the pages are usable). BM_DiskTierPut / Get: a block
// file written (temp file + rename) and read back, page cache warm.
// BM_RedisTierPut / Get: against a redis-server of our own on loopback
// (skipped when redis-server is not installed). Encode/decode args: zstd,
// the storage level (0 lossless .. 3 low, 4 compact) and the shape (0 smollm2-135m, 1
// the recall model's: 8 layers, 2 kv heads, head dim 64, 1 MiB a block;
// random N(0, 1) KV, so sizes are not real KV's: scripts/storage_codec_report.py
// measures those). docs/tiers.md has the numbers and the command.
#include <benchmark/benchmark.h>

#include "kv/tier/block_format.h"
#include "kv/tier/disk_tier.h"
#include "kv/tier/redis_tier.h"
#include "kv/tier/tier_store.h"
#include "kv/tier/storage_transform.h"
#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

constexpr int kBlockTokens = 256;

struct Fixture {
  explicit Fixture(const KVLayout& layout) : m(testing::MakeManager("codec=f16", layout, 2 * kBlockTokens)) {}
  std::unique_ptr<KVManager> m;
  std::vector<int32_t> tokens = testing::Tokens(kBlockTokens);
  SeqId seq = *testing::FillSequence(*m, 0, tokens, 1);
  BlockSpace space = *MakeBlockSpace(m->spec(), 1, kBlockTokens);
  KVManager::SequenceImage image = *m->ExportSequence(seq);
  // The compact level's transform, calibrated on the block itself (random
  // KV: its timing, not its sizes, is what this measures).
  std::shared_ptr<const StorageTransform> transform = Calibrate();
  BlockRequest Request() const { return {&space, 0, tokens, 0, BlockKeys(space, 0, tokens)[0]}; }

 private:
  std::shared_ptr<const StorageTransform> Calibrate() {
    TransformCalibration calibration(m->spec().layout, m->spec().layers);
    if (!calibration.Add(image).ok()) return nullptr;
    space.transform = std::make_shared<const StorageTransform>(calibration.Finish().value());
    return space.transform;
  }
};
Fixture& Shared(int shape = 0) {
  static Fixture smollm2(testing::SmolLm2Layout()), recall(KVLayout{8, 2, 64, 16});
  return shape == 0 ? smollm2 : recall;
}

// Encode/decode args: zstd, storage level, shape.
BlockEncodeOptions Options(const benchmark::State& state) {
  return {.compress = state.range(0) != 0, .level = static_cast<StorageLevel>(state.range(1))};
}
void CodecArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"zstd", "level", "recall"});
  b->Args({0, 0, 0})->Args({1, 0, 0})->Args({1, 0, 1});
  for (int level = 1; level <= 4; ++level) b->Args({1, level, 1});
}

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

void BM_TierEncode(benchmark::State& state) {
  Fixture& f = Shared(static_cast<int>(state.range(2)));
  size_t bytes = 0;
  for (auto _ : state) {
    auto e = EncodeBlock(f.space, 0, f.image, 0, Options(state));
    bytes = e->bytes.size();
    benchmark::DoNotOptimize(e->bytes.data());
  }
  state.counters["stored_MB"] = static_cast<double>(bytes) / 1e6;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_TierEncode)->Apply(CodecArgs)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TierDecode(benchmark::State& state) {
  Fixture& f = Shared(static_cast<int>(state.range(2)));
  const std::string bytes = EncodeBlock(f.space, 0, f.image, 0, Options(state))->bytes;
  BlockRequest request = f.Request();
  request.accepts = StorageLevel::kCompact;  // any level
  for (auto _ : state) {
    auto d = DecodeBlock(Bytes(bytes), request);
    if (!d.ok()) state.SkipWithError(d.status().ToString().c_str());
    benchmark::DoNotOptimize(d->payload.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_TierDecode)->Apply(CodecArgs)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TierImport(benchmark::State& state) {
  Fixture& f = Shared();
  const std::string bytes = EncodeBlock(f.space, 0, f.image, 0)->bytes;
  for (auto _ : state) {
    TierLoad load;
    load.blocks.push_back(*DecodeBlock(Bytes(bytes), f.Request()));
    auto image = LoadImage(load, load.blocks[0].tokens, f.space, 0);
    auto seq = f.m->ImportSequence(*image);
    if (!seq.ok()) state.SkipWithError(seq.status().ToString().c_str());
    f.m->ReleaseSequence(*seq);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_TierImport)->Unit(benchmark::kMillisecond)->UseRealTime();

// Put (range 1) or Get (range 0) of the block on `tier`.
void PutGet(benchmark::State& state, Tier& tier) {
  Fixture& f = Shared();
  const EncodedBlock block = *EncodeBlock(f.space, 0, f.image, 0);
  if (!tier.Put(block.key, block.bytes).ok()) state.SkipWithError("the first Put failed");
  for (auto _ : state) {
    if (state.range(0) != 0) {
      if (!tier.Put(block.key, block.bytes).ok()) state.SkipWithError("Put failed");
    } else if (!tier.Get(block.key).has_value()) {
      state.SkipWithError("Get missed");
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(block.bytes.size()));
}

void BM_DiskTier(benchmark::State& state) {
  testing::TempDir dir;
  auto tier = DiskTier::Open({.dir = dir.path(), .max_bytes = 1ull << 30});
  PutGet(state, **tier);
}
BENCHMARK(BM_DiskTier)->ArgName("put")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RedisTier(benchmark::State& state) {
  if (testing::FindRedisServer().empty()) return state.SkipWithError("redis-server is not installed");
  testing::RedisServer server;
  if (!server.Start()) return state.SkipWithError("redis-server did not start");
  auto tier = RedisTier::Open({.url = server.url(), .command_timeout_ms = 5000});
  PutGet(state, **tier);
}
BENCHMARK(BM_RedisTier)->ArgName("put")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace kvx::kv::tier
