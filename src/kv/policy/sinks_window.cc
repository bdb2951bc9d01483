#include "kv/policy/sinks_window.h"

#include <vector>

#include "kv/codec/codec_id.h"

namespace kvx::kv {

Result<bool> TrimToSinksAndWindow(KVManager& manager, SeqId seq, int sinks, int window,
                                  const std::function<bool(int layer, int kv_head)>& trimmed) {
  SequenceKV& kv = manager.kv(seq);
  const KVLayout& L = kv.layout();
  const int keep = sinks + window;
  bool removed = false;
  std::vector<int> drop;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      if (trimmed && !trimmed(l, h)) continue;
      const int live = kv.LiveEntries(l, h);
      if (live <= keep) continue;
      // Live entries in chain order: the first `sinks` stay, the next live - keep go.
      const PageTable& t = kv.table(l, h);
      int to_drop = live - keep, seen = 0;
      drop.clear();
      for (int s = 0; s < t.length() && to_drop > 0; ++s) {
        const int32_t pos = PagePositions(kv.pool().PageData(t.pages()[s / L.page_tokens]))[s % L.page_tokens];
        if (pos == kDeadPosition || seen++ < sinks) continue;
        drop.push_back(s);
        --to_drop;
      }
      KVX_RETURN_IF_ERROR(kv.RemoveEntries(l, h, drop));
      removed = true;
    }
  }
  if (removed) manager.MarkEntriesRemoved(seq);
  return removed;
}

}  // namespace kvx::kv
