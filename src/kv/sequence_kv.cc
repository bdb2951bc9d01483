// SequenceKV: construction, sizing, forks and the append path (Reserve,
// Append, the per-head page writes). The other members live beside it, each
// file named for what it holds: sequence_kv_read.cc (decoding entries back),
// sequence_kv_edit.cc (the single-table mutators policies call: remove,
// compact, rewrite, re-position), sequence_kv_bounds.cc (Quest page bounds),
// sequence_kv_formats.cc (page formats, MiKV demotion), sequence_kv_prune.cc
// (ThinK), sequence_kv_share.cc (MiniCache) and sequence_kv_import.cc
// (session files).
#include "kv/sequence_kv.h"

#include <algorithm>
#include <cstring>

#include "kv/codec/codecs.h"
#include "kv/sequence_kv_pages.h"
#include "util/check.h"

namespace kvx::kv {

size_t PageBytes(std::span<const LayerCodec> layers) {
  size_t most = 0;
  for (const LayerCodec& lc : layers) {
    most = std::max(most, lc.packed_page_bytes);
    if (lc.sealed || lc.sink_pages > 0) most = std::max(most, lc.full_page_bytes);
  }
  return most;
}

size_t BytesPerToken(const KVLayout& layout, std::span<const LayerCodec> layers) {
  size_t total = 0;
  for (const LayerCodec& lc : layers) total += lc.packed_page_bytes * layout.n_kv_heads;
  return (total + layout.page_tokens - 1) / layout.page_tokens;
}

uint64_t BytesForContext(const KVLayout& layout, std::span<const LayerCodec> layers, int64_t n_ctx) {
  const int64_t T = layout.page_tokens;
  const int64_t pages = (n_ctx + T - 1) / T;
  uint64_t total = 0;
  for (const LayerCodec& lc : layers) {
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

uint64_t BudgetForContext(const KVLayout& layout, std::span<const LayerCodec> layers, int64_t n_ctx) {
  uint64_t total = BytesForContext(layout, layers, n_ctx);
  if (n_ctx == 0) return 0;
  for (const LayerCodec& lc : layers) {
    if (!lc.sealed) continue;
    // Staging pages being sealed are freed only after their packed page is
    // written; at most residual/T + 2 of them per head at a time.
    const uint64_t staging = static_cast<uint64_t>((lc.residual + layout.page_tokens - 1) / layout.page_tokens + 2);
    total += staging * lc.full_page_bytes * static_cast<uint64_t>(layout.n_kv_heads);
  }
  return total;
}

// The same, resolving the codec first.
size_t PageBytes(const KVLayout& layout, const CodecConfig& codec) { return PageBytes(ResolveLayers(layout, codec)); }
size_t BytesPerToken(const KVLayout& layout, const CodecConfig& codec) {
  return BytesPerToken(layout, ResolveLayers(layout, codec));
}
uint64_t BytesForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx) {
  return BytesForContext(layout, ResolveLayers(layout, codec), n_ctx);
}
uint64_t BudgetForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx) {
  return BudgetForContext(layout, ResolveLayers(layout, codec), n_ctx);
}

size_t ExtentBytesFor(const KVLayout& layout, uint64_t budget, int n_seqs) {
  const uint64_t tables =
      static_cast<uint64_t>(std::max(n_seqs, 1)) * std::max(layout.n_layers, 1) * std::max(layout.n_kv_heads, 1);
  return static_cast<size_t>(std::clamp<uint64_t>(budget / tables, 1, kMaxExtentBytes));
}

SequenceKV::SequenceKV(BlockPool* pool, const KVLayout& layout, const CodecConfig& codec,
                       std::vector<LayerCodec> layers)
    : pool_(pool), layout_(layout), codec_(codec), layers_(std::move(layers)) {
  KVX_CHECK(pool_ != nullptr);
  KVX_CHECK(layout_.Validate().ok());
  KVX_CHECK(static_cast<int>(layers_.size()) == layout_.n_layers);
  KVX_CHECK_MSG(pool_->page_bytes() >= PageBytes(layers_), "pool pages are too small for this codec");
  size_class_.assign(2 * static_cast<size_t>(layout_.n_layers), -1);
  tables_.resize(static_cast<size_t>(layout_.n_layers) * layout_.n_kv_heads);
  kept_channels_.resize(tables_.size());
  reserved_.resize(layout_.n_layers);
  if (codec_.rotation != Rotation::kNone) rotation_ = std::make_unique<HadamardRotation>(layout_.head_dim);
}

SequenceKV::SequenceKV(BlockPool* pool, const KVLayout& layout, const CodecConfig& codec)
    : SequenceKV(pool, layout, codec, ResolveLayers(layout, codec)) {}

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
  auto copy = std::make_unique<SequenceKV>(pool_, layout_, codec_, layers_);
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
  const AppendRows rows{this, n, pos, k, v};
  return AppendBatch(layer, {&rows, 1}, threads);
}

Status SequenceKV::AppendBatch(int layer, std::span<const AppendRows> items, ThreadPool* threads) {
  // 1. Checks, pages and rotation, item by item on this thread (the pool is
  //    not thread-safe).
  // Reused across calls; the references let the workers below see the
  // caller's vectors (a thread_local named in a lambda is each thread's own).
  thread_local std::vector<AppendRows> tls_ready;
  thread_local std::vector<size_t> tls_first_task;
  std::vector<AppendRows>& ready = tls_ready;  // the rows to store, rotated
  std::vector<size_t>& first_task = tls_first_task;  // [items + 1]: each item's first (item, head) task
  ready.assign(items.begin(), items.end());
  first_task.assign(1, 0);
  for (AppendRows& r : ready) {
    KVX_RETURN_IF_ERROR(r.kv->PrepareAppend(layer, r.n, r.pos, &r.k, &r.v));
    first_task.push_back(first_task.back() + (r.n > 0 ? static_cast<size_t>(r.kv->layout_.n_kv_heads) : 0));
  }
  // 2. Every (item, head) write, in one parallel loop: a prompt's append was
  //    4% of prefill on the caller alone while the other threads waited.
  auto write = [&](size_t b, size_t e, int) {
    size_t i = static_cast<size_t>(std::upper_bound(first_task.begin(), first_task.end(), b) - first_task.begin()) - 1;
    for (size_t task = b; task < e; ++task) {
      while (task >= first_task[i + 1]) ++i;
      const AppendRows& r = ready[i];
      r.kv->WriteAppendHead(layer, static_cast<int>(task - first_task[i]), r.n, r.pos, r.k, r.v);
    }
  };
  const size_t n_tasks = first_task.back();
  if (threads != nullptr && threads->size() > 1 && n_tasks > 1) {
    threads->ParallelFor(n_tasks, write);
  } else {
    write(0, n_tasks, 0);
  }
  // 3. The replaced pages back to the pool.
  for (const AppendRows& r : ready) {
    if (r.n > 0) r.kv->FinishAppend(layer, r.n, r.pos);
  }
  return Status::Ok();
}

Status SequenceKV::PrepareAppend(int layer, int n, const int32_t* pos, const float** k, const float** v) {
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

  // Every page this call needs (new pages, packed pages for staging pages
  // that get sealed, copies of shared partially filled last pages) was
  // allocated by Reserve() before the step, or is allocated now, before
  // anything is written, so exhaustion leaves the sequence unchanged.
  // WriteHead consumes them in the same order.
  Reservation& r = reserved_[layer];
  if (r.n != n) {
    CancelReservation(layer);
    KVX_RETURN_IF_ERROR(PlanLayer(layer, n, &r));
  }

  // Rotate (the whole chain lives in the rotated basis).
  if (rotation_ != nullptr) {
    const size_t count = static_cast<size_t>(n) * H * D;
    rot_k_.assign(*k, *k + (keys_rotated() ? count : 0));
    rot_v_.assign(*v, *v + count);
    for (size_t row = 0; row < static_cast<size_t>(n) * H; ++row) {
      if (keys_rotated()) rotation_->Forward(&rot_k_[row * D]);
      rotation_->Forward(&rot_v_[row * D]);
    }
    if (keys_rotated()) *k = rot_k_.data();
    *v = rot_v_.data();
  }
  released_.resize(H);
  return Status::Ok();
}

void SequenceKV::WriteAppendHead(int layer, int h, int n, const int32_t* pos, const float* k, const float* v) {
  const Reservation& r = reserved_[layer];
  size_t next_new = r.head_first[h];
  released_[h].clear();
  WriteHead(layer, h, n, pos, k, v, r, &next_new, &released_[h]);
  KVX_CHECK(next_new == r.head_first[h + 1]);
}

void SequenceKV::FinishAppend(int layer, int n, const int32_t* pos) {
  for (const std::vector<PageId>& ids : released_) {
    for (PageId id : ids) pool_->Unref(id);
  }
  reserved_[layer] = Reservation{};
  if (codec_.pre_rope) {
    for (int i = 0; i < n; ++i) max_pos_ = std::max(max_pos_, pos[i]);
    ExtendRopeTable(max_pos_);
  }
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
