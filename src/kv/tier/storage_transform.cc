#include "kv/tier/storage_transform.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/tier/storage_codec.h"
#include "util/fp16.h"

// LAPACK's symmetric eigensolver (Debian's liblapack; gfortran passes the
// lengths of character arguments after the others).
extern "C" void dsyev_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                       double* work, const int* lwork, int* info, size_t jobz_len, size_t uplo_len);

namespace kvx::kv::tier {
namespace {

// The MSE-optimal step of a uniform quantizer of a unit Gaussian with 2^b
// levels, and its mean squared error (Max, "Quantizing for minimum
// distortion", 1960, table II), b = 0..8 (0: the mean alone).
constexpr float kGaussStep[kMaxComponentBits + 1] = {0.0f,    1.596f,  0.9957f, 0.5860f, 0.3352f,
                                                     0.1881f, 0.1041f, 0.0569f, 0.0308f};
constexpr double kGaussDistortion[kMaxComponentBits + 1] = {1.0,      0.3634,   0.1188,    0.03744,   0.01154,
                                                            0.003490, 0.001035, 0.0003027, 0.00008738};

// The largest magnitude a grid's f16 centre and step may hold (f16's
// largest finite value is 65504).
constexpr float kMaxGridValue = 60000.0f;

// Eigenvectors of the symmetric d x d matrix `cov` (row-major), as rows,
// by decreasing eigenvalue; the eigenvalues (clamped at 0) in `values`.
Status Eigen(std::vector<double> cov, int d, std::vector<float>* rows, std::vector<float>* values) {
  std::vector<double> w(d);
  int info = 0, lwork = -1;
  double query = 0;
  dsyev_("V", "U", &d, cov.data(), &d, w.data(), &query, &lwork, &info, 1, 1);
  lwork = std::max(1, static_cast<int>(query));
  std::vector<double> work(lwork);
  dsyev_("V", "U", &d, cov.data(), &d, w.data(), work.data(), &lwork, &info, 1, 1);
  if (info != 0) return Internal("the storage transform's eigensolver failed (LAPACK dsyev info " + std::to_string(info) + ")");
  rows->assign(static_cast<size_t>(d) * d, 0.0f);
  values->assign(d, 0.0f);
  for (int c = 0; c < d; ++c) {
    const int src = d - 1 - c;  // dsyev: ascending eigenvalues, eigenvector i in column i (= row i of a symmetric layout)
    (*values)[c] = static_cast<float>(std::max(0.0, w[src]));
    for (int i = 0; i < d; ++i) (*rows)[static_cast<size_t>(c) * d + i] = static_cast<float>(cov[static_cast<size_t>(src) * d + i]);
  }
  return Status::Ok();
}

// Symbols of a tensor's components, `bits` each, LSB first in one stream.
class BitWriter {
 public:
  void Put(uint32_t v, int bits) {
    acc_ |= static_cast<uint64_t>(v) << used_;
    used_ += bits;
    while (used_ >= 8) {
      bytes_.push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  std::vector<uint8_t>& Finish() {
    if (used_ > 0) bytes_.push_back(static_cast<uint8_t>(acc_));
    acc_ = 0, used_ = 0;
    return bytes_;
  }

 private:
  std::vector<uint8_t> bytes_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> in) : in_(in) {}
  uint32_t Get(int bits) {
    while (used_ < bits) {
      acc_ |= static_cast<uint64_t>(in_[at_++]) << used_;
      used_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((1u << bits) - 1));
    acc_ >>= bits;
    used_ -= bits;
    return v;
  }
  bool PaddingIsZero() const { return acc_ == 0 && at_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
  uint64_t acc_ = 0;
  int used_ = 0;
};

uint64_t Digest(int head_dim, const std::vector<TensorTransform>& tensors) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, "kvx-storage-transform-v1", 24);
  XXH3_64bits_update(st, &head_dim, sizeof head_dim);
  for (const TensorTransform& t : tensors) {
    XXH3_64bits_update(st, t.mean.data(), t.mean.size() * sizeof(float));
    XXH3_64bits_update(st, t.basis.data(), t.basis.size() * sizeof(float));
    XXH3_64bits_update(st, t.variance.data(), t.variance.size() * sizeof(float));
    XXH3_64bits_update(st, t.bits.data(), t.bits.size());
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// The squared error of component c's tokens on the grid of `levels`
// points `step` apart centred on `centre`.
double GridError(const std::vector<float>& z, size_t d, size_t c, int tokens, int levels, float centre, float step) {
  double err = 0;
  for (int j = 0; j < tokens; ++j) {
    const float u = (z[j * d + c] - centre) / step;
    const int q = std::clamp(static_cast<int>(std::floor(u + 0.5f * static_cast<float>(levels))), 0, levels - 1);
    const double e = z[j * d + c] - (centre + (static_cast<float>(q) - 0.5f * static_cast<float>(levels - 1)) * step);
    err += e * e;
  }
  return err;
}

// The step of component c's grid at `bits`, centred on its mean over the
// block (returned in *mean): of kStepCandidates steps from the Gaussian's
// optimum (what a bell-shaped component wants) up to the step whose grid
// covers every token (what a component with outliers, e.g. the attention
// sink's, may want), the one with the least squared error on these tokens.
float BestStep(const std::vector<float>& z, size_t d, size_t c, int tokens, int bits, double* mean) {
  constexpr int kStepCandidates = 8;
  double sum = 0, sq = 0, far = 0;
  for (int j = 0; j < tokens; ++j) sum += z[j * d + c];
  *mean = sum / tokens;
  const float centre = Fp16ToFloat(FloatToFp16(static_cast<float>(*mean)));
  for (int j = 0; j < tokens; ++j) {
    const double e = z[j * d + c] - centre;
    sq += e * e;
    far = std::max(far, std::fabs(e));
  }
  const int levels = 1 << bits;
  const float gauss = GridStep(bits, static_cast<float>(std::sqrt(sq / tokens)));
  const float cover = static_cast<float>(2.0 * far / levels);
  if (!(gauss > 0) || cover <= gauss) return std::max(gauss, cover);
  float best = gauss;
  double best_err = GridError(z, d, c, tokens, levels, centre, gauss);
  for (int k = 1; k < kStepCandidates; ++k) {
    const float step = gauss * std::pow(cover / gauss, static_cast<float>(k) / (kStepCandidates - 1));
    const double err = GridError(z, d, c, tokens, levels, centre, step);
    if (err < best_err) best = step, best_err = err;
  }
  return best;
}

// Calls fn(component, bits, centre, step) for each coded component of t (bits
// > 0) with its grid, in order (`grid`: f16 centre and step of each); false
// as soon as fn is.
template <class Fn>
bool ForEachGrid(const TensorTransform& t, const std::vector<uint16_t>& grid, Fn fn) {
  size_t g = 0;
  for (size_t c = 0; c < t.bits.size(); ++c) {
    if (t.bits[c] == 0) continue;
    if (!fn(c, t.bits[c], Fp16ToFloat(grid[g]), Fp16ToFloat(grid[g + 1]))) return false;
    g += 2;
  }
  return true;
}

}  // namespace

// The first third of the layers costs the needle nothing measurable at
// (almost) no bits; their bits go to the later layers' values, where the
// needle is lost (docs/tiers.md#measurements: the rate probes).
CompactRates DefaultCompactRates() { return {.k_early = 0, .v_early = 0.125, .k_late = 1.75, .v_late = 3.125}; }

Result<CompactRates> ParseCompactRates(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("compact rates '" + std::string(text) + "': " + why +
                           " (give K_EARLY,V_EARLY,K_LATE,V_LATE, average bits a value, e.g. " +
                           FormatCompactRates(DefaultCompactRates()) + ")");
  };
  if (std::count(text.begin(), text.end(), ',') != 3) return bad("four numbers are needed");
  double values[4] = {};
  size_t start = 0;
  for (double& value : values) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      return bad("'" + std::string(item) + "' is not a number");
    }
    if (!(value >= 0 && value <= kMaxComponentBits)) {
      return bad("each rate is in [0, " + std::to_string(kMaxComponentBits) + "]");
    }
    start = comma + 1;
  }
  return CompactRates{.k_early = values[0], .v_early = values[1], .k_late = values[2], .v_late = values[3]};
}

std::string FormatCompactRates(const CompactRates& r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%g,%g,%g,%g", r.k_early, r.v_early, r.k_late, r.v_late);
  return buf;
}

float GridStep(int bits, float sigma) { return kGaussStep[bits] * sigma; }

std::vector<uint8_t> AllocateBits(std::span<const float> variance, double rate) {
  const size_t d = variance.size();
  std::vector<uint8_t> bits(d, 0);
  const long budget = std::lround(std::clamp(rate, 0.0, static_cast<double>(kMaxComponentBits)) * static_cast<double>(d));
  for (long spent = 0; spent < budget; ++spent) {
    size_t best = d;
    double best_gain = 0;
    for (size_t c = 0; c < d; ++c) {
      if (bits[c] >= kMaxComponentBits) continue;
      const double gain = variance[c] * (kGaussDistortion[bits[c]] - kGaussDistortion[bits[c] + 1]);
      if (best == d || gain > best_gain) best = c, best_gain = gain;
    }
    if (best == d) break;
    ++bits[best];
  }
  return bits;
}

TransformCalibration::TransformCalibration(const KVLayout& layout, std::vector<LayerCodec> layers)
    : layout_(layout), layers_(std::move(layers)) {
  const size_t n = static_cast<size_t>(layout.n_layers) * layout.n_kv_heads * 2, d = static_cast<size_t>(layout.head_dim);
  sum_.assign(n, std::vector<double>(d, 0.0));
  cross_.assign(n, std::vector<double>(d * d, 0.0));
}

Status TransformCalibration::Add(const KVManager::SequenceImage& image) {
  const int d = layout_.head_dim, T = layout_.page_tokens;
  const size_t n_tables = static_cast<size_t>(layout_.n_layers) * layout_.n_kv_heads;
  if (layers_.size() != static_cast<size_t>(layout_.n_layers) || image.tables.size() != n_tables) {
    return InvalidArgument("a calibration sequence does not have the layout " + layout_.ToString());
  }
  size_t tokens = 0;
  for (size_t t = 0; t < n_tables; ++t) {
    const LayerCodec& lc = layers_[t / layout_.n_kv_heads];
    if (!HoldsFloatPages(lc)) {
      return InvalidArgument("the compact storage level codes f16 and f32 pools only (quantized pages stay byte for byte)");
    }
    const SequenceKV::TableImage& ti = image.tables[t];
    const size_t pages = std::min(ti.pages.size(), static_cast<size_t>(ti.length / T));
    const std::vector<float> x = TableFloats(lc, std::span(ti.pages).first(pages), std::span(ti.full).first(pages));
    tokens = pages * T;
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<double>& sum = sum_[t * 2 + kv];
      std::vector<double>& cross = cross_[t * 2 + kv];
      for (size_t j = 0; j < tokens; ++j) {
        const float* row = &x[(kv * tokens + j) * d];
        for (int a = 0; a < d; ++a) {
          sum[a] += row[a];
          for (int b = a; b < d; ++b) cross[static_cast<size_t>(a) * d + b] += static_cast<double>(row[a]) * row[b];
        }
      }
    }
  }
  tokens_ += static_cast<int64_t>(tokens);
  return Status::Ok();
}

Result<StorageTransform> TransformCalibration::Finish(const CompactRates& rates) const {
  const int d = layout_.head_dim;
  if (tokens_ < 2 * d) {
    return InvalidArgument("the storage transform needs at least " + std::to_string(2 * d) +
                           " calibration tokens (got " + std::to_string(tokens_) + ")");
  }
  const double n = static_cast<double>(tokens_);
  StorageTransform out;
  out.head_dim_ = d;
  out.tensors_.resize(sum_.size());
  for (size_t i = 0; i < sum_.size(); ++i) {
    const int layer = static_cast<int>(i / 2 / layout_.n_kv_heads);
    const bool early = 3 * layer < layout_.n_layers, keys = i % 2 == 0;
    TensorTransform& tt = out.tensors_[i];
    tt.mean.resize(d);
    for (int a = 0; a < d; ++a) tt.mean[a] = static_cast<float>(sum_[i][a] / n);
    std::vector<double> cov(static_cast<size_t>(d) * d);
    for (int a = 0; a < d; ++a) {
      for (int b = a; b < d; ++b) {
        const double c = cross_[i][static_cast<size_t>(a) * d + b] / n - sum_[i][a] / n * (sum_[i][b] / n);
        cov[static_cast<size_t>(a) * d + b] = cov[static_cast<size_t>(b) * d + a] = c;
      }
    }
    KVX_RETURN_IF_ERROR(Eigen(std::move(cov), d, &tt.basis, &tt.variance));
    tt.bits = AllocateBits(tt.variance, keys ? (early ? rates.k_early : rates.k_late) : (early ? rates.v_early : rates.v_late));
    // A table of no coded component would be an empty coded table, which
    // the block format reads as damage: refuse such rates here.
    const auto none = [](const TensorTransform& t) { return std::all_of(t.bits.begin(), t.bits.end(), [](uint8_t b) { return b == 0; }); };
    if (!keys && none(tt) && none(out.tensors_[i - 1])) {
      return InvalidArgument("compact rates " + FormatCompactRates(rates) + " give layer " + std::to_string(layer) +
                             "'s keys and values no bit at all: raise " + (early ? "K_EARLY or V_EARLY" : "K_LATE or V_LATE") +
                             " (at least 1 / " + std::to_string(2 * d) + " bit a value)");
    }
  }
  out.digest_ = Digest(d, out.tensors_);
  return out;
}

Result<StorageTransform> StorageTransform::FromTensors(int head_dim, std::vector<TensorTransform> tensors) {
  const size_t d = static_cast<size_t>(head_dim);
  if (head_dim <= 0 || tensors.empty() || tensors.size() % 2 != 0) {
    return InvalidArgument("a storage transform needs a positive head dim and K and V tensors for every table");
  }
  for (const TensorTransform& t : tensors) {
    const bool bits_ok = std::all_of(t.bits.begin(), t.bits.end(), [](uint8_t b) { return b <= kMaxComponentBits; });
    if (t.mean.size() != d || t.basis.size() != d * d || t.variance.size() != d || t.bits.size() != d || !bits_ok) {
      return InvalidArgument("a storage transform tensor does not have head dim " + std::to_string(head_dim) +
                             " (mean, basis, variances, bit widths of at most " + std::to_string(kMaxComponentBits) + ")");
    }
  }
  StorageTransform out;
  out.head_dim_ = head_dim;
  out.tensors_ = std::move(tensors);
  out.digest_ = Digest(head_dim, out.tensors_);
  return out;
}

std::vector<float> Project(const TensorTransform& t, const float* x, int tokens) {
  const size_t d = t.mean.size();
  std::vector<float> z(static_cast<size_t>(tokens) * d), centred(d);
  for (int j = 0; j < tokens; ++j) {
    for (size_t i = 0; i < d; ++i) centred[i] = x[j * d + i] - t.mean[i];
    for (size_t c = 0; c < d; ++c) {
      const float* row = &t.basis[c * d];
      float acc = 0;
      for (size_t i = 0; i < d; ++i) acc += row[i] * centred[i];
      z[j * d + c] = acc;
    }
  }
  return z;
}

bool EncodeTransformed(const TensorTransform& t, const float* x, int tokens, ByteWriter* out) {
  const size_t d = t.mean.size();
  for (size_t i = 0; i < static_cast<size_t>(tokens) * d; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  const std::vector<float> z = Project(t, x, tokens);
  std::vector<uint16_t> grid;  // centre, step per coded component
  for (size_t c = 0; c < d; ++c) {
    if (t.bits[c] == 0) continue;
    double mean = 0;
    const float step = BestStep(z, d, c, tokens, t.bits[c], &mean);
    if (std::fabs(mean) > kMaxGridValue || step > kMaxGridValue) return false;
    grid.push_back(FloatToFp16(static_cast<float>(mean)));
    grid.push_back(FloatToFp16(step));
  }
  out->Bytes(grid.data(), grid.size() * sizeof(uint16_t));
  BitWriter w;
  ForEachGrid(t, grid, [&](size_t c, int bits, float centre, float step) {
    const int levels = 1 << bits;
    for (int j = 0; j < tokens; ++j) {
      const float u = step > 0 ? (z[j * d + c] - centre) / step : 0.0f;
      const int q = std::clamp(static_cast<int>(std::floor(u + 0.5f * static_cast<float>(levels))), 0, levels - 1);
      w.Put(static_cast<uint32_t>(q), bits);
    }
    return true;
  });
  const std::vector<uint8_t>& symbols = w.Finish();
  out->Bytes(symbols.data(), symbols.size());
  return true;
}

Status DecodeTransformed(const TensorTransform& t, ByteReader& in, int tokens, float* x) {
  const size_t d = t.mean.size();
  size_t coded = 0, total_bits = 0;
  for (size_t c = 0; c < d; ++c) {
    coded += t.bits[c] > 0 ? 1 : 0;
    total_bits += static_cast<size_t>(t.bits[c]) * static_cast<size_t>(tokens);
  }
  std::vector<uint16_t> grid;
  in.Array(&grid, 2 * coded, "storage transform grids");
  const std::span<const uint8_t> symbols = in.Span((total_bits + 7) / 8, "storage transform symbols");
  if (!in.ok()) return in.Error();
  std::vector<float> z(static_cast<size_t>(tokens) * d, 0.0f);
  BitReader r(symbols);
  const bool sound = ForEachGrid(t, grid, [&](size_t c, int bits, float centre, float step) {
    if (!std::isfinite(centre) || !std::isfinite(step) || step < 0) return false;
    const float mid = 0.5f * static_cast<float>((1 << bits) - 1);
    for (int j = 0; j < tokens; ++j) z[j * d + c] = centre + (static_cast<float>(r.Get(bits)) - mid) * step;
    return true;
  });
  if (!sound) return DataLoss("tier block's storage transform grid is damaged");
  if (!r.PaddingIsZero()) return DataLoss("tier block's storage transform symbols have bits past their end");
  for (int j = 0; j < tokens; ++j) {
    float* row = x + j * d;
    std::copy(t.mean.begin(), t.mean.end(), row);
    for (size_t c = 0; c < d; ++c) {
      if (t.bits[c] == 0) continue;  // dropped: the calibration mean
      const float zc = z[j * d + c];
      const float* basis = &t.basis[c * d];
      for (size_t i = 0; i < d; ++i) row[i] += zc * basis[i];
    }
  }
  return Status::Ok();
}

}  // namespace kvx::kv::tier
