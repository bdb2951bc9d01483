// The `demote` eviction fate (eviction_fate.h) and policy `mikv`: MiKV
// (arXiv 2402.18096; METHODS.md A5), "no token left behind". The entries a
// scorer evicts are not dropped but demoted: re-encoded with a low-bit
// codec into demoted pages of their (layer, kv head) chain
// (SequenceKV::DemoteEntries, page format kPageDemoted), where attention
// still reads them; the important entries stay in the layer codec (f16,
// int8, kivi4, ...). The originals' pages return to the pool once empty or
// compacted, so the pool holds the kept entries at full price plus the
// demoted at the demotion codec's price (int2, group 32: 52 of f16's 260
// bytes per entry and head at d = 64, page = 16).
//
// Parameters (besides the scored-eviction ones, scored_eviction.h):
//   demote  the demotion codec: int2 (default) | int4 | int8 | kivi2 | kivi4
//           (with its default bits and group 32; kivi* need page >= 4)
//
// policy=mikv is H2O's accumulated attention (the paper's importance) with
// its recent window and fate=demote; ratio= is the fraction of entries
// demoted (default 0.75: the paper keeps about 20-25% at high precision).
// Any scorer takes fate=demote (policy=snapkv,ratio=0.5,fate=demote).
//
// Where it differs from the paper: no per-channel key balancer (MiKV's
// SmoothQuant-style outlier scaling); kivi2 (keys per channel over a page)
// is the closest substitute. Demoted entries are not promoted back (as in
// the paper) and are never scored again.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "kv/codec/codec_id.h"
#include "kv/policy/eviction_fate.h"
#include "kv/policy/policy.h"

namespace kvx::kv {

class DemoteFate : public EvictionFate {
 public:
  static Result<std::unique_ptr<EvictionFate>> Create(PolicyParamReader& params);
  std::string_view name() const override { return "demote"; }
  Status Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
               const std::vector<int>& kept) override;
  // Rejects a demotion codec the layout cannot use or one whose pages are
  // not smaller than some layer's packed pages (nothing would be saved).
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;
  // The demoted pages of every table: they are written before compaction
  // frees the pages the entries came from (at most ceil(evicted / T) + 1 a
  // table; bounded by all tables at once, as policies compress table by table).
  bool allocates() const override { return true; }
  double BytesPerEvictedToken(const KVLayout& layout) const override;
  uint64_t HeadroomBytes(const KVLayout& layout, int64_t evicted) const override;

  PolicyParams Parameters() const override { return {{"demote", std::string(CodecName(codec_))}}; }
  CodecId codec() const { return codec_; }
  // Entries demoted so far, for tests and reports.
  int64_t demoted() const { return demoted_; }

 private:
  CodecId codec_ = CodecId::kInt2;
  int64_t demoted_ = 0;
};

}  // namespace kvx::kv
