#include "kv/codec/codec_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "kv/block_pool.h"
#include "kv/codec/codecs.h"

namespace kvx::kv {
namespace {

std::string BitsText(int k, int v) { return "k" + std::to_string(k) + "v" + std::to_string(v); }

// Shortest decimal that parses back to exactly `x`.
std::string ShortestDouble(double x) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

}  // namespace

std::string CodecConfig::ToString() const {
  std::string s = "codec=" + std::string(CodecName(id));
  if (k_bits != 0) s += ",bits=" + BitsText(k_bits, v_bits);
  for (const LayerBits& lb : layer_bits) {
    s += ",bits." + std::to_string(lb.first);
    if (lb.last != lb.first) s += "-" + std::to_string(lb.last);
    s += "=" + BitsText(lb.k_bits, lb.v_bits);
  }
  if (group != 0) s += ",group=" + std::to_string(group);
  if (sym) s += ",sym=1";
  if (clip) s += ",clip=1";
  if (residual >= 0) s += ",residual=" + std::to_string(residual);
  if (sinks != 0) s += ",sinks=" + std::to_string(sinks);
  if (rotation == Rotation::kHadamard) s += ",rotate=hadamard";
  if (rotation == Rotation::kValues) s += ",rotate=values";
  if (pre_rope) s += ",prerope=1";
  if (outliers != 0) s += ",outliers=" + ShortestDouble(outliers);
  return s;
}

std::vector<LayerCodec> ResolveLayers(const KVLayout& layout, const CodecConfig& config) {
  const int T = layout.page_tokens, d = layout.head_dim;
  std::vector<LayerCodec> out(static_cast<size_t>(layout.n_layers));
  for (int l = 0; l < layout.n_layers; ++l) {
    LayerCodec& lc = out[l];
    CodecParams p;
    p.page_tokens = T;
    p.head_dim = d;
    int kb = config.k_bits != 0 ? config.k_bits : DefaultBits(config.id);
    int vb = config.v_bits != 0 ? config.v_bits : DefaultBits(config.id);
    for (const LayerBits& lb : config.layer_bits) {
      if (l >= lb.first && l <= lb.last) kb = lb.k_bits, vb = lb.v_bits;
    }
    const bool quantized = IsQuantized(config.id) && kb != 16 && vb != 16 && d % 8 == 0;
    if (!quantized) {
      lc.id = IsQuantized(config.id) ? CodecId::kF16 : config.id;
    } else {
      lc.id = config.id;
      p.k_bits = kb;
      p.v_bits = vb;
      p.group = std::min(config.EffectiveGroup(), d & -d);  // a power of two dividing d
      p.sym = config.sym;
      p.clip = config.clip;
      if (config.outliers > 0) {
        p.outliers = std::clamp(static_cast<int>(std::lround(config.outliers * T * d)), 1, T * d);
      }
      lc.residual = config.EffectiveResidual();
      lc.sealed = IsKivi(config.id) || p.outliers > 0 || lc.residual > 0;
      lc.sink_pages = (config.sinks + T - 1) / T;
    }
    lc.params = p;
    lc.packed_page_bytes = CodecPageBytes(lc.id, p);
    CodecParams full = p;
    full.k_bits = full.v_bits = 16;
    full.outliers = 0;
    lc.full_page_bytes = CodecPageBytes(CodecId::kF16, full);
  }
  return out;
}

Status ValidateCodecConfig(const KVLayout& layout, const CodecConfig& config) {
  KVX_RETURN_IF_ERROR(layout.Validate());
  const std::string spec = "--kv '" + config.ToString() + "'";
  if (IsQuantized(config.id) && layout.head_dim % 8 != 0) {
    return InvalidArgument(spec + ": quantized KV codecs need head_dim % 8 == 0, this model has head_dim " +
                           std::to_string(layout.head_dim) + "; use codec=f16");
  }
  for (const LayerBits& lb : config.layer_bits) {
    if (lb.last >= layout.n_layers) {
      return InvalidArgument(spec + ": bits." + std::to_string(lb.first) +
                             (lb.last != lb.first ? "-" + std::to_string(lb.last) : "") + " names layer " +
                             std::to_string(lb.last) + " but the model has " + std::to_string(layout.n_layers) +
                             " layers (0.." + std::to_string(layout.n_layers - 1) + ")");
    }
  }
  std::set<size_t> sizes;
  for (const LayerCodec& lc : ResolveLayers(layout, config)) {
    const bool kivi = lc.id == CodecId::kKivi4 || lc.id == CodecId::kKivi2;
    if (kivi && lc.params.page_tokens * lc.params.k_bits % 8 != 0) {
      // ChannelTensor packs each channel's codes over the page into whole bytes.
      return InvalidArgument(spec + ": KIVI quantizes keys per channel over a page, which needs at least 4 tokens "
                             "per page (page=" + std::to_string(lc.params.page_tokens) +
                             "); use page=32 or more, as the KIVI paper does");
    }
    sizes.insert(AlignUp(lc.packed_page_bytes, kPageAlign));
    if (lc.sealed || lc.sink_pages > 0) sizes.insert(AlignUp(lc.full_page_bytes, kPageAlign));
  }
  if (sizes.size() > static_cast<size_t>(BlockPool::kMaxSizeClasses)) {
    return InvalidArgument(spec + " needs " + std::to_string(sizes.size()) + " distinct page sizes; at most " +
                           std::to_string(BlockPool::kMaxSizeClasses) + " are supported (use fewer bit widths)");
  }
  return Status::Ok();
}

}  // namespace kvx::kv
