// KVPolicy: what eviction, merging and precision policies (StreamingLLM,
// H2O, SnapKV, TOVA, MiKV, ...) plug into. A policy is a small object the
// KVManager calls at step boundaries, after a step is committed; it may drop
// entries of any (layer, kv-head) of the step's sequences
// (SequenceKV::RemoveEntries, then KVManager::MarkEntriesRemoved), compact
// their pages (SequenceKV::Compact), merge or re-encode entries. A policy
// that needs attention probabilities provides an AttentionObserver, which
// the engine hands to the forward pass (with its query window).
// Policies are created by name from a registry (PolicyRegistry), never an
// if/else chain.
//
// Adding one (the registrations are listed in policy.cc, not made by static
// registrars: the linker drops an object file of the static kvx_kv library
// that nothing references, and its registrar with it):
//   * a policy: kv/policy/NAME.{h,cc} (a KVPolicy with a static
//     Create(const PolicyParams&)), one Register line in
//     PolicyRegistry::Global() (policy.cc), and NAME_test.cc;
//   * a scorer for score-based eviction (scorer.h), which gets the shared
//     budgets, sinks, window, fates and adakv's base= for free:
//     kv/policy/NAME.cc (the Scorer and `ScorerMethod NAMEMethod()` with
//     the method's defaults), its declaration in eviction_policies.h and
//     its entry in ScorerMethods() (eviction_policies.cc), which registers
//     it by name, and its test beside the other scorers' (in
//     eviction_policies_test.cc: what it keeps, and its name in
//     ParametersAreChecked's list; tests/policy_codec_matrix_test.cc runs
//     the listed policies under every codec).
//
// Thread-safety: called from the manager's thread only; the observer is
// called from pool threads (see AttentionObserver).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_manager.h"
#include "util/status.h"

namespace kvx::kv {

class KVPolicy {
 public:
  virtual ~KVPolicy() = default;
  virtual std::string_view name() const = 0;
  // After a committed step, once per sequence the step ran. An error stops
  // the step's policies and is returned by the engine's step.
  virtual Status OnStepCommitted(KVManager& manager, SeqId seq) = 0;
  // The explicit compression moment (KVManager::Compress, Session::Compress):
  // a caller asks the policies to compress the sequence NOW, e.g. once after
  // a context's prefill with the question still to come (kvpress's
  // question-free setting) or after the question too (query-aware).
  // Policies that act only continuously ignore it.
  virtual Status Compress(KVManager& manager, SeqId seq) {
    (void)manager;
    (void)seq;
    return Status::Ok();
  }
  // Whether the policy acts only at that moment (mode=once): then a caller
  // that serves requests must call Compress itself (the scheduler does,
  // once a request's prompt is in the KV; kvx eval's ppl/kld split the text
  // into a context and a scored rest). Continuous policies answer false.
  virtual bool compresses_once() const { return false; }
  // The sequence ended or was reset: drop any state kept for it.
  virtual void OnSequenceReleased(SeqId seq) { (void)seq; }
  // Checks the policy against the resolved spec (codec, layout, per-layer
  // codecs, context; its policies and budget are not set yet) before any
  // sequence exists, e.g. a mode that needs pre-RoPE keys; InvalidArgument
  // naming the fix otherwise. Called by ResolveKVSpec (kv/resolved_spec.h),
  // which builds each policy of a spec once; the KVManager adopts it.
  virtual Status CheckSpec(const ResolvedKVSpec& resolved) const {
    (void)resolved;
    return Status::Ok();
  }
  // What the policy's state after a prompt depends on besides the pages,
  // for callers that run one prefill for several specs of the same codec
  // (kvx eval: KVManager::ExportSequence, then the last calls of the prompt
  // run again under each spec). N >= 0: at most the prompt's last N queries,
  // seen through a window that a call of at least N queries fills anew (0:
  // none). nullopt: it acts or accumulates over the whole prompt
  // (continuous eviction, H2O's sums); the safe default.
  virtual std::optional<int> prompt_window() const { return std::nullopt; }
  // Pool bytes a compression of an n_ctx-token sequence may hold beyond its
  // pages before it frees any (a demotion writes the low-bit copies before
  // compaction returns the sources): ResolveKVSpec adds it to a budget
  // sized from the context, so a policy can compress a full pool.
  virtual uint64_t CompressionHeadroomBytes(const ResolvedKVSpec& resolved) const {
    (void)resolved;
    return 0;
  }
  // The observer the forward pass runs with while this policy is active
  // (nullptr: the policy needs no attention probabilities, and attention
  // keeps its fast kernels).
  virtual AttentionObserver* observer() { return nullptr; }
};

// Policy parameters as the --kv spec's policy group gives them (key -> value
// text); each policy parses and range-checks its own.
using PolicyParams = std::map<std::string, std::string, std::less<>>;
using PolicyFactory = std::function<Result<std::unique_ptr<KVPolicy>>(const PolicyParams&)>;

// Name -> factory. Global() holds the built-in policies (policy.cc lists
// them); a test may Register its own.
class PolicyRegistry {
 public:
  static PolicyRegistry& Global();
  void Register(std::string name, PolicyFactory factory);
  // InvalidArgument listing the registered names for an unknown one.
  Result<std::unique_ptr<KVPolicy>> Create(std::string_view name, const PolicyParams& params) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, PolicyFactory, std::less<>> factories_;
};

}  // namespace kvx::kv
