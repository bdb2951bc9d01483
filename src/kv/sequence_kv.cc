#include "kv/sequence_kv.h"

#include <algorithm>
#include <cstring>

#include "kv/codec/codecs.h"
#include "kv/pruned_keys.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {
namespace {

// Positions a pre-RoPE cache may hold (the cos/sin table is dense in position).
constexpr int32_t kMaxPreRopePosition = 1 << 22;

// Index of the first page that may still change at chain length `len`: the
// first f16 staging page of a sealed layer, else the page holding slot len.
// Staging pages are the tail of the chain after the sink pages; a packed
// page never returns to f16, even when removed pages put it back inside the
// residual window by the index rule (LayerCodec::IsFullPage), so the staging
// run is read from the pages' flags, not recomputed from the length.
int FirstMutablePage(const LayerCodec& lc, const PageTable& t, int len) {
  const int T = lc.params.page_tokens;
  int p = std::min(len / T, t.num_pages());
  if (lc.sealed) {
    int staging = t.num_pages();
    while (staging > lc.sink_pages && t.is_full(staging - 1)) --staging;
    p = std::min(p, staging);
  }
  return p;
}

}  // namespace

size_t PageBytes(const KVLayout& layout, const CodecConfig& codec) {
  size_t most = 0;
  for (const LayerCodec& lc : ResolveLayers(layout, codec)) {
    most = std::max(most, lc.packed_page_bytes);
    if (lc.sealed || lc.sink_pages > 0) most = std::max(most, lc.full_page_bytes);
  }
  return most;
}

size_t BytesPerToken(const KVLayout& layout, const CodecConfig& codec) {
  size_t total = 0;
  for (const LayerCodec& lc : ResolveLayers(layout, codec)) total += lc.packed_page_bytes * layout.n_kv_heads;
  return (total + layout.page_tokens - 1) / layout.page_tokens;
}

uint64_t BytesForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx) {
  const int64_t T = layout.page_tokens;
  const int64_t pages = (n_ctx + T - 1) / T;
  uint64_t total = 0;
  for (const LayerCodec& lc : ResolveLayers(layout, codec)) {
    int64_t full = 0;
    if (lc.sealed) {
      const int64_t packed_end = std::max<int64_t>(0, n_ctx - lc.residual) / T;
      full = pages - std::clamp<int64_t>(packed_end - lc.sink_pages, 0, pages);
    } else {
      full = std::min<int64_t>(lc.sink_pages, pages);
    }
    total += (static_cast<uint64_t>(full) * lc.full_page_bytes +
              static_cast<uint64_t>(pages - full) * lc.packed_page_bytes) *
             static_cast<uint64_t>(layout.n_kv_heads);
  }
  return total;
}

size_t ExtentBytesFor(const KVLayout& layout, uint64_t budget, int n_seqs) {
  const uint64_t tables =
      static_cast<uint64_t>(std::max(n_seqs, 1)) * std::max(layout.n_layers, 1) * std::max(layout.n_kv_heads, 1);
  return static_cast<size_t>(std::clamp<uint64_t>(budget / tables, 1, kMaxExtentBytes));
}

uint64_t BudgetForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx) {
  uint64_t total = BytesForContext(layout, codec, n_ctx);
  if (n_ctx == 0) return 0;
  for (const LayerCodec& lc : ResolveLayers(layout, codec)) {
    if (!lc.sealed) continue;
    // Staging pages being sealed are freed only after their packed page is
    // written; at most residual/T + 2 of them per head at a time.
    const uint64_t staging = static_cast<uint64_t>((lc.residual + layout.page_tokens - 1) / layout.page_tokens + 2);
    total += staging * lc.full_page_bytes * static_cast<uint64_t>(layout.n_kv_heads);
  }
  return total;
}

SequenceKV::SequenceKV(BlockPool* pool, const KVLayout& layout, const CodecConfig& codec)
    : pool_(pool), layout_(layout), codec_(codec) {
  KVX_CHECK(pool_ != nullptr);
  KVX_CHECK(layout_.Validate().ok());
  KVX_CHECK_MSG(pool_->page_bytes() >= PageBytes(layout_, codec_), "pool pages are too small for this codec");
  layers_ = ResolveLayers(layout_, codec_);
  size_class_.assign(2 * static_cast<size_t>(layout_.n_layers), -1);
  tables_.resize(static_cast<size_t>(layout_.n_layers) * layout_.n_kv_heads);
  kept_channels_.resize(tables_.size());
  reserved_.resize(layout_.n_layers);
  if (codec_.rotation != Rotation::kNone) rotation_ = std::make_unique<HadamardRotation>(layout_.head_dim);
}

SequenceKV::~SequenceKV() { Clear(); }

void SequenceKV::Clear() {
  CancelReservation();
  for (PageTable& t : tables_) {
    for (PageId id : t.pages()) pool_->Unref(id);
    t.Reset();
  }
  for (std::vector<int>& kept : kept_channels_) kept.clear();  // no pruned page is left
}

size_t SequenceKV::BytesInUse() const {
  size_t bytes = 0;
  std::vector<PageId> cross_layer;  // pages that tables with entry scales list: maybe twice (ShareEntries)
  for (const PageTable& t : tables_) {
    if (t.has_entry_scales()) {
      cross_layer.insert(cross_layer.end(), t.pages().begin(), t.pages().end());
      continue;
    }
    for (PageId id : t.pages()) bytes += pool_->PageBytesOf(id);
  }
  std::sort(cross_layer.begin(), cross_layer.end());
  cross_layer.erase(std::unique(cross_layer.begin(), cross_layer.end()), cross_layer.end());
  for (PageId id : cross_layer) bytes += pool_->PageBytesOf(id);
  return bytes;
}

int64_t SequenceKV::PagesInUse() const {
  int64_t n = 0;
  for (const PageTable& t : tables_) n += t.num_pages();
  return n;
}

std::unique_ptr<SequenceKV> SequenceKV::EmptyCopy() const {
  auto copy = std::make_unique<SequenceKV>(pool_, layout_, codec_);
  copy->size_class_ = size_class_;
  copy->selection_ = selection_;
  copy->demote_id_ = demote_id_;
  copy->demote_params_ = demote_params_;
  copy->demote_page_bytes_ = demote_page_bytes_;
  copy->demote_class_ = demote_class_;
  copy->kept_channels_ = kept_channels_;
  copy->pruned_classes_ = pruned_classes_;
  copy->rope_ = rope_;
  copy->rope_set_ = rope_set_;
  copy->max_pos_ = max_pos_;
  copy->rope_positions_ = rope_positions_;
  copy->rope_table_ = rope_table_;
  return copy;
}

std::unique_ptr<SequenceKV> SequenceKV::Fork() const {
  auto copy = EmptyCopy();
  copy->tables_ = tables_;
  for (const PageTable& t : tables_) {
    for (PageId id : t.pages()) pool_->Ref(id);
  }
  return copy;
}

Status SequenceKV::EnsureSizeClasses() {
  if (size_class_[0] >= 0) return Status::Ok();
  for (int l = 0; l < layout_.n_layers; ++l) {
    const LayerCodec& lc = layers_[l];
    KVX_ASSIGN_OR_RETURN(const int packed, pool_->AddSizeClass(lc.packed_page_bytes));
    int full = packed;
    if (lc.sealed || lc.sink_pages > 0) {
      KVX_ASSIGN_OR_RETURN(full, pool_->AddSizeClass(lc.full_page_bytes));
    }
    size_class_[2 * static_cast<size_t>(l)] = packed;
    size_class_[2 * static_cast<size_t>(l) + 1] = full;
  }
  return Status::Ok();
}

void SequenceKV::set_rope(const ops::RopeParams& rope) {
  const bool same = rope_set_ && rope.n_dims == rope_.n_dims && rope.freq_base == rope_.freq_base &&
                    rope.freq_scale == rope_.freq_scale && rope.freq_factors == rope_.freq_factors &&
                    rope.neox == rope_.neox;
  if (same) return;
  KVX_CHECK(rope.n_dims > 0 && rope.n_dims % 2 == 0 && rope.n_dims <= layout_.head_dim);
  rope_ = rope;
  rope_set_ = true;
  rope_positions_ = 0;
  rope_table_.clear();
  ExtendRopeTable(max_pos_);
}

void SequenceKV::ExtendRopeTable(int32_t max_pos) {
  if (!rope_set_ || !codec_.pre_rope || max_pos < rope_positions_) return;
  rope_table_.resize(static_cast<size_t>(max_pos + 1) * rope_.n_dims);
  for (int32_t p = rope_positions_; p <= max_pos; ++p) {
    ops::RopeCosSin(p, rope_, rope_table_.data() + static_cast<size_t>(p) * rope_.n_dims);
  }
  rope_positions_ = max_pos + 1;
}

Status SequenceKV::Append(int layer, int n, const int32_t* pos, const float* k, const float* v,
                          ThreadPool* threads) {
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && n >= 0);
  if (n == 0) return Status::Ok();
  KVX_RETURN_IF_ERROR(EnsureSizeClasses());
  const int H = layout_.n_kv_heads, D = layout_.head_dim;
  for (int i = 0; i < n; ++i) {
    if (pos[i] == kDeadPosition) return InvalidArgument("position " + std::to_string(pos[i]) + " marks dead slots");
  }
  if (codec_.pre_rope) {
    for (int i = 0; i < n; ++i) {
      if (pos[i] < 0 || pos[i] >= kMaxPreRopePosition) {
        return InvalidArgument("position " + std::to_string(pos[i]) + " is outside 0.." +
                               std::to_string(kMaxPreRopePosition - 1) + " supported with pre-RoPE keys");
      }
    }
  }

  // 1. Every page this call needs (new pages, packed pages for staging
  //    pages that get sealed, copies of shared partially filled last pages)
  //    was allocated by Reserve() before the step, or is allocated now, before
  //    anything is written, so exhaustion leaves the sequence unchanged.
  //    WriteHead consumes them in the same order.
  Reservation& r = reserved_[layer];
  if (r.n != n) {
    CancelReservation(layer);
    KVX_RETURN_IF_ERROR(PlanLayer(layer, n, &r));
  }

  // 2. Rotate (the whole chain lives in the rotated basis), then write.
  if (rotation_ != nullptr) {
    const size_t count = static_cast<size_t>(n) * H * D;
    rot_k_.assign(k, k + (keys_rotated() ? count : 0));
    rot_v_.assign(v, v + count);
    for (size_t r = 0; r < static_cast<size_t>(n) * H; ++r) {
      if (keys_rotated()) rotation_->Forward(&rot_k_[r * D]);
      rotation_->Forward(&rot_v_[r * D]);
    }
    if (keys_rotated()) k = rot_k_.data();
    v = rot_v_.data();
  }
  released_.resize(H);
  auto write_heads = [&](size_t h0, size_t h1, int) {
    for (size_t h = h0; h < h1; ++h) {
      size_t next_new = r.head_first[h];
      released_[h].clear();
      WriteHead(layer, static_cast<int>(h), n, pos, k, v, r, &next_new, &released_[h]);
      KVX_CHECK(next_new == r.head_first[h + 1]);
    }
  };
  if (threads != nullptr && threads->size() > 1 && H > 1) {
    threads->ParallelFor(static_cast<size_t>(H), write_heads);
  } else {
    write_heads(0, static_cast<size_t>(H), 0);
  }
  for (const std::vector<PageId>& ids : released_) {
    for (PageId id : ids) pool_->Unref(id);
  }
  r = Reservation{};

  if (codec_.pre_rope) {
    for (int i = 0; i < n; ++i) max_pos_ = std::max(max_pos_, pos[i]);
    ExtendRopeTable(max_pos_);
  }
  return Status::Ok();
}

Status SequenceKV::PlanLayer(int layer, int n, Reservation* r) {
  KVX_RETURN_IF_ERROR(EnsureSizeClasses());
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens, H = layout_.n_kv_heads;
  r->pages.clear();
  r->head_first.assign(H + 1, 0);
  r->cow.assign(H, 0);
  for (int h = 0; h < H; ++h) {
    r->head_first[h] = r->pages.size();
    const PageTable& t = table(layer, h);
    const int len = t.length(), len2 = len + n, np = t.num_pages(), np2 = (len2 + T - 1) / T;
    // The page before p once this call is done (a new page, or the table's):
    // new pages go right after it when possible, so the table's pages form
    // runs that decode streams through (see "Locality" in block_pool.h).
    const int first_mutable = FirstMutablePage(lc, t, len);
    PageId before = first_mutable > 0 && first_mutable - 1 < np ? t.pages()[first_mutable - 1] : kNoPage;
    for (int p = first_mutable; p < np2; ++p) {
      const bool full2 = lc.IsFullPage(p, len2);
      int cls = -1;
      if (p >= np) {
        cls = SizeClass(layer, full2);
      } else if (t.is_full(p) && !full2) {
        cls = SizeClass(layer, false);  // seal
      } else if (p == np - 1 && len % T != 0 && pool_->IsShared(t.pages()[p])) {
        cls = SizeClass(layer, t.is_full(p));  // copy-on-write
        r->cow[h] = 1;
      }
      if (cls < 0) {
        before = t.pages()[p];
        continue;
      }
      Result<PageId> page = pool_->AllocateAfter(cls, before);
      if (!page.ok()) {
        for (PageId id : r->pages) pool_->Unref(id);
        *r = Reservation{};
        return page.status();
      }
      r->pages.push_back(*page);
      before = *page;
    }
  }
  r->head_first[H] = r->pages.size();
  r->n = n;
  return Status::Ok();
}

Status SequenceKV::Reserve(int n) {
  KVX_CHECK(n >= 0);
  CancelReservation();
  if (n == 0) return Status::Ok();
  for (int l = 0; l < layout_.n_layers; ++l) {
    Status s = PlanLayer(l, n, &reserved_[l]);
    if (!s.ok()) {
      CancelReservation();
      return s;
    }
  }
  return Status::Ok();
}

void SequenceKV::CancelReservation(int layer) {
  const int l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? layout_.n_layers : layer + 1;
  for (int l = l0; l < l1; ++l) {
    for (PageId id : reserved_[l].pages) pool_->Unref(id);
    reserved_[l] = Reservation{};
  }
}

int64_t SequenceKV::ReservedPages() const {
  int64_t n = 0;
  for (const Reservation& r : reserved_) n += static_cast<int64_t>(r.pages.size());
  return n;
}

void SequenceKV::WriteHead(int layer, int h, int n, const int32_t* pos, const float* k, const float* v,
                           const Reservation& r, size_t* next_new, std::vector<PageId>* released) {
  const LayerCodec& lc = layers_[layer];
  const CodecParams& params = lc.params;
  const int T = layout_.page_tokens, H = layout_.n_kv_heads, D = layout_.head_dim;
  PageTable& t = mutable_table(layer, h);
  const int len = t.length(), len2 = len + n, np = t.num_pages(), np2 = (len2 + T - 1) / T;
  std::vector<float> tile_k, tile_v;  // one page of rows being sealed
  // Input row of entry e (len <= e < len2).
  auto k_row = [&](int e) { return k + (static_cast<size_t>(e - len) * H + h) * D; };
  auto v_row = [&](int e) { return v + (static_cast<size_t>(e - len) * H + h) * D; };
  const int first_mutable = FirstMutablePage(lc, t, len);
  thread_local std::vector<int> written;  // pages given rows or sealed, for their bounds
  written.clear();

  DispatchCodec(lc.id, [&](auto codec) {
    using C = decltype(codec);
    for (int p = first_mutable; p < np2; ++p) {
      const bool full2 = lc.IsFullPage(p, len2);
      const int first = p * T;
      const int old_rows = std::clamp(len - first, 0, T), new_rows = std::min(T, len2 - first);
      if (p < np && t.is_full(p) && !full2) {
        // Seal: rows 0..old_rows-1 from the staging page, the rest from the input.
        KVX_CHECK(new_rows == T);
        tile_k.resize(static_cast<size_t>(T) * D);
        tile_v.resize(static_cast<size_t>(T) * D);
        const PageId old = t.pages()[p];
        const uint8_t* src = pool_->PageData(old);
        F16Codec::DecodeKeys(params, src + PageDataOffset(T), old_rows, tile_k.data());
        F16Codec::DecodeValues(params, src + PageDataOffset(T), old_rows, tile_v.data());
        const PageId id = r.pages[(*next_new)++];
        uint8_t* dst = pool_->PageData(id);
        std::memcpy(PagePositions(dst), PagePositions(src), sizeof(int32_t) * old_rows);
        for (int s = old_rows; s < T; ++s) {
          PagePositions(dst)[s] = pos[first + s - len];
          std::memcpy(&tile_k[static_cast<size_t>(s) * D], k_row(first + s), sizeof(float) * D);
          std::memcpy(&tile_v[static_cast<size_t>(s) * D], v_row(first + s), sizeof(float) * D);
        }
        C::EncodePage(params, dst + PageDataOffset(T), T, tile_k.data(), tile_v.data());
        released->push_back(old);
        t.ReplacePage(p, id, false);
        written.push_back(p);
        continue;
      }
      KVX_CHECK(p >= np || t.is_full(p) == full2);  // pages never return to f16
      if (new_rows <= old_rows) continue;           // untouched page
      written.push_back(p);
      uint8_t* page = nullptr;
      if (p >= np) {
        const PageId id = r.pages[(*next_new)++];
        t.AddPage(id, full2);
        page = pool_->PageData(id);
      } else {
        const PageId cur = t.pages()[p];
        if (p == np - 1 && r.cow[h]) {  // copy-on-write, as planned (the page may have
                                        // stopped being shared since: copying is still right)
          const PageId copy = r.pages[(*next_new)++];
          std::memcpy(pool_->PageData(copy), pool_->PageData(cur), pool_->PageBytesOf(cur));
          released->push_back(cur);
          t.ReplacePage(p, copy, full2);
        }
        page = pool_->PageData(t.pages()[p]);
      }
      for (int s = old_rows; s < new_rows; ++s) PagePositions(page)[s] = pos[first + s - len];
      uint8_t* data = page + PageDataOffset(T);
      if (!full2 && lc.sealed) {
        // A whole page that is already outside the residual window: encode it
        // from the input directly, never staged.
        KVX_CHECK(old_rows == 0 && new_rows == T);
        tile_k.resize(static_cast<size_t>(T) * D);
        tile_v.resize(static_cast<size_t>(T) * D);
        for (int s = 0; s < T; ++s) {
          std::memcpy(&tile_k[static_cast<size_t>(s) * D], k_row(first + s), sizeof(float) * D);
          std::memcpy(&tile_v[static_cast<size_t>(s) * D], v_row(first + s), sizeof(float) * D);
        }
        C::EncodePage(params, data, T, tile_k.data(), tile_v.data());
      } else if (full2) {
        for (int s = old_rows; s < new_rows; ++s) F16Codec::EncodeRow(params, data, s, k_row(first + s), v_row(first + s));
      } else {
        if constexpr (C::kRowWise) {
          for (int s = old_rows; s < new_rows; ++s) C::EncodeRow(params, data, s, k_row(first + s), v_row(first + s));
        } else {
          KVX_CHECK_MSG(false, "page codec without sealing");
        }
      }
    }
  });
  t.Grow(len2, T);
  if (t.bounds_dim() > 0) {
    // The pages this call wrote (new rows, seals): their bounds from the keys
    // as encoded, so they bound what attention reads, whatever the codec.
    for (int p : written) RefreshBounds(layer, t, p);
  }
}

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
  if (selection.enabled && codec_.pre_rope) {
    return InvalidArgument("Quest page selection needs post-RoPE keys: the stored pre-RoPE keys are not what "
                           "attention dots with; drop prerope=1 or the quest policy");
  }
  if (selection.enabled && selection.PagesFor(layout_.page_tokens) < selection.sink_pages + selection.recent_pages) {
    return InvalidArgument("Quest selection " + selection.ToString() + " reads fewer pages than it forces (" +
                           "sink_pages + recent_pages); raise the budget");
  }
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
    pruned::Decode(*fc.kept, T, D, data, slot + 1, kk.data(), vv.data());
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

}  // namespace kvx::kv

namespace kvx::kv {

int SequenceKV::LiveEntries(int layer, int kv_head) const { return table(layer, kv_head).live(); }

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

Status SequenceKV::MakePagesPrivate(PageTable& t, const std::vector<int>& pages) {
  // Allocate every copy first, so a full pool changes nothing.
  std::vector<std::pair<int, PageId>> copies;
  for (int p : pages) {
    if (!pool_->IsShared(t.pages()[p])) continue;
    Result<PageId> copy = pool_->AllocateAfter(pool_->SizeClassOf(t.pages()[p]), t.pages()[p]);
    if (!copy.ok()) {
      for (auto& c : copies) pool_->Unref(c.second);
      return copy.status();
    }
    copies.emplace_back(p, *copy);
  }
  for (auto& [p, copy] : copies) {
    const PageId cur = t.pages()[p];
    std::memcpy(pool_->PageData(copy), pool_->PageData(cur), pool_->PageBytesOf(cur));
    t.ReplacePage(p, copy, t.format(p));
    pool_->Unref(cur);
  }
  return Status::Ok();
}

Status SequenceKV::SetPositions(int layer, int kv_head, const std::vector<int>& slots,
                                const std::vector<int32_t>& positions) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  if (slots.size() != positions.size()) return InvalidArgument("SetPositions: slots and positions differ in length");
  PageTable& t = mutable_table(layer, kv_head);
  const int T = layout_.page_tokens;
  std::vector<int> pages;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int slot = slots[i];
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " + std::to_string(t.length()));
    }
    if (PagePositions(pool_->PageData(t.pages()[slot / T]))[slot % T] == kDeadPosition) {
      return InvalidArgument("slot " + std::to_string(slot) + " is dead; only live entries get new positions");
    }
    if (positions[i] < 0 || positions[i] == kDeadPosition || positions[i] > max_pos_) {
      return InvalidArgument("position " + std::to_string(positions[i]) + " is outside 0.." + std::to_string(max_pos_) +
                             " (the positions appended so far)");
    }
    pages.push_back(slot / T);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, pages));
  for (size_t i = 0; i < slots.size(); ++i) {
    PagePositions(pool_->PageData(t.pages()[slots[i] / T]))[slots[i] % T] = positions[i];
  }
  return Status::Ok();
}

Status SequenceKV::RemoveEntries(int layer, int kv_head, const std::vector<int>& slots) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  PageTable& t = mutable_table(layer, kv_head);
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens;
  // Group the live slots to kill by page.
  std::vector<std::pair<int, int>> kills;  // (page, slot in page)
  for (int slot : slots) {
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " +
                             std::to_string(t.length()) + " slots");
    }
    const int p = slot / T, s = slot % T;
    if (PagePositions(pool_->PageData(t.pages()[p]))[s] == kDeadPosition) continue;
    kills.emplace_back(p, s);
  }
  std::sort(kills.begin(), kills.end());
  kills.erase(std::unique(kills.begin(), kills.end()), kills.end());
  if (kills.empty()) return Status::Ok();
  // Pages that keep live entries need a private copy (when shared) before
  // their positions change; pages about to leave the chain do not.
  std::vector<int> kept;
  for (size_t i = 0; i < kills.size();) {
    const int p = kills[i].first;
    size_t j = i;
    while (j < kills.size() && kills[j].first == p) ++j;
    const int left = t.live_in_page(p) - static_cast<int>(j - i);
    if (left != 0 || p < lc.sink_pages) kept.push_back(p);
    i = j;
  }
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, kept));
  // Count the kills first: a page about to leave the chain is not written
  // (it may be shared, and was not copied).
  for (const auto& [p, s] : kills) t.KillSlot(p);
  for (const auto& [p, s] : kills) {
    if (t.live_in_page(p) == 0 && p >= lc.sink_pages) continue;
    PagePositions(pool_->PageData(t.pages()[p]))[s] = kDeadPosition;
  }
  // Emptied pages leave the chain at once (last first, so indices hold);
  // sink pages stay, as the codec rules count them by index.
  for (int p = t.num_pages() - 1; p >= lc.sink_pages; --p) {
    if (t.live_in_page(p) != 0) continue;
    const PageId id = t.pages()[p];
    t.RemovePage(p, T);
    pool_->Unref(id);
  }
  return Status::Ok();
}

Status SequenceKV::Compact(int layer, int kv_head) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  PageTable& t = mutable_table(layer, kv_head);
  // A table sharing pages with another layer's (ShareEntries) is left as it
  // is: compacting would copy the shared pages into private ones, and its
  // runs are already dense but for one padded page per run.
  if (t.has_entry_scales()) return Status::Ok();
  const LayerCodec& lc = layers_[layer];
  const int T = layout_.page_tokens, D = layout_.head_dim;
  // The region that can be rewritten: after the sink pages, before the
  // staging pages of a sealed layer (they seal as they are) or, for
  // row-wise codecs, before the last page (appends still write into it).
  int end = FirstMutablePage(lc, t, t.length());
  if (!lc.sealed) end = std::min(end, t.num_pages() - 1);
  int first = lc.sink_pages;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  DecodedPage dp;
  // Runs of source pages whose live entries fill at most kCompactRunPages
  // new pages, each written and swapped in before the next: the new pages
  // of a run are allocated before its sources are freed, so a pool that is
  // nearly full (a policy compressing a context that filled its budget)
  // needs only a run's worth of free pages, not the whole table's.
  while (first < end) {
    while (first < end && t.live_in_page(first) == T) ++first;  // already dense
    int last = first, live = 0;
    // A run holds pages of one format (demoted pages pack among themselves).
    while (last < end && t.format(last) == t.format(first) && live + t.live_in_page(last) <= kCompactRunPages * T) {
      live += t.live_in_page(last++);
    }
    if (last - first < 2) {
      first = last;
      continue;
    }
    const int n_new = (live + T - 1) / T;
    if (n_new >= last - first) {  // nothing to gain in this run
      first = last;
      continue;
    }
    const PageFormat format = t.format(first);
    const FormatCodec fc = format_codec(layer, format, kv_head);
    std::vector<PageId> ids;
    PageId before = first > 0 ? t.pages()[first - 1] : kNoPage;
    for (int i = 0; i < n_new; ++i) {
      Result<PageId> id = pool_->AllocateAfter(pool_->SizeClassOf(t.pages()[first]), before);
      if (!id.ok()) {
        for (PageId x : ids) pool_->Unref(x);
        return id.status();
      }
      ids.push_back(*id);
      before = *id;
    }
    // Gather the run's live entries in chain order (their stored form
    // decoded: rotated, pre-RoPE keys un-roped, as they were encoded).
    k.clear();
    v.clear();
    pos.clear();
    for (int p = first; p < last; ++p) {
      DecodePage(*pool_, fc, t.pages()[p], T, &dp);
      for (int s = 0; s < T; ++s) {
        if (dp.pos[s] == kDeadPosition) continue;
        pos.push_back(dp.pos[s]);
        k.insert(k.end(), dp.k.begin() + static_cast<size_t>(s) * D, dp.k.begin() + static_cast<size_t>(s + 1) * D);
        v.insert(v.end(), dp.v.begin() + static_cast<size_t>(s) * D, dp.v.begin() + static_cast<size_t>(s + 1) * D);
      }
    }
    KVX_CHECK(static_cast<int>(pos.size()) == live);
    // Pad the last page's dead slots with copies of the last live entry (a
    // page codec's per-channel ranges then see no made-up values).
    std::vector<int> lives;
    for (int i = 0; i < n_new; ++i) lives.push_back(std::min(T, live - i * T));
    while (static_cast<int>(pos.size()) < n_new * T) {
      pos.push_back(kDeadPosition);
      k.insert(k.end(), k.end() - D, k.end());
      v.insert(v.end(), v.end() - D, v.end());
    }
    for (int i = 0; i < n_new; ++i) {
      const size_t off = static_cast<size_t>(i) * T;
      EncodeInto(pool_, fc, ids[i], T, &k[off * D], &v[off * D], &pos[off]);
    }
    std::vector<PageId> old(t.pages().begin() + first, t.pages().begin() + last);
    t.ReplaceRun(first, last, ids, format, lives, T);
    for (PageId id : old) pool_->Unref(id);
    if (t.bounds_dim() > 0) {
      for (int i = 0; i < n_new; ++i) RefreshBounds(layer, t, first + i);
    }
    end -= (last - first) - n_new;
    first += n_new;  // a partial last page stays as it is (no second re-encoding)
  }
  return Status::Ok();
}

Result<std::unique_ptr<SequenceKV>> SequenceKV::ForkPrefix(int n_slots) const {
  KVX_CHECK(ReservedPages() == 0);
  for (const PageTable& t : tables_) {
    if (n_slots < 0 || n_slots > t.length()) {
      return InvalidArgument("prefix of " + std::to_string(n_slots) + " slots is outside a chain of " +
                             std::to_string(t.length()));
    }
  }
  auto copy = EmptyCopy();
  const int T = layout_.page_tokens;
  for (int l = 0; l < layout_.n_layers; ++l) {
    const LayerCodec& lc = layers_[l];
    for (int h = 0; h < layout_.n_kv_heads; ++h) {
      const PageTable& src = table(l, h);
      PageTable& t = copy->mutable_table(l, h);
      t = src;
      t.Truncate(n_slots, T);
      const int np = t.num_pages(), rest = n_slots % T;
      for (int p = 0; p < np; ++p) pool_->Ref(t.pages()[p]);
      if (rest == 0) continue;
      // The partial last page: count its live slots; a sealed packed page
      // cannot take more rows, so its first `rest` entries move to an f16
      // staging page (the others share the page, copied on write).
      const int p = np - 1;
      const PageId id = t.pages()[p];
      const int32_t* pos = PagePositions(pool_->PageData(id));
      int live = 0;
      for (int s = 0; s < rest; ++s) live += pos[s] != kDeadPosition;
      t.SetPageLive(p, live);
      // The page's bounds covered all its slots; the fork's, only the first `rest`.
      if (t.bounds_dim() > 0) copy->RefreshBounds(l, t, p);
      // A demoted page (whole, in its own codec) is re-encoded the same way,
      // into the format the layer's appends write (f16 staging when sealed).
      const PageFormat format = t.format(p);
      if (format == kPageFull || (format == kPagePacked && !lc.sealed)) continue;
      const PageFormat target = lc.sealed ? kPageFull : kPagePacked;
      Result<PageId> staged =
          pool_->AllocateAfter(copy->FormatSizeClass(l, target), p > 0 ? t.pages()[p - 1] : kNoPage);
      if (!staged.ok()) return staged.status();  // ~SequenceKV drops every reference taken so far
      DecodedPage dp;
      DecodePage(*pool_, format_codec(l, format, h), id, T, &dp);
      EncodeInto(pool_, format_codec(l, target), *staged, rest, dp.k.data(), dp.v.data(), dp.pos.data());
      t.ReplacePage(p, *staged, target);
      pool_->Unref(id);
      if (t.bounds_dim() > 0) copy->RefreshBounds(l, t, p);
    }
  }
  return copy;
}

Status SequenceKV::CheckTables() const {
  const int T = layout_.page_tokens;
  for (int l = 0; l < layout_.n_layers; ++l) {
    const LayerCodec& lc = layers_[l];
    for (int h = 0; h < layout_.n_kv_heads; ++h) {
      const PageTable& t = table(l, h);
      const std::string where = "table (layer " + std::to_string(l) + ", kv head " + std::to_string(h) + ")";
      if (t.num_pages() != (t.length() + T - 1) / T) return Internal(where + ": page count does not cover the slots");
      int live = 0;
      for (int p = 0; p < t.num_pages(); ++p) {
        const PageId id = t.pages()[p];
        if (pool_->RefCount(id) <= 0) return Internal(where + ": page " + std::to_string(id) + " is free");
        const int cls = FormatSizeClass(l, t.format(p), h);
        if (cls >= 0 && pool_->SizeClassOf(id) != cls) return Internal(where + ": page of the wrong size class");
        const int32_t* pos = PagePositions(pool_->PageData(id));
        int n = 0;
        for (int s = 0; s < t.EntriesInPage(p, T); ++s) n += pos[s] != kDeadPosition;
        if (n != t.live_in_page(p)) {
          return Internal(where + ": page " + std::to_string(p) + " counts " + std::to_string(t.live_in_page(p)) +
                          " live entries, holds " + std::to_string(n));
        }
        if (n == 0 && p >= lc.sink_pages) return Internal(where + ": an empty page stayed in the chain");
        live += n;
      }
      if (live != t.live()) return Internal(where + ": live count out of step");
    }
  }
  return Status::Ok();
}

void SequenceKV::ForEachPage(const std::function<void(PageId)>& fn) const {
  for (const PageTable& t : tables_) {
    for (PageId id : t.pages()) fn(id);
  }
  for (const Reservation& r : reserved_) {
    for (PageId id : r.pages) fn(id);
  }
}

}  // namespace kvx::kv

namespace kvx::kv {

Status SequenceKV::RewriteEntries(int layer, int kv_head, const std::vector<int>& slots, const float* k,
                                  const float* v) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  PageTable& t = mutable_table(layer, kv_head);
  const int T = layout_.page_tokens, D = layout_.head_dim;
  std::vector<int> pages;  // touched, ascending
  for (int slot : slots) {
    if (slot < 0 || slot >= t.length()) {
      return InvalidArgument("slot " + std::to_string(slot) + " is outside the chain of " + std::to_string(t.length()));
    }
    if (PagePositions(pool_->PageData(t.pages()[slot / T]))[slot % T] == kDeadPosition) {
      return InvalidArgument("slot " + std::to_string(slot) + " holds no live entry to rewrite");
    }
    pages.push_back(slot / T);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  // Private copies of shared pages first (all or nothing).
  KVX_RETURN_IF_ERROR(MakePagesPrivate(t, pages));
  // Each touched page: decode, replace the rows (in the stored basis), re-encode in place.
  std::vector<float> row_k(D), row_v(D);
  DecodedPage dp;
  for (int p : pages) {
    const FormatCodec fc = format_codec(layer, t.format(p), kv_head);
    const int n = fc.whole_pages ? T : t.EntriesInPage(p, T);
    DecodePage(*pool_, fc, t.pages()[p], n, &dp);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] / T != p) continue;
      std::memcpy(row_k.data(), k + i * D, sizeof(float) * D);
      std::memcpy(row_v.data(), v + i * D, sizeof(float) * D);
      if (rotation_ != nullptr) {
        if (keys_rotated()) rotation_->Forward(row_k.data());
        rotation_->Forward(row_v.data());
      }
      const size_t s = static_cast<size_t>(slots[i] % T);
      std::copy(row_k.begin(), row_k.end(), dp.k.begin() + s * D);
      std::copy(row_v.begin(), row_v.end(), dp.v.begin() + s * D);
    }
    EncodeInto(pool_, fc, t.pages()[p], n, dp.k.data(), dp.v.data(), dp.pos.data());
    if (t.bounds_dim() > 0) RefreshBounds(layer, t, p);
  }
  if (t.has_entry_scales()) {  // the rows given are what attention reads: stored as they are
    for (int slot : slots) t.SetEntryScales(slot, 1.0f, 1.0f);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
