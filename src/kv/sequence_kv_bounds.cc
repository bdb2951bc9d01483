// SequenceKV's Quest page bounds (kv/page_selection.h): the per-channel
// min/max of each page's stored keys, kept while page selection is on.
#include <algorithm>
#include <string>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"

namespace kvx::kv {

void SequenceKV::RefreshBounds(int layer, PageTable& t, int p) const {
  const int T = layout_.page_tokens, D = layout_.head_dim;
  const uint8_t* page = pool_->PageData(t.pages()[p]);
  const uint8_t* data = page + PageDataOffset(T);
  const int32_t* pos = PagePositions(page);
  const int m = t.EntriesInPage(p, T);
  thread_local std::vector<float> keys;
  keys.resize(static_cast<size_t>(T) * D);
  const FormatCodec fc = format_codec(layer, t.format(p));
  DispatchCodec(fc.id, [&](auto codec) {
    using C = decltype(codec);
    C::DecodeKeys(*fc.params, data, C::kRowWise ? m : T, keys.data());  // page codecs decode whole pages
  });
  float* b = t.mutable_bounds(p);
  t.EmptyBounds(b);
  for (int s = 0; s < m; ++s) {
    if (pos[s] == kDeadPosition) continue;
    const float* k = &keys[static_cast<size_t>(s) * D];
    for (int c = 0; c < D; ++c) {
      b[c] = std::min(b[c], k[c]);
      b[D + c] = std::max(b[D + c], k[c]);
    }
  }
}

Status SequenceKV::SetPageSelection(const PageSelection& selection) {
  if (Status st = CheckPageSelection(selection, codec_.pre_rope, layout_.page_tokens); !st.ok()) return st;
  if (selection.enabled && KeyChannelBytes() > 0) {
    return InvalidArgument("Quest page selection does not combine with key-channel pruning (policy think): page "
                           "bounds over pruned keys are not kept; use one of the two");
  }
  const bool had = selection_.enabled;
  selection_ = selection;
  if (selection.enabled == had) return Status::Ok();
  for (int l = 0; l < layout_.n_layers; ++l) {
    for (int h = 0; h < layout_.n_kv_heads; ++h) {
      PageTable& t = mutable_table(l, h);
      t.EnableBounds(selection.enabled ? layout_.head_dim : 0);
      if (selection.enabled) {
        for (int p = 0; p < t.num_pages(); ++p) RefreshBounds(l, t, p);
      }
    }
  }
  return Status::Ok();
}

size_t SequenceKV::PageBoundsBytes() const {
  size_t n = 0;
  for (const PageTable& t : tables_) n += static_cast<size_t>(t.num_pages()) * 2 * t.bounds_dim() * sizeof(float);
  return n;
}

}  // namespace kvx::kv
