// SequenceKV::ShareEntries: one run of pages listed by the tables of two
// layers (MiniCache's shared directions), each table reading it through its
// own entry scales (page_table.h). Kept apart from sequence_kv_edit.cc, which
// holds the single-table mutators.
#include <algorithm>
#include <cstring>
#include <string>

#include "kv/codec/codecs.h"
#include "kv/sequence_kv.h"
#include "util/check.h"

namespace kvx::kv {

Status CanShareAcrossLayers(const LayerCodec& a, const LayerCodec& b) {
  const char* works = "cross-layer sharing works with the row-wise codecs f32, f16, int8, int4, int2 (same codec "
                      "and bits in both layers, no residual=, sinks= or outliers=)";
  // sinks= and outliers= seal pages too: their own messages first, they name the cause.
  if (a.sink_pages > 0 || b.sink_pages > 0) {
    return InvalidArgument(std::string("codec sinks= keep f16 sink pages per layer; ") + works);
  }
  if (a.params.outliers > 0 || b.params.outliers > 0) {
    return InvalidArgument(std::string("codec outliers= keep per-page side entries; ") + works);
  }
  if (a.sealed || b.sealed) {
    return InvalidArgument(std::string("the layer codec seals pages (KIVI, or residual=): a shared page cannot "
                                       "follow two layers' staging windows; ") + works);
  }
  if (a.id != b.id || !(a.params == b.params)) {
    return InvalidArgument(std::string("the two layers use different codecs or bits (per-layer bits.L=): a shared "
                                       "page is in one encoding; ") + works);
  }
  return Status::Ok();
}

size_t SequenceKV::EntryScaleBytes() const {
  size_t n = 0;
  for (const PageTable& t : tables_) n += t.EntryScaleBytes();
  return n;
}

Status SequenceKV::ShareEntries(int layer_a, int layer_b, int kv_head, const SharedEntries& shared,
                                const std::vector<int>& keep_a, const std::vector<int>& keep_b) {
  KVX_CHECK_MSG(ReservedPages() == 0, "tables change only between steps");
  KVX_CHECK(layer_a >= 0 && layer_a < layout_.n_layers && layer_b >= 0 && layer_b < layout_.n_layers &&
            layer_a != layer_b && kv_head >= 0 && kv_head < layout_.n_kv_heads);
  KVX_RETURN_IF_ERROR(CanShareAcrossLayers(layers_[layer_a], layers_[layer_b]));
  if (selection_.enabled) {
    return InvalidArgument("cross-layer sharing with Quest page selection: the page bounds would bound the stored "
                           "directions, not the scaled keys; drop one of the two policies");
  }
  if (!kept_channels(layer_a, kv_head).empty() || !kept_channels(layer_b, kv_head).empty()) {
    return InvalidArgument("cross-layer sharing of key-channel-pruned tables (policy think): the shared pages "
                           "would need one channel mask for two layers; run minicache without think");
  }
  const int T = layout_.page_tokens, D = layout_.head_dim;
  const size_t n = shared.pos.size();
  if (shared.k.size() != n * D || shared.v.size() != n * D) {
    return InvalidArgument("ShareEntries: k and v must hold positions * head_dim floats");
  }
  for (int i = 0; i < 2; ++i) {
    if (shared.k_scale[i].size() != n || shared.v_scale[i].size() != n) {
      return InvalidArgument("ShareEntries: one key and one value scale per shared entry and layer");
    }
  }
  for (int32_t p : shared.pos) {
    if (p == kDeadPosition || (codec_.pre_rope && (p < 0 || p > max_pos_))) {
      return InvalidArgument("ShareEntries: position " + std::to_string(p) + " is not a position of this cache");
    }
  }
  const int layers[2] = {layer_a, layer_b};
  const std::vector<int>* keeps[2] = {&keep_a, &keep_b};

  // The kept entries as they read now (scales applied, rotation undone).
  std::vector<float> own_k[2], own_v[2];
  std::vector<int32_t> own_pos[2];
  {
    std::vector<float> ck, cv;
    std::vector<int32_t> cpos;
    for (int i = 0; i < 2; ++i) {
      ReadChain(layers[i], kv_head, &ck, &cv, &cpos);
      for (int slot : *keeps[i]) {
        if (slot < 0 || slot >= static_cast<int>(cpos.size()) || cpos[slot] == kDeadPosition) {
          return InvalidArgument("ShareEntries: slot " + std::to_string(slot) + " of layer " +
                                 std::to_string(layers[i]) + " holds no live entry");
        }
        own_pos[i].push_back(cpos[slot]);
        own_k[i].insert(own_k[i].end(), ck.begin() + static_cast<ptrdiff_t>(slot) * D, ck.begin() + static_cast<ptrdiff_t>(slot + 1) * D);
        own_v[i].insert(own_v[i].end(), cv.begin() + static_cast<ptrdiff_t>(slot) * D, cv.begin() + static_cast<ptrdiff_t>(slot + 1) * D);
      }
    }
  }

  // The pages of the new chains: the old pages only these two tables hold
  // (their entries are read above), reused in chain order, then new ones:
  // a pool that the context filled (a compression moment) has no room for
  // a second copy of the pair. Every page of the new set carries one
  // reference of ours (a reused page one more than its listings), taken
  // before anything is written, so a full pool changes nothing.
  KVX_RETURN_IF_ERROR(EnsureSizeClasses());
  const int cls = SizeClass(layer_a, false);
  const size_t n_shared = (n + T - 1) / T;
  const size_t need = n_shared + (own_pos[0].size() + T - 1) / T + (own_pos[1].size() + T - 1) / T;
  std::vector<PageId> listed;  // every listing of the two old chains
  for (int i = 0; i < 2; ++i) {
    const PageTable& t = table(layers[i], kv_head);
    listed.insert(listed.end(), t.pages().begin(), t.pages().end());
  }
  std::vector<PageId> ids;
  {
    std::vector<PageId> sorted = listed;
    std::sort(sorted.begin(), sorted.end());
    for (PageId id : listed) {  // chain order, each page once, held by these listings alone
      if (ids.size() == need) break;
      const auto range = std::equal_range(sorted.begin(), sorted.end(), id);
      const int32_t listings = static_cast<int32_t>(range.second - range.first);
      if (pool_->RefCount(id) != listings || pool_->SizeClassOf(id) != cls) continue;
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) continue;
      ids.push_back(id);
    }
  }
  const size_t reused = ids.size();
  while (ids.size() < need) {
    Result<PageId> id = pool_->AllocateAfter(cls, ids.empty() ? kNoPage : ids.back());
    if (!id.ok()) {
      for (size_t i = reused; i < ids.size(); ++i) pool_->Unref(ids[i]);
      return id.status();
    }
    ids.push_back(*id);
  }
  for (size_t i = 0; i < reused; ++i) pool_->Ref(ids[i]);

  // Writes rows [count][D] (ReadChain's form) at pages ids[first...], dead
  // slots padding the last page; returns the live count of each page.
  const LayerCodec& lc = layers_[layer_a];
  std::vector<float> row_k(D), row_v(D);
  auto write_run = [&](size_t first, const std::vector<int32_t>& pos, const float* k, const float* v) {
    std::vector<int> live;
    const size_t count = pos.size(), pages = (count + T - 1) / T;
    for (size_t p = 0; p < pages; ++p) {
      uint8_t* page = pool_->PageData(ids[first + p]);
      uint8_t* data = page + PageDataOffset(T);
      const size_t begin = p * T, end = std::min(count, begin + T);
      for (int s = 0; s < T; ++s) {
        const size_t e = std::min(begin + s, end - 1);  // dead slots: copies of the last live row
        PagePositions(page)[s] = begin + s < end ? pos[e] : kDeadPosition;
        std::memcpy(row_k.data(), k + e * D, sizeof(float) * D);
        std::memcpy(row_v.data(), v + e * D, sizeof(float) * D);
        if (rotation_ != nullptr) {
          if (keys_rotated()) rotation_->Forward(row_k.data());
          rotation_->Forward(row_v.data());
        }
        DispatchCodec(lc.id, [&](auto codec) {
          using C = decltype(codec);
          if constexpr (C::kRowWise) {
            C::EncodeRow(lc.params, data, s, row_k.data(), row_v.data());
          } else {
            KVX_CHECK_MSG(false, "cross-layer sharing needs a row-wise codec");
          }
        });
      }
      live.push_back(static_cast<int>(end - begin));
    }
    return live;
  };
  const std::vector<int> shared_live = write_run(0, shared.pos, shared.k.data(), shared.v.data());
  size_t next = n_shared;
  for (int i = 0; i < 2; ++i) {
    const std::vector<int> own_live = write_run(next, own_pos[i], own_k[i].data(), own_v[i].data());
    PageTable& t = mutable_table(layers[i], kv_head);
    t.Reset();
    t.EnableEntryScales(T);
    auto add = [&](size_t first, const std::vector<int>& live) {
      for (size_t p = 0; p < live.size(); ++p) {
        t.AddPage(ids[first + p], false);
        t.Grow((t.num_pages() - 1) * T + T, T);
        t.SetPageLive(t.num_pages() - 1, live[p]);
      }
    };
    add(0, shared_live);
    for (size_t j = 0; j < n; ++j) t.SetEntryScales(static_cast<int>(j), shared.k_scale[i][j], shared.v_scale[i][j]);
    add(next, own_live);
    if (i == 1) {
      for (size_t p = 0; p < n_shared; ++p) pool_->Ref(ids[p]);  // the second table's reference
    }
    next += own_live.size();
  }
  for (PageId id : listed) pool_->Unref(id);  // the old chains' references (reused pages keep ours)
  return Status::Ok();
}

}  // namespace kvx::kv
