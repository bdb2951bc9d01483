#include "eval/prefill_cache.h"

#include <algorithm>
#include <cstring>

namespace kvx::eval {

int SharedPrefixLength(std::optional<int> prompt_window, int fed, int n_batch) {
  if (!prompt_window.has_value() || *prompt_window > n_batch || fed <= 0 || n_batch <= 0) return 0;
  const int calls = (fed + n_batch - 1) / n_batch;
  // The last call may hold fewer queries than the window: the call before
  // it, a whole n_batch, runs again too. (Policies without a window could
  // share one call more, but then their prefixes would not be the ones the
  // windowed specs of the same codec store and find.)
  return std::max(0, calls - 2) * n_batch;
}

std::string PrefillCache::PageKey(const kv::KVSpec& spec) {
  kv::KVSpec pages = spec;
  pages.policies.clear();
  pages.budget_bytes = 0;
  return pages.ToString();
}

std::optional<std::unique_ptr<engine::Session>> PrefillCache::Restore(const Key& key, engine::Engine& engine) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  Result<kv::SeqId> id = engine.kv_manager().ImportSequence(it->second.image);
  if (!id.ok()) return std::nullopt;  // e.g. a smaller pool: the spec prefills itself
  return engine.AdoptSequence(*id);
}

bool PrefillCache::Store(const Key& key, const engine::Session& session) {
  if (entries_.count(key)) return true;
  Result<kv::KVManager::SequenceImage> image = session.engine().kv_manager().ExportSequence(session.id());
  if (!image.ok()) return false;
  size_t n = 0;
  for (const kv::SequenceKV::TableImage& t : image->tables) {
    for (std::span<const uint8_t> page : t.pages) n += page.size();
  }
  if (bytes_ + n > budget_bytes_) return false;
  Entry& e = entries_[key];
  e.bytes.resize(n);
  size_t at = 0;
  for (kv::SequenceKV::TableImage& t : image->tables) {
    for (std::span<const uint8_t>& page : t.pages) {
      std::memcpy(e.bytes.data() + at, page.data(), page.size());
      page = std::span<const uint8_t>(e.bytes.data() + at, page.size());
      at += page.size();
    }
  }
  e.image = std::move(*image);
  bytes_ += n;
  return true;
}

}  // namespace kvx::eval
