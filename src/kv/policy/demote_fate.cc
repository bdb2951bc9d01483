#include "kv/policy/demote_fate.h"

#include <cstdint>
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

namespace {

constexpr const char* kDemotionCodecs[] = {"int2", "int4", "int8", "kivi2", "kivi4"};

// Why `codec` cannot hold this layout's demoted entries, or "" when it can.
std::string DemotionCodecProblem(CodecId codec, const KVLayout& layout) {
  const std::string name(CodecName(codec));
  if (layout.head_dim % 8 != 0) {
    return "demote=" + name + " needs head_dim % 8 == 0, this model has head_dim " + std::to_string(layout.head_dim);
  }
  if (IsKivi(codec) && layout.page_tokens * DefaultBits(codec) % 8 != 0) {
    return "demote=" + name + " quantizes keys per channel over a page, which needs page=4 or more (page=" +
           std::to_string(layout.page_tokens) + ")";
  }
  return "";
}

// Bytes of one demoted page (demoted pages have no staging window).
size_t DemotedPageBytes(CodecId codec, const KVLayout& layout) {
  CodecConfig demoted(codec);
  demoted.residual = 0;
  return ResolveLayers(layout, demoted)[0].packed_page_bytes;
}

}  // namespace

Status DemoteFate::CheckSpec(const ResolvedKVSpec& resolved) const {
  const KVLayout& layout = resolved.layout;
  const std::string name(CodecName(codec_));
  if (const std::string problem = DemotionCodecProblem(codec_, layout); !problem.empty()) {
    return InvalidArgument("fate=demote: " + problem + (IsKivi(codec_) ? "; use demote=int2" : "; use fate=drop"));
  }
  const size_t demoted_bytes = DemotedPageBytes(codec_, layout);
  size_t smallest_layer = SIZE_MAX;
  std::string smallest_layer_codec;
  for (const LayerCodec& lc : resolved.layers) {
    if (lc.packed_page_bytes < smallest_layer) {
      smallest_layer = lc.packed_page_bytes;
      smallest_layer_codec = std::string(CodecName(lc.id));
    }
  }
  if (demoted_bytes < smallest_layer) return Status::Ok();
  // Name a demotion codec that would save memory, if there is one.
  std::string alternative;
  size_t alternative_bytes = smallest_layer;
  for (const char* candidate : kDemotionCodecs) {
    const CodecId id = *ParseCodecName(candidate);
    if (!DemotionCodecProblem(id, layout).empty()) continue;
    const size_t bytes = DemotedPageBytes(id, layout);
    if (bytes < alternative_bytes) {
      alternative = candidate;
      alternative_bytes = bytes;
    }
  }
  const std::string fix = alternative.empty()
                              ? "no demotion codec is smaller than " + smallest_layer_codec +
                                    " pages: use fate=drop, or a wider layer codec"
                              : "use demote=" + alternative + " (" + std::to_string(alternative_bytes) +
                                    " bytes a page) or fate=drop";
  return InvalidArgument("fate=demote: demote=" + name + " pages (" + std::to_string(demoted_bytes) +
                         " bytes) are not smaller than the layer codec's " + smallest_layer_codec + " pages (" +
                         std::to_string(smallest_layer) + " bytes), so demoting would save nothing; " + fix);
}

double DemoteFate::BytesPerEvictedToken(const KVLayout& layout) const {
  if (!DemotionCodecProblem(codec_, layout).empty()) return 0;  // refused by CheckSpec
  return static_cast<double>(DemotedPageBytes(codec_, layout)) / layout.page_tokens * layout.n_layers * layout.n_kv_heads;
}

uint64_t DemoteFate::HeadroomBytes(const KVLayout& layout, int64_t evicted) const {
  if (!DemotionCodecProblem(codec_, layout).empty()) return 0;  // refused by CheckSpec
  const uint64_t pages = static_cast<uint64_t>((evicted + layout.page_tokens - 1) / layout.page_tokens + 1);
  return pages * DemotedPageBytes(codec_, layout) * static_cast<uint64_t>(layout.n_layers) * layout.n_kv_heads;
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

namespace {
const FateRegistrar kFate("demote", DemoteFate::Create);
const PolicyRegistrar kPolicy("mikv", ScoredPolicyFactory("mikv", "h2o", [](EvictionConfig& d) {
    d.fate = "demote";
    d.ratio = 0.75;  // MiKV keeps about 20-25% at high precision (METHODS.md A5)
  }));
}  // namespace

}  // namespace kvx::kv
