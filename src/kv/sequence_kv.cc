#include "kv/sequence_kv.h"

#include <cstring>

#include "kv/codec/codecs.h"
#include "util/check.h"

namespace kvx::kv {

size_t PageBytes(const KVLayout& layout, CodecId codec) {
  return CodecPageBytes(codec, layout.page_tokens, layout.head_dim);
}

size_t BytesPerToken(const KVLayout& layout, CodecId codec) {
  const size_t total = PageBytes(layout, codec) * static_cast<size_t>(layout.n_layers) *
                       static_cast<size_t>(layout.n_kv_heads);
  return (total + layout.page_tokens - 1) / layout.page_tokens;
}

uint64_t BudgetForContext(const KVLayout& layout, CodecId codec, int64_t n_ctx) {
  const uint64_t pages_per_head = static_cast<uint64_t>((n_ctx + layout.page_tokens - 1) / layout.page_tokens);
  return pages_per_head * static_cast<uint64_t>(layout.n_layers) * static_cast<uint64_t>(layout.n_kv_heads) *
         PageBytes(layout, codec);
}

SequenceKV::SequenceKV(BlockPool* pool, const KVLayout& layout, CodecId codec)
    : pool_(pool), layout_(layout), codec_(codec) {
  KVX_CHECK(pool_ != nullptr);
  KVX_CHECK(layout_.Validate().ok());
  KVX_CHECK_MSG(pool_->page_bytes() >= PageBytes(layout_, codec_), "pool pages are too small for this codec");
  tables_.resize(static_cast<size_t>(layout_.n_layers) * layout_.n_kv_heads);
}

SequenceKV::~SequenceKV() { Clear(); }

void SequenceKV::Clear() {
  for (PageTable& t : tables_) {
    for (PageId id : t.pages()) pool_->Unref(id);
    t.Reset();
  }
}

size_t SequenceKV::BytesInUse() const { return static_cast<size_t>(PagesInUse()) * pool_->page_bytes(); }

int64_t SequenceKV::PagesInUse() const {
  int64_t n = 0;
  for (const PageTable& t : tables_) n += t.num_pages();
  return n;
}

std::unique_ptr<SequenceKV> SequenceKV::Fork() const {
  auto copy = std::make_unique<SequenceKV>(pool_, layout_, codec_);
  copy->tables_ = tables_;
  for (const PageTable& t : tables_) {
    for (PageId id : t.pages()) pool_->Ref(id);
  }
  return copy;
}

Status SequenceKV::Append(int layer, int n, const int32_t* pos, const float* k, const float* v) {
  KVX_CHECK(layer >= 0 && layer < layout_.n_layers && n >= 0);
  if (n == 0) return Status::Ok();
  const int T = layout_.page_tokens;
  const int H = layout_.n_kv_heads;
  const int D = layout_.head_dim;

  // 1. Allocate every page this call needs (new pages plus copies of shared
  //    partially filled last pages) before writing anything, so exhaustion
  //    leaves the sequence unchanged.
  scratch_.clear();
  for (int h = 0; h < H; ++h) {
    const PageTable& t = table(layer, h);
    const int len = t.length();
    int need = (len + n + T - 1) / T - (len + T - 1) / T;
    if (len % T != 0 && pool_->IsShared(t.pages().back())) ++need;  // copy-on-write
    for (int i = 0; i < need; ++i) {
      Result<PageId> page = pool_->Allocate();
      if (!page.ok()) {
        for (PageId id : scratch_) pool_->Unref(id);
        scratch_.clear();
        return page.status();
      }
      scratch_.push_back(*page);
    }
  }

  // 2. Write. Pages come out of scratch_ in the order they were counted above.
  const size_t page_bytes = pool_->page_bytes();
  const size_t data_offset = PageDataOffset(T);
  size_t next_new = 0;
  DispatchCodec(codec_, [&](auto codec) {
    using C = decltype(codec);
    for (int h = 0; h < H; ++h) {
      PageTable& t = mutable_table(layer, h);
      int len = t.length();
      if (len % T != 0 && pool_->IsShared(t.pages().back())) {
        const PageId copy = scratch_[next_new++];
        const PageId old = t.pages().back();
        std::memcpy(pool_->PageData(copy), pool_->PageData(old), page_bytes);
        pool_->Unref(old);
        t.ReplacePage(t.num_pages() - 1, copy);
      }
      uint8_t* page = nullptr;
      for (int i = 0; i < n; ++i, ++len) {
        const int slot = len % T;
        if (slot == 0) {
          t.AddPage(scratch_[next_new++]);
          page = pool_->PageData(t.pages().back());
        } else if (page == nullptr) {
          page = pool_->PageData(t.pages().back());
        }
        const size_t off = (static_cast<size_t>(i) * H + h) * D;
        PagePositions(page)[slot] = pos[i];
        C::Encode(page + data_offset, T, D, slot, k + off, v + off);
      }
      t.set_length(len);
    }
  });
  KVX_CHECK(next_new == scratch_.size());
  scratch_.clear();
  return Status::Ok();
}

void SequenceKV::ReadEntry(int layer, int kv_head, int index, float* k, float* v, int32_t* pos) const {
  const PageTable& t = table(layer, kv_head);
  KVX_CHECK(index >= 0 && index < t.length());
  const int T = layout_.page_tokens;
  const uint8_t* page = pool_->PageData(t.pages()[index / T]);
  *pos = PagePositions(page)[index % T];
  DispatchCodec(codec_, [&](auto codec) {
    decltype(codec)::Decode(page + PageDataOffset(T), T, layout_.head_dim, index % T, k, v);
  });
}

}  // namespace kvx::kv
