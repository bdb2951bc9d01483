// KVPolicy: what eviction, merging and precision policies (StreamingLLM,
// H2O, SnapKV, TOVA, MiKV, ...) plug into. A policy is a small object the
// KVManager calls at step boundaries, after a step is committed; it may drop
// entries of any (layer, kv-head) of the step's sequences
// (SequenceKV::RemoveEntries, then KVManager::MarkEntriesRemoved), compact
// their pages (SequenceKV::Compact), merge or re-encode entries. A policy
// that needs attention probabilities provides an AttentionObserver, which
// the engine hands to the forward pass (with its query window).
// Policies are created by name from a registry (PolicyRegistry), never an
// if/else chain, and register themselves next to their code.
//
// Adding one (each file registers itself with a static registrar; the
// linker keeps every object file of kvx_kv, which CMakeLists.txt links
// whole-archive, so no list elsewhere names it):
//   * a policy: kv/policy/NAME.{h,cc} (a KVPolicy whose factory reads its
//     keys from a PolicyParamReader, and reports them in Parameters()),
//     `const PolicyRegistrar kRegistered("NAME", Factory);` in NAME.cc, and
//     NAME_test.cc;
//   * a scorer for score-based eviction (scorer.h), which gets the shared
//     budgets, sinks, window, fates and adakv's base= for free: one file,
//     kv/policy/NAME.cc, with the Scorer, its ScorerMethod (the method's
//     defaults) and `const ScorerRegistrar kRegistered(NAMEMethod());`
//     (eviction_policies.h), plus its test beside the other scorers' (in
//     eviction_policies_test.cc: what it keeps, and its name in
//     RegistryTest.EveryPolicyIsRegistered's list, policy_registry_test.cc;
//     tests/policy_codec_matrix_test.cc runs the listed policies under
//     every codec).
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
  // Bytes the policy keeps for `seq` outside the pool (e.g. the attention
  // statistics a scorer ranks by): part of the sequence's kept bytes
  // (KVManager::SideBytes), as its pages are.
  virtual uint64_t SideBytes(SeqId seq) const {
    (void)seq;
    return 0;
  }
  // What a `tokens`-token sequence holds per token at steady state once the
  // policy has acted, given `bytes_per_token` before it (the codec's, or what
  // the policies before it leave); bytes the layout determines outside the
  // pool included (Quest's bounds). What kvx plan sizes a sequence by
  // (SteadyStateBytesPerToken, resolved_spec.h). Default: unchanged.
  virtual double KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const {
    (void)resolved;
    (void)tokens;
    return bytes_per_token;
  }
  // The parameters the policy acts with, resolved (defaults included), by
  // key: every key its factory read appears here with the value in use,
  // so a key that is accepted but changes nothing shows up in a test
  // (policy_registry_test.cc).
  virtual std::map<std::string, std::string, std::less<>> Parameters() const { return {}; }
  // The observer the forward pass runs with while this policy is active
  // (nullptr: the policy needs no attention probabilities, and attention
  // keeps its fast kernels).
  virtual AttentionObserver* observer() { return nullptr; }
};

// Policy parameters as the --kv spec's policy group gives them (key -> value
// text); each policy parses and range-checks its own (params.h).
using PolicyParams = std::map<std::string, std::string, std::less<>>;
class PolicyParamReader;
// Reads the policy's keys from the reader (the registry then refuses any
// other key) and builds the policy.
using PolicyFactory = std::function<Result<std::unique_ptr<KVPolicy>>(PolicyParamReader& params)>;

// Name -> factory. Global() holds the built-in policies (each registered by
// a PolicyRegistrar in its own file); a test may Register its own.
class PolicyRegistry {
 public:
  static PolicyRegistry& Global();
  void Register(std::string name, PolicyFactory factory);
  // InvalidArgument listing the registered names for an unknown one, or
  // naming a key that does not apply to the policy and the keys it takes.
  Result<std::unique_ptr<KVPolicy>> Create(std::string_view name, const PolicyParams& params) const;
  // The keys the named policy takes with `params` (some keys apply only
  // with others, e.g. beta with layers=pyramid), each with a valid example
  // value other than its default.
  Result<PolicyParams> KeyExamples(std::string_view name, const PolicyParams& params) const;
  std::vector<std::string> Names() const;

 private:
  // Runs the named factory on `reader`, then refuses the keys it did not read.
  Result<std::unique_ptr<KVPolicy>> Build(std::string_view name, PolicyParamReader& reader) const;
  std::map<std::string, PolicyFactory, std::less<>> factories_;
};

// Registers a policy at static initialization; one line in the policy's
// own .cc: `const PolicyRegistrar kRegistered("quest", QuestPolicy::Create);`
struct PolicyRegistrar {
  PolicyRegistrar(std::string name, PolicyFactory factory) {
    PolicyRegistry::Global().Register(std::move(name), std::move(factory));
  }
};

}  // namespace kvx::kv
