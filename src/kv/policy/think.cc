#include "kv/policy/think.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kv/codec/f16_codec.h"
#include "kv/pruned_keys.h"
#include "kv/policy/params.h"

namespace kvx::kv {

int ThinKConfig::KeepFor(int head_dim) const {
  if (keep > 0) return keep;
  // kvpress: int(head_dim * compression_ratio) channels pruned.
  return head_dim - static_cast<int>(std::floor(lambda * head_dim + 1e-9));
}

std::vector<int> ThinKKeptChannels(const float* q, int n_rows, int G, const float* k, int n_keys, int d, int keep) {
  std::vector<double> qs(d, 0.0), ks(d, 0.0);
  for (size_t i = 0; i < static_cast<size_t>(n_rows) * G; ++i) {
    for (int c = 0; c < d; ++c) qs[c] += static_cast<double>(q[i * d + c]) * q[i * d + c];
  }
  for (size_t j = 0; j < static_cast<size_t>(n_keys); ++j) {
    for (int c = 0; c < d; ++c) ks[c] += static_cast<double>(k[j * d + c]) * k[j * d + c];
  }
  const double qn = std::max<size_t>(1, static_cast<size_t>(n_rows) * G), kn = std::max(1, n_keys);
  std::vector<double> score(d);
  for (int c = 0; c < d; ++c) score[c] = (qs[c] / qn) * (ks[c] / kn);
  std::vector<int> order(d);
  std::iota(order.begin(), order.end(), 0);
  // Largest first, ties to the lower channel (deterministic).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  order.resize(std::clamp(keep, 0, d));
  std::sort(order.begin(), order.end());
  return order;
}

Result<std::unique_ptr<KVPolicy>> ThinKPolicy::Create(PolicyParamReader& r) {
  ThinKConfig c;
  std::string mode = "once";
  r.Double("lambda", &c.lambda, 0.0, 0.99)
      .Int("keep", &c.keep, 1, 1 << 16)
      .Int("window", &c.window, 1, 1 << 20)
      .Int("recent", &c.recent, 0, 1 << 20)
      .Choice("mode", &mode, {"once", "continuous"});
  KVX_RETURN_IF_ERROR(r.error());
  if (r.Has("lambda") && r.Has("keep")) {
    return InvalidArgument("policy think: give lambda= (the fraction pruned) or keep= (the channels kept), not both");
  }
  if (mode == "continuous") {
    return InvalidArgument("policy think: mode=continuous is not implemented (re-scoring the channels as decode "
                           "goes); think prunes at the compression moment (mode=once, e.g. kvx eval --compress "
                           "excluded|included), tokens appended later keep every channel");
  }
  return std::unique_ptr<KVPolicy>(new ThinKPolicy(c));
}

PolicyParams ThinKPolicy::Parameters() const {
  const ThinKConfig& c = config_;
  return {{"lambda", std::to_string(c.lambda)}, {"keep", std::to_string(c.keep)},
          {"window", std::to_string(c.window)}, {"recent", std::to_string(c.recent)}, {"mode", "once"}};
}

namespace {
const PolicyRegistrar kRegistered("think", ThinKPolicy::Create);
}  // namespace

Status ThinKPolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  const KVSpec& spec = resolved.spec;
  const KVLayout& layout = resolved.layout;
  const CodecId id = spec.codec.id;
  if (IsKivi(id)) {
    return InvalidArgument("policy think has no pruned page format for " + std::string(CodecName(id)) +
                           " (keys quantized per channel over a sealed page); use codec=f16, f32, int8, int4 or "
                           "int2 (e.g. codec=int4;policy=think,lambda=0.5)");
  }
  if (spec.codec.outliers > 0) {
    return InvalidArgument("policy think does not combine with outliers= (their side lists index the full key "
                           "channels); drop outliers=");
  }
  if (spec.codec.pre_rope) {
    return InvalidArgument("policy think prunes post-RoPE key channels; prerope=1 would rotate a kept channel with "
                           "its pruned partner at read time: drop prerope=1");
  }
  if (spec.codec.rotation == Rotation::kHadamard) {
    return InvalidArgument("policy think scores the keys' own channels; rotate=hadamard mixes them: use rotate=none "
                           "or rotate=values");
  }
  for (const PolicySpec& p : spec.policies) {
    if (p.name == "quest" || p.name == "minicache") {
      return InvalidArgument("policy think does not combine with " + p.name +
                             (p.name == "quest" ? " (page bounds over pruned keys are not kept)"
                                                : " (shared cross-layer pages would need one mask for two layers)") +
                             "; use one of the two");
    }
  }
  const int d = layout.head_dim, keep = config_.KeepFor(d);
  if (keep < 1 || keep >= d) {
    return InvalidArgument("policy think keeps " + std::to_string(keep) + " of " + std::to_string(d) +
                           " key channels; keep must be in 1.." + std::to_string(d - 1) +
                           " (lambda in (0, 1), e.g. lambda=0.4)");
  }
  // Every layer's pruned page must be smaller than its packed page (keys are
  // stored in multiples of 8 channel rows in f16 and int8, 16 in int4, 32 in
  // int2: whole 8-byte bit planes).
  for (const LayerCodec& lc : resolved.layers) {
    if (!pruned::BlockCodec(lc.id, lc.params).has_value()) {
      return InvalidArgument("policy think has no pruned page format for " + std::string(CodecName(lc.id)) +
                             "; use codec=f16, f32, int8, int4 or int2");
    }
    if (pruned::ShapeFor(lc.id, lc.params, keep).page_bytes < lc.packed_page_bytes) continue;
    int most = 0;  // the most channels that still save bytes
    for (int k = d - 1; k >= 1 && most == 0; --k) {
      if (pruned::ShapeFor(lc.id, lc.params, k).page_bytes < lc.packed_page_bytes) most = k;
    }
    const pruned::Shape shape = pruned::ShapeFor(lc.id, lc.params, keep);
    std::string fix = most > 0 ? "keep at most " + std::to_string(most) + " (lambda >= " +
                                     std::to_string(static_cast<double>(d - most) / d).substr(0, 5) + ")"
                               : "use codec=f16";
    return InvalidArgument("policy think: keeping " + std::to_string(keep) + " of " + std::to_string(d) +
                           " key channels saves no bytes with " + std::string(CodecName(lc.id)) +
                           " (its pruned keys are stored in multiples of " + std::to_string(shape.row_unit) +
                           " channels: " + std::to_string(shape.rows) + " rows); " + fix);
  }
  return Status::Ok();
}

void ThinKPolicy::Keep(Queries* into, int layer, const float* q, int n_rows, int n_heads, int head_dim) const {
  const size_t w = static_cast<size_t>(n_heads) * head_dim;
  if (into->n_heads != n_heads || into->head_dim != head_dim) {
    into->rows.clear();
    into->n_heads = n_heads;
    into->head_dim = head_dim;
  }
  std::vector<float>& rows = into->rows[layer];
  rows.insert(rows.end(), q, q + static_cast<size_t>(n_rows) * w);
  const size_t limit = static_cast<size_t>(config_.window) * w;
  if (rows.size() > limit) rows.erase(rows.begin(), rows.end() - static_cast<ptrdiff_t>(limit));
}

void ThinKPolicy::OnQueries(int seq, int layer, const float* q, int n_q, int n_heads, int head_dim) {
  const int n = std::min(n_q, config_.window);
  const float* last = q + static_cast<size_t>(n_q - n) * n_heads * head_dim;
  std::lock_guard<std::mutex> lock(mu_);
  Queries& step = step_[seq];
  step.rows.erase(layer);  // one call per layer and step: a fresh window
  Keep(&step, layer, last, n, n_heads, head_dim);
}

Status ThinKPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  const auto requests = manager.step_requests();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].seq != seq) continue;
    auto it = step_.find(static_cast<int>(i));
    if (it == step_.end()) break;  // a decode step: nothing observed
    Queries& into = seqs_[seq];
    for (const auto& [layer, rows] : it->second.rows) {
      Keep(&into, layer, rows.data(), static_cast<int>(rows.size() / (static_cast<size_t>(it->second.n_heads) *
                                                                     it->second.head_dim)),
           it->second.n_heads, it->second.head_dim);
    }
    step_.erase(it);
    break;
  }
  return Status::Ok();
}

void ThinKPolicy::OnSequenceReleased(SeqId seq) {
  std::lock_guard<std::mutex> lock(mu_);
  seqs_.erase(seq);
}

Status ThinKPolicy::Compress(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  const KVLayout& L = kv.layout();
  const int D = L.head_dim, H = L.n_kv_heads;
  stats_ = ThinKStats{};
  Queries queries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return Status::Ok();  // no prompt observed (e.g. a one-token context): nothing to score
    queries = it->second;
  }
  if (queries.head_dim != D || queries.n_heads % H != 0) {
    return Internal("policy think: the observed queries do not match the cache's layout");
  }
  const int G = queries.n_heads / H, keep = config_.KeepFor(D);
  std::vector<float> k, v, qg, kk;
  std::vector<int32_t> pos;
  for (int l = 0; l < L.n_layers; ++l) {
    auto q_it = queries.rows.find(l);
    for (int h = 0; h < H; ++h) {
      std::vector<int> kept = kv.kept_channels(l, h);
      if (kept.empty()) {  // the first compression of this table chooses its mask
        if (q_it == queries.rows.end()) continue;
        const std::vector<float>& rows = q_it->second;
        const size_t w = static_cast<size_t>(queries.n_heads) * D;
        const int n_rows = static_cast<int>(rows.size() / w);
        qg.resize(static_cast<size_t>(n_rows) * G * D);
        for (int i = 0; i < n_rows; ++i) {  // the group's query heads h*G .. h*G+G-1
          std::copy(rows.begin() + i * w + static_cast<size_t>(h) * G * D,
                    rows.begin() + i * w + static_cast<size_t>(h + 1) * G * D, qg.begin() + static_cast<size_t>(i) * G * D);
        }
        // Keys outside the last `recent` live entries (all live ones when none are older).
        kv.ReadChain(l, h, &k, &v, &pos);
        std::vector<int> live;
        for (int s = 0; s < static_cast<int>(pos.size()); ++s) {
          if (pos[s] != kDeadPosition) live.push_back(s);
        }
        if (live.empty()) continue;
        if (static_cast<int>(live.size()) > config_.recent) live.resize(live.size() - config_.recent);
        kk.resize(live.size() * D);
        for (size_t j = 0; j < live.size(); ++j) {
          std::copy(k.begin() + static_cast<size_t>(live[j]) * D, k.begin() + static_cast<size_t>(live[j] + 1) * D,
                    kk.begin() + j * D);
        }
        kept = ThinKKeptChannels(qg.data(), n_rows, G, kk.data(), static_cast<int>(live.size()), D, keep);
      }
      KVX_RETURN_IF_ERROR(kv.PruneKeyChannels(l, h, kept, config_.recent));
      ++stats_.tables;
    }
  }
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < H; ++h) {
      const PageTable& t = kv.table(l, h);
      for (int p = 0; p < t.num_pages(); ++p) stats_.pages += t.format(p) == kPagePruned;
    }
  }
  if (stats_.tables > 0) manager.MarkEntriesRemoved(seq);  // the pages no longer hold the keys as computed
  return Status::Ok();
}

}  // namespace kvx::kv
