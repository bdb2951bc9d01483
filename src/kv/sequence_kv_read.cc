// SequenceKV's read-back of stored entries as floats (ReadEntry, ReadChain):
// for tests, debugging and the policies that score or merge by the stored
// keys; not the attention path (kv/attention.cc).
#include <algorithm>
#include <cstring>

#include "kv/codec/codecs.h"
#include "kv/pruned_keys.h"
#include "kv/sequence_kv.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {

int SequenceKV::LiveEntries(int layer, int kv_head) const { return table(layer, kv_head).live(); }

void SequenceKV::ReadEntry(int layer, int kv_head, int index, float* k, float* v, int32_t* pos) const {
  const PageTable& t = table(layer, kv_head);
  KVX_CHECK(index >= 0 && index < t.length());
  const int T = layout_.page_tokens, D = layout_.head_dim, slot = index % T;
  const uint8_t* page = pool_->PageData(t.pages()[index / T]);
  *pos = PagePositions(page)[slot];
  // Page codecs decode whole pages (per-channel parameters): decode rows 0..slot.
  std::vector<float> kk(static_cast<size_t>(slot + 1) * D), vv(kk.size());
  const uint8_t* data = page + PageDataOffset(T);
  const FormatCodec fc = format_codec(layer, t.format(index / T), kv_head);
  if (fc.kept != nullptr) {
    pruned::Decode(fc.pruned_shape(), *fc.kept, data, slot + 1, kk.data(), vv.data());
  } else {
    DispatchCodec(fc.id, [&](auto codec) {
      decltype(codec)::DecodeKeys(*fc.params, data, slot + 1, kk.data());
      decltype(codec)::DecodeValues(*fc.params, data, slot + 1, vv.data());
    });
  }
  std::memcpy(k, &kk[static_cast<size_t>(slot) * D], sizeof(float) * D);
  std::memcpy(v, &vv[static_cast<size_t>(slot) * D], sizeof(float) * D);
  if (rotation_ != nullptr) {
    if (keys_rotated()) rotation_->Inverse(k);
    rotation_->Inverse(v);
  }
  if (t.has_entry_scales()) {
    const float ks = t.k_scales(index / T)[slot], vs = t.v_scales(index / T)[slot];
    for (int c = 0; c < D; ++c) k[c] *= ks, v[c] *= vs;
  }
}

void SequenceKV::ReadChain(int layer, int kv_head, std::vector<float>* k, std::vector<float>* v,
                           std::vector<int32_t>* pos) const {
  const PageTable& t = table(layer, kv_head);
  const int T = layout_.page_tokens, D = layout_.head_dim;
  k->resize(static_cast<size_t>(t.length()) * D);
  v->resize(k->size());
  pos->resize(t.length());
  DecodedPage dp;
  for (int p = 0; p < t.num_pages(); ++p) {
    const int n = t.EntriesInPage(p, T);
    // Packed pages of page codecs are always whole (a partial page is f16
    // staging or row-wise), so decoding n slots is valid for every page.
    DecodePage(*pool_, format_codec(layer, t.format(p), kv_head), t.pages()[p], n, &dp);
    const size_t off = static_cast<size_t>(p) * T;
    std::copy(dp.k.begin(), dp.k.begin() + static_cast<size_t>(n) * D, k->begin() + off * D);
    std::copy(dp.v.begin(), dp.v.begin() + static_cast<size_t>(n) * D, v->begin() + off * D);
    std::copy(dp.pos.begin(), dp.pos.begin() + n, pos->begin() + off);
  }
  if (rotation_ != nullptr) {
    for (int s = 0; s < t.length(); ++s) {
      if (keys_rotated()) rotation_->Inverse(k->data() + static_cast<size_t>(s) * D);
      rotation_->Inverse(v->data() + static_cast<size_t>(s) * D);
    }
  }
  if (t.has_entry_scales()) {  // what attention reads: the stored rows times the table's scales
    for (int s = 0; s < t.length(); ++s) {
      const float ks = t.k_scales(s / T)[s % T], vs = t.v_scales(s / T)[s % T];
      for (int c = 0; c < D; ++c) (*k)[static_cast<size_t>(s) * D + c] *= ks, (*v)[static_cast<size_t>(s) * D + c] *= vs;
    }
  }
}

}  // namespace kvx::kv
