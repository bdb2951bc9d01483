// The KV's trip through the tiers' storage codec, as `kvx eval
// --storage-codec` measures it (docs/tiers.md#the-storage-codec): a
// session's context leaves the pool as tier blocks at a storage level and
// comes back as a tier hit would load it; and the `compact` level's
// storage transform calibrated on an engine's own KV (the text, the
// tokens), which `kvx calibrate-storage` and the servers' start-up use too.
//
// Thread-safety: none; each function uses the engine it is given.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"
#include "kv/tier/storage_codec.h"
#include "kv/tier/storage_transform.h"
#include "model/model.h"
#include "util/status.h"

namespace kvx::eval {

// The tokens a tier block holds in a trip (--cache-block's default).
inline constexpr int kStorageBlockTokens = 256;

// What one run's context went through on its way through the storage codec.
struct StorageTrip {
  kv::tier::StorageLevel level = kv::tier::StorageLevel::kLossless;
  std::shared_ptr<const kv::tier::StorageTransform> transform;  // compact
  uint64_t bytes = 0;  // the stored blocks' bytes
  int64_t tokens = 0;  // the tokens they hold
};

// The full blocks of `session`'s context leave the pool through the tier
// block format at trip->level and come back as a tier hit loads them
// (EncodeBlock, DecodeBlock, LoadImage, ImportSequence, as the scheduler
// does); the rest of the context is fed again, as after a hit. Returns the
// session that holds the result (`session` is reset). InvalidArgument when
// the context holds no full block.
Result<std::unique_ptr<engine::Session>> ThroughStorage(engine::Session& session, std::span<const int32_t> context,
                                                        StorageTrip* trip);

// A calibration text's first `max_tokens` tokens (without BOS).
Result<std::vector<int32_t>> TokenizeCalibrationText(const model::Model& model, std::string text, int max_tokens);

// The compact level's transform for `engine`'s spec: the PCA of the KV its
// pool holds for `tokens`, fed in chunks of `chunk` tokens from an empty
// cache (BOS first), as an eval's own chunks are, with bits at `rates`.
// InvalidArgument for a quantized pool or too few tokens
// (storage_transform.h).
Result<std::shared_ptr<const kv::tier::StorageTransform>> CalibrateStorage(
    engine::Engine& engine, std::span<const int32_t> tokens, int chunk,
    const kv::tier::CompactRates& rates = kv::tier::DefaultCompactRates());

}  // namespace kvx::eval
