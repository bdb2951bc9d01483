// KVLayout: the shape of one model's KV cache as kv/ sees it. kv/ never knows
// about the model class; the model hands it this value.
//
//   n_layers    transformer layers that keep a KV cache
//   n_kv_heads  key/value heads per layer (GQA: fewer than query heads)
//   head_dim    elements per key (and per value) vector
//   page_tokens cache entries per page; a page belongs to one (layer, kv-head)
//
// Thread-safety: plain value type.
#pragma once

#include <string>

#include "util/status.h"

namespace kvx::kv {

// Largest supported page, in tokens (the --kv grammar allows 1..256, powers of two).
inline constexpr int kMaxPageTokens = 256;
inline constexpr int kMaxHeadDim = 1024;

struct KVLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_tokens = 16;

  // OK when every field is in range: n_layers, n_kv_heads >= 1, 1 <= head_dim <=
  // kMaxHeadDim, page_tokens a power of two in [1, kMaxPageTokens].
  Status Validate() const {
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || head_dim > kMaxHeadDim) {
      return InvalidArgument("invalid KV layout " + ToString() +
                             ": need n_layers >= 1, n_kv_heads >= 1, 1 <= head_dim <= " +
                             std::to_string(kMaxHeadDim));
    }
    if (page_tokens < 1 || page_tokens > kMaxPageTokens || (page_tokens & (page_tokens - 1)) != 0) {
      return InvalidArgument("invalid KV layout " + ToString() +
                             ": page_tokens must be a power of two in 1.." + std::to_string(kMaxPageTokens));
    }
    return Status::Ok();
  }

  std::string ToString() const {
    return "{layers=" + std::to_string(n_layers) + ", kv_heads=" + std::to_string(n_kv_heads) +
           ", head_dim=" + std::to_string(head_dim) + ", page_tokens=" + std::to_string(page_tokens) + "}";
  }

  bool operator==(const KVLayout&) const = default;
};

}  // namespace kvx::kv
