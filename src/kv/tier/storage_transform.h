// The storage transform of the `compact` storage level (docs/tiers.md#the-compact-level):
// after KVTC (NVIDIA, "KV cache transform coding"), each (layer, kv head)
// table's K and V are decorrelated by a PCA computed once per model from
// calibration KV, and each principal component gets its own bit width by
// its variance (reverse water-filling: a component whose variance is below
// what the bits buy elsewhere gets 0 bits and is dropped).
//
// A transform holds, per table and K/V: the calibration mean (head_dim),
// an orthonormal basis (head_dim x head_dim, one component a row, by
// decreasing variance), the components' variances, and the bit widths the
// allocation gave each component at the level's rate. Its digest covers all
// of it: the block header records the digest of the transform that coded
// it, and a reader with another transform (another model, another
// calibration) takes the block as a miss, never decodes it with the wrong
// basis.
//
// Each component of a block is quantized on a grid centred on the block's
// mean of that component, with the step that minimizes the mean squared
// error of a uniform quantizer of a Gaussian of the block's spread at its
// bit width (Max, 1960): |error| <= step / 2 inside the grid's 2^bits steps,
// the distance to the grid's end beyond it (QuantizeComponent).
//
// Thread-safety: a transform is immutable once built; functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/codec/codec_config.h"
#include "kv/kv_manager.h"
#include "util/byte_io.h"
#include "util/status.h"

namespace kvx::kv::tier {

// The average bits per value the allocation spends in each tensor: the
// first third of the layers and the rest, K and V.
struct CompactRates {
  double k_early = 0, v_early = 0, k_late = 0, v_late = 0;
};
// The compact level's rates, chosen by measurement on the recall model
// (docs/tiers.md#the-compact-level: the later layers and their values are
// the sensitive ones). A transform file keeps the bits of the rates it was
// calibrated at: a new default changes new calibrations only.
CompactRates DefaultCompactRates();
// "K_EARLY,V_EARLY,K_LATE,V_LATE" (as `--rates` / `--storage-rates` take
// them): four numbers in [0, kMaxComponentBits]. InvalidArgument naming
// what is wrong otherwise. The rates give the bit widths, which the
// transform's digest covers: a transform of other rates never decodes
// another's blocks.
Result<CompactRates> ParseCompactRates(std::string_view text);
std::string FormatCompactRates(const CompactRates& rates);

// The most bits one component may get.
inline constexpr int kMaxComponentBits = 8;

// One tensor's (K or V of one table) decorrelation and bit widths.
struct TensorTransform {
  std::vector<float> mean;      // [d]
  std::vector<float> basis;     // [d][d]: row c is component c
  std::vector<float> variance;  // [d], decreasing
  std::vector<uint8_t> bits;    // [d], 0..kMaxComponentBits
};

class StorageTransform {
 public:
  int head_dim() const { return head_dim_; }
  int tables() const { return static_cast<int>(tensors_.size() / 2); }
  // kv: 0 keys, 1 values.
  const TensorTransform& tensor(int table, int kv) const { return tensors_[static_cast<size_t>(table) * 2 + kv]; }
  uint64_t digest() const { return digest_; }

  // A transform from its tensors (a transform file's, storage_transform_file.h):
  // [tables][2] tensors of head_dim components each. InvalidArgument for
  // sizes that disagree or bit widths beyond kMaxComponentBits.
  static Result<StorageTransform> FromTensors(int head_dim, std::vector<TensorTransform> tensors);

 private:
  friend class TransformCalibration;
  int head_dim_ = 0;
  std::vector<TensorTransform> tensors_;  // [tables][2]
  uint64_t digest_ = 0;
};

// Builds a transform from calibration KV: sequences of one layout added one
// at a time (their full pages only, decoded from `layers`' codecs), then the
// PCA of each tensor's covariance and the bit allocation at `rates`.
class TransformCalibration {
 public:
  TransformCalibration(const KVLayout& layout, std::vector<LayerCodec> layers);
  // InvalidArgument when a layer does not hold float pages (the compact
  // level codes f16/f32 pools only) or the image has another layout.
  Status Add(const KVManager::SequenceImage& image);
  // InvalidArgument when fewer than 2 * head_dim tokens were added.
  Result<StorageTransform> Finish(const CompactRates& rates = DefaultCompactRates()) const;

 private:
  KVLayout layout_;
  std::vector<LayerCodec> layers_;
  std::vector<std::vector<double>> sum_, cross_;  // [tables * 2]: sum of x, upper triangle of sum of x x^T
  int64_t tokens_ = 0;                            // per tensor
};

// The bit widths of components of `variance` (decreasing or not) for an
// average of `rate` bits a component: greedy reverse water-filling on the
// Gaussian distortion of each width (optimal: the distortion's decrease per
// bit shrinks with every bit).
std::vector<uint8_t> AllocateBits(std::span<const float> variance, double rate);

// Writes x ([tokens][d] floats) through `t`: per component with bits > 0 its
// grid (f16 centre, f16 step), then every such component's symbols
// (component-major, `bits` each, LSB first, one bit stream padded to a byte).
// False (nothing written) when a value is not finite or the grid overflows
// f16: the caller stores the pages byte for byte.
bool EncodeTransformed(const TensorTransform& t, const float* x, int tokens, ByteWriter* out);
// Reads it back into x ([tokens][d]). DataLoss for bytes EncodeTransformed
// could not have written.
Status DecodeTransformed(const TensorTransform& t, ByteReader& in, int tokens, float* x);

// The component values of x ([tokens][d]) under t: z[j][c] = basis_c . (x_j - mean).
std::vector<float> Project(const TensorTransform& t, const float* x, int tokens);

// The step of a `bits`-bit grid for a component of spread `sigma`.
float GridStep(int bits, float sigma);

}  // namespace kvx::kv::tier
