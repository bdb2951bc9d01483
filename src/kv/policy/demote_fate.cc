#include "kv/policy/demote_fate.h"

#include <string>

#include "kv/codec/codec_config.h"
#include "kv/codec/codecs.h"
#include "kv/kv_spec.h"
#include "kv/policy/eviction_policies.h"
#include "kv/policy/scored_eviction.h"

namespace kvx::kv {

Result<std::unique_ptr<EvictionFate>> DemoteFate::Create(PolicyParamReader& params) {
  auto f = std::make_unique<DemoteFate>();
  std::string codec(CodecName(f->codec_));
  params.Choice("demote", &codec, {"int2", "int4", "int8", "kivi2", "kivi4"});
  f->codec_ = *ParseCodecName(codec);
  return std::unique_ptr<EvictionFate>(std::move(f));
}

Status DemoteFate::CheckSpec(const KVSpec& spec, const KVLayout& layout) const {
  const std::string name(CodecName(codec_));
  if (layout.head_dim % 8 != 0) {
    return InvalidArgument("fate=demote: demote=" + name + " needs head_dim % 8 == 0, this model has head_dim " +
                           std::to_string(layout.head_dim) + "; use fate=drop");
  }
  if (IsKivi(codec_) && layout.page_tokens * DefaultBits(codec_) % 8 != 0) {
    return InvalidArgument("fate=demote: demote=" + name + " quantizes keys per channel over a page, which needs " +
                           "page=4 or more (page=" + std::to_string(layout.page_tokens) + "); use demote=int2");
  }
  CodecConfig demoted(codec_);
  demoted.residual = 0;
  const size_t demoted_bytes = ResolveLayers(layout, demoted)[0].packed_page_bytes;
  for (const LayerCodec& lc : ResolveLayers(layout, spec.codec)) {
    if (demoted_bytes >= lc.packed_page_bytes) {
      return InvalidArgument("fate=demote: demote=" + name + " pages (" + std::to_string(demoted_bytes) +
                             " bytes) are not smaller than the layer codec's " + std::string(CodecName(lc.id)) +
                             " pages (" + std::to_string(lc.packed_page_bytes) +
                             " bytes), so demoting would save nothing; choose a lower demote= (e.g. int2) or "
                             "fate=drop");
    }
  }
  return Status::Ok();
}

Status DemoteFate::Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
                         const std::vector<int>& /*kept*/) {
  SequenceKV& kv = manager.kv(seq);
  KVX_RETURN_IF_ERROR(kv.SetDemotionCodec(codec_));
  const int before = kv.LiveEntriesIn(layer, kv_head, kPageDemoted);
  KVX_RETURN_IF_ERROR(kv.DemoteEntries(layer, kv_head, evicted));
  demoted_ += kv.LiveEntriesIn(layer, kv_head, kPageDemoted) - before;
  return Status::Ok();
}

void RegisterDemotePolicies(PolicyRegistry& registry) {
  EvictionFateRegistry::Global().Register("demote", DemoteFate::Create);
  ScorerMethod m = H2OMethod();
  m.defaults.fate = "demote";
  m.defaults.ratio = 0.75;  // MiKV keeps about 20-25% at high precision (METHODS.md A5)
  registry.Register("mikv", [m](const PolicyParams& params) {
    return ScoredEvictionPolicy::Create("mikv", params, m.defaults, m.make);
  });
}

}  // namespace kvx::kv
