// EvictionFate: what happens to the entries a scored-eviction policy
// selects for eviction. The default, `drop`, removes them
// (SequenceKV::RemoveEntries: their pages return to the pool once empty or
// compacted). Other fates plug in by name without touching the selection:
// MiKV demotes the evicted to a 2-bit codec, KVMerger/D2O merge them into
// their most similar kept neighbour. A policy group picks one with
// `fate=NAME`; the fate reads its own parameters from the same group.
//
// Registration: EvictionFateRegistry::Global() holds the built-ins, each
// added by a FateRegistrar in its own file, so a new fate needs no edit of
// the eviction code.
//
// Thread-safety: Apply runs on the manager's thread between steps.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/policy/params.h"
#include "util/status.h"

namespace kvx::kv {

class EvictionFate {
 public:
  virtual ~EvictionFate() = default;
  virtual std::string_view name() const = 0;
  // Disposes of `evicted` (live slots of (layer, kv_head), chain order);
  // `kept` are the live slots that stay (chain order, sinks and window
  // included), for fates that fold the evicted into them. After Apply the
  // evicted must no longer occupy full-precision live slots. The policy
  // then marks the sequence (MarkEntriesRemoved) and compacts.
  virtual Status Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
                       const std::vector<int>& kept) = 0;
  // Whether Apply allocates pages (demote: the evicted move to new low-bit
  // pages) before the policy's compaction frees their sources; the policy
  // then checks whether a table grew, which costs a walk over its pages.
  virtual bool allocates() const { return false; }
  // As KVPolicy::CompressionHeadroomBytes, for `evicted` entries of every
  // table (layout): what the fate allocates before they are compacted away.
  virtual uint64_t HeadroomBytes(const KVLayout& layout, int64_t evicted) const {
    (void)layout;
    (void)evicted;
    return 0;
  }
  // Bytes per token the fate keeps of an evicted token, all layers and heads
  // (0: dropped or folded into kept entries; demote: its low-bit copy).
  virtual double BytesPerEvictedToken(const KVLayout& layout) const {
    (void)layout;
    return 0;
  }
  // The sequence ended: drop what the fate keeps for it.
  virtual void Forget(SeqId seq) { (void)seq; }
  // As KVPolicy::Parameters: the fate's keys with the values in use.
  virtual PolicyParams Parameters() const { return {}; }
  // As KVPolicy::CheckSpec (e.g. a fate that needs a quantized codec).
  virtual Status CheckSpec(const ResolvedKVSpec& resolved) const {
    (void)resolved;
    return Status::Ok();
  }
};

// Reads the fate's own parameters from the policy group (the reader
// rejects keys no one reads at the end).
using FateFactory = std::function<Result<std::unique_ptr<EvictionFate>>(PolicyParamReader& params)>;

class EvictionFateRegistry {
 public:
  static EvictionFateRegistry& Global();
  void Register(std::string name, FateFactory factory);
  // InvalidArgument listing the registered names for an unknown one.
  Result<std::unique_ptr<EvictionFate>> Create(std::string_view name, PolicyParamReader& params) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, FateFactory, std::less<>> factories_;
};

// Registers a fate at static initialization, one line in its file:
// `const FateRegistrar kRegistered("merge", MergeFate::Create);`
struct FateRegistrar {
  FateRegistrar(std::string name, FateFactory factory) {
    EvictionFateRegistry::Global().Register(std::move(name), std::move(factory));
  }
};

// The default fate: the evicted entries are removed.
class DropFate : public EvictionFate {
 public:
  std::string_view name() const override { return "drop"; }
  Status Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
               const std::vector<int>& kept) override;
};

}  // namespace kvx::kv
