// PrefillCache: one prompt prefill for every spec of the same codec.
//
// kvx eval runs each retrieval prompt under every spec. The specs of a
// method's sweep differ in their policy only (codec=f16;policy=snapkv at
// five ratios), and a once-mode policy leaves the pages of a prompt as the
// codec wrote them until the compression moment: the prefill is the same
// work five times, and at 8k tokens it is most of the run. Here the first
// spec to run a prompt keeps a copy of its pages after the prompt's early
// calls (KVManager::ExportSequence); the others import the copy and run the
// prompt's last calls themselves, so whatever their policies observe is
// observed as in a prefill of their own.
//
// When that is exact: the policies' state after a prompt must depend only
// on the pages and the prompt's last w queries, observed through a window
// that a call of at least w queries fills anew (KVManager::PromptWindow:
// SnapKV's, TOVA's, ThinK's; none for Quest, MiniCache, key norms; H2O's
// sums and every continuous policy depend on the whole prompt and are not
// shared). Session::Feed splits a prompt into n_batch calls from its start;
// SharedPrefixLength keeps the last two calls (the last may be short) at
// the same boundaries, and a call of n_batch >= w queries replaces what the
// earlier calls left. The spec's attention then reads the same bytes in the
// same order as with its own prefill: results are identical, not close
// (eval_prefill_share_test checks a report with and without the cache).
// Only if the early calls ran the same arithmetic: an observer changes it
// (kv::ObserverParticipation: a column-sum call runs each head's chain as
// one chunk, a probability call sends its window's rows through the general
// path), so the key holds Engine::PromptArithmeticKey beside the pages. A
// SnapKV or TOVA spec then shares with the other column-sum specs of its
// codec, not with the codec's spec without a policy: the two prefills
// differ in the last bits, and TOVA at ratio 0.5 on rotated int4 kept other
// entries after taking the unobserved prefill.
//
// Thread-safety: none (the eval runner's thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/session.h"
#include "kv/kv_manager.h"

namespace kvx::eval {

// Tokens of a `fed`-token prompt feed that another spec's prefill can stand
// for: whole n_batch calls, all but the last two. 0 when nothing can be
// shared: the policies' state depends on the whole prompt (window nullopt),
// or their window is longer than a call.
int SharedPrefixLength(std::optional<int> prompt_window, int fed, int n_batch);

class PrefillCache {
 public:
  explicit PrefillCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Which prompt: the spec's pages (its KV spec without policies and
  // budget, then "|" and its prompt calls' arithmetic), the probe plan,
  // the item, and the prefix length.
  using Key = std::tuple<std::string, const void*, size_t, int>;
  static std::string PageKey(const kv::KVSpec& spec);

  // A new session of `engine` holding the stored prefix, or nullopt when
  // none is stored (or it does not fit the engine's pool).
  std::optional<std::unique_ptr<engine::Session>> Restore(const Key& key, engine::Engine& engine) const;
  // Keeps a copy of `session`'s sequence under `key` if the budget allows
  // (and the sequence can be exported); returns whether it was kept.
  bool Store(const Key& key, const engine::Session& session);

  uint64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    std::vector<uint8_t> bytes;             // every page, back to back
    kv::KVManager::SequenceImage image;     // its spans point into `bytes`
  };
  uint64_t budget_bytes_;
  uint64_t bytes_ = 0;
  std::map<Key, Entry> entries_;
};

}  // namespace kvx::eval
