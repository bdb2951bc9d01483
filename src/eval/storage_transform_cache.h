// Where a server's `compact` storage level gets its transform
// (docs/tiers.md#the-compact-level): the file `--storage-transform` names;
// else the transform cached for this model and KV spec in kvx tune's cache
// directory (eval/tune_cache.h: `kvx calibrate-storage` writes it there by
// default, and a server that calibrated stores it there); else calibrated
// now on a text bundled in the binary (the first 60 KB of the Jargon File:
// no eval task's text) and stored in the cache for the next start.
//
// Thread-safety: none; the engine is used before it serves.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "kv/tier/storage_transform.h"
#include "kv/tier/storage_transform_file.h"
#include "util/status.h"

namespace kvx::eval {

// The calibration's default amount: tokens of the text, fed in chunks of at
// most this many tokens (the chunks of `kvx eval --storage-codec compact`'s
// measurements, scripts/storage_codec_report.py, so a server's transform
// from the bundled text is the one measured there).
inline constexpr int kStorageCalibTokens = 8192;
inline constexpr int kStorageCalibChunk = 2048;

// The bundled calibration text (generated from src/eval/storage_calib_text.txt).
std::string_view BundledCalibrationText();

// The transform's file name in the cache directory:
// "<model fingerprint>-storage-<spec fingerprint>.kvxt" (16 hex digits each).
std::string StorageTransformCacheName(const kv::tier::TransformIdentity& identity);

// Calibrates a transform for `engine`'s spec on `text` (its first
// kStorageCalibTokens tokens, in chunks of min(kStorageCalibChunk, the
// engine's context)) at `rates`.
Result<std::shared_ptr<const kv::tier::StorageTransform>> CalibrateStorageOnText(
    engine::Engine& engine, std::string text, const kv::tier::CompactRates& rates = kv::tier::DefaultCompactRates());

// The transform for `engine`'s pool, which `identity` describes: from
// `file` if not empty (its errors are the caller's: a missing, damaged or
// other-model file is refused), else from `cache_dir` (TuneCacheDir(); a
// damaged cached file is calibrated again), else calibrated on the bundled
// text and stored in `cache_dir` (when not empty). `log` gets one line
// saying which, and how long a calibration took.
Result<std::shared_ptr<const kv::tier::StorageTransform>> FindOrCalibrateStorageTransform(
    engine::Engine& engine, const kv::tier::TransformIdentity& identity, const std::string& file,
    const std::string& cache_dir, const std::function<void(const std::string&)>& log);

}  // namespace kvx::eval
