// The attention-sink cache shape (StreamingLLM; DuoAttention's and
// RazorAttention's streaming heads): a head keeps its first `sinks` live
// entries and its newest `window` ones; the entries between are removed.
// Entries leave in chain order, so whole pages die as the window moves and
// return to the pool at once (no compaction needed).
//
// Thread-safety: as KVPolicy (the manager's thread).
#pragma once

#include <functional>

#include "kv/kv_manager.h"

namespace kvx::kv {

// Trims every (layer, kv head) of `seq` for which `trimmed(layer, kv_head)`
// is true (every head when it is empty) that holds more than
// sinks + window live entries, and marks the sequence's entries removed
// (KVManager::MarkEntriesRemoved) when any went. Returns whether any did.
// REQUIRES: sinks >= 0, window >= 0.
Result<bool> TrimToSinksAndWindow(KVManager& manager, SeqId seq, int sinks, int window,
                                  const std::function<bool(int layer, int kv_head)>& trimmed = {});

}  // namespace kvx::kv
