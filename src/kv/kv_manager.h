// KVManager: the one owner of a process's KV state for one KV configuration:
// the BlockPool, the spec resolved and validated once against the model's
// layout (ResolvedKVSpec), and every sequence by id (its per-(layer, kv-head)
// page tables, the token ids it holds, their positions, and the chained
// hashes of its full token blocks). The shape of vLLM v1's KV cache manager
// and of SGLang's req-to-token pool + allocator, with kvx's pages per
// (layer, kv-head) so heads can keep different entries. docs/kv-manager.md
// has the diagram, the step protocol and the invariants.
//
// Step protocol (what a scheduler drives):
//   BeginStep(requests)  validates every request (known sequence, tokens fit
//                        the context, positions in range), then reserves every
//                        page the step will write for every sequence and layer
//                        (SequenceKV::Reserve), or fails with
//                        ResourceExhausted having changed nothing: a scheduler
//                        catches it, preempts or shrinks the batch, retries.
//   (forward pass)       appends consume only reserved pages: it cannot run
//                        out of budget half-way.
//   CommitStep()         records the tokens and positions, chains the hashes
//                        of newly completed token blocks, returns unused
//                        reservations, then runs the policies (kv/policy/)
//                        on the step's sequences.
//   AbortStep()          returns every reservation; the tables are as before
//                        BeginStep (only valid before the forward pass runs).
//
// Prefix sharing: ForkPrefix(src, n) starts a sequence from src's first n
// tokens (full pages shared by refcount, the partial page copied on write).
// Block hashes: block b (tokens [b*T, (b+1)*T), T = page_tokens) has
// hash_b = XXH3_64(tokens of b, seed = hash_{b-1}), hash_{-1} = the
// sequence's salt (a tenant's, so tenants never share): equal hashes mean an
// equal token prefix, which is what a prefix index keys on. Hashes stop at
// the first step whose policy removed entries (the pages no longer hold
// exactly those tokens).
//
// Memory really leaves: freed pages return to the pool at once, and the
// manager hands the pool's free memory back to the OS
// (BlockPool::ReleaseFreeMemory) when a sequence ends and the pool holds more
// than `release_watermark_bytes` of touched-but-free memory.
//
// Thread-safety: not thread-safe; one thread (the engine's step loop) calls
// it. Attention reads the tables from pool threads during a forward pass.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/block_pool.h"
#include "kv/codec/codec_config.h"
#include "kv/kv_spec.h"
#include "kv/layout.h"
#include "kv/resolved_spec.h"
#include "kv/sequence_kv.h"
#include "util/status.h"

namespace kvx::kv {

class KVPolicy;

using SeqId = int32_t;

// The chained hash of one full token block: XXH3_64 of its token ids with
// `seed` = the previous block's hash (the sequence's salt for block 0). What
// KVManager::block_hashes holds; a prefix cache hashes a prompt with it.
uint64_t BlockHash(uint64_t seed, std::span<const int32_t> block);

struct KVManagerOptions {
  // Free-but-touched pool memory above which ending a sequence returns it to
  // the OS (0: every time a sequence ends; UINT64_MAX: never).
  uint64_t release_watermark_bytes = 16ull << 20;
};

// One sequence's part of a step: its new tokens at these positions.
struct StepRequest {
  SeqId seq = -1;
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;  // same length as tokens
};

class KVManager {
 public:
  // Creates the pool for `spec` and adopts its policies, in order (IoError
  // if the address space cannot be reserved).
  static Result<std::unique_ptr<KVManager>> Create(ResolvedKVSpec spec, const KVManagerOptions& options = {});
  ~KVManager();
  KVManager(const KVManager&) = delete;
  KVManager& operator=(const KVManager&) = delete;

  const ResolvedKVSpec& spec() const { return spec_; }
  BlockPool& pool() { return *pool_; }
  const BlockPool& pool() const { return *pool_; }

  // --- Sequences ---
  // A new empty sequence whose block hashes start from `salt`.
  SeqId AddSequence(uint64_t salt = 0);
  // A new sequence holding src's first n_tokens tokens (0 <= n_tokens <=
  // its length) and their block hashes; same salt. When src had entries
  // removed (its pages no longer hold its token prefix) only the whole
  // sequence can be forked (n_tokens == its length: every page shared,
  // copied on write, the removal carried over); a shorter prefix is
  // InvalidArgument;
  // ResourceExhausted when a partial page's copy does not fit (unchanged).
  Result<SeqId> ForkPrefix(SeqId src, int n_tokens);
  // A saved sequence (engine/session_file.h): everything a sequence holds.
  struct SequenceImage {
    std::vector<int32_t> tokens, positions;
    std::vector<uint64_t> block_hashes;
    uint64_t salt = 0;
    bool entries_removed = false;
    std::vector<SequenceKV::TableImage> tables;  // [n_layers * n_kv_heads], layer-major
  };
  // A new sequence holding `image`. Checked before anything is allocated:
  // tokens and positions agree in length, fit the context (positions in
  // 0..n_ctx-1), the block hashes are the chain of the tokens and the salt
  // (a prefix of it once entries were removed), every table holds one live
  // entry per token unless entries were removed, and SequenceKV::Import's
  // checks. DataLoss naming the problem, ResourceExhausted when the pool
  // cannot hold the pages; on error nothing changed. REQUIRES: not in a step.
  //
  // With `prefix` (tokens > 0, a whole number of pages), the new sequence
  // shares its first `prefix.tokens` tokens' pages and positions with
  // sequence `prefix.from` (by reference, copied on write, as ForkPrefix)
  // instead of copying them from the image, whose pages and positions there
  // are not read: a swapped-in sample over its sibling's prompt, tier blocks
  // over the prefix the pool holds. InvalidArgument unless `from` holds those
  // tokens (its block hashes equal the image's) with nothing removed.
  struct SharedPrefix {
    SeqId from = -1;
    int tokens = 0;
  };
  Result<SeqId> ImportSequence(const SequenceImage& image, SharedPrefix prefix);
  Result<SeqId> ImportSequence(const SequenceImage& image) { return ImportSequence(image, SharedPrefix{-1, 0}); }
  // Everything sequence `id` holds, as ImportSequence takes it; the page
  // spans point into the pool (valid until the next step, compression or
  // release changes a page). Only f16 and packed pages without side data can
  // be exported (SequenceKV::Import's formats): else Unimplemented naming every
  // kind of page the sequence holds that cannot be, and the way out.
  Result<SequenceImage> ExportSequence(SeqId id) const;
  // Drops the sequence and returns its pages; then hands free memory to the
  // OS above the watermark. REQUIRES: not in a step.
  void ReleaseSequence(SeqId id);
  // Forgets a sequence's tokens and pages, keeping its id and salt.
  void ResetSequence(SeqId id);
  bool HasSequence(SeqId id) const { return seqs_.count(id) != 0; }
  int num_sequences() const { return static_cast<int>(seqs_.size()); }
  std::vector<SeqId> SequenceIds() const;

  SequenceKV& kv(SeqId id) { return *Seq(id).kv; }
  const SequenceKV& kv(SeqId id) const { return *Seq(id).kv; }
  // Tokens the sequence holds, in order, and their positions.
  const std::vector<int32_t>& tokens(SeqId id) const { return Seq(id).tokens; }
  const std::vector<int32_t>& positions(SeqId id) const { return Seq(id).positions; }
  int length(SeqId id) const { return static_cast<int>(Seq(id).tokens.size()); }
  // Hashes of the sequence's full token blocks (see above).
  const std::vector<uint64_t>& block_hashes(SeqId id) const { return Seq(id).block_hashes; }
  // The salt its block hashes start from (its tenant's).
  uint64_t salt(SeqId id) const { return Seq(id).salt; }
  // Whether a policy removed entries from the sequence.
  bool entries_removed(SeqId id) const { return Seq(id).entries_removed; }
  // Policies call this after removing entries of a sequence.
  void MarkEntriesRemoved(SeqId id);

  // --- Steps ---
  Status BeginStep(std::span<const StepRequest> requests);
  // Commits the step (never fails), then runs the policies; returns the
  // first policy error (the step stays committed).
  Status CommitStep();
  void AbortStep();
  bool in_step() const { return in_step_; }
  // The requests of the step in progress or last committed (valid from
  // BeginStep until the next BeginStep): an AttentionObserver's `seq` is an
  // index into this list, so policies map it to the SeqId here.
  std::span<const StepRequest> step_requests() const { return step_; }

  // The explicit compression moment: every policy's Compress(seq) in order
  // (kv/policy/policy.h), then the freed memory goes back to the OS past
  // the release watermark, as when a sequence ends. REQUIRES: not in a step.
  Status Compress(SeqId seq);
  // Whether some policy acts only at that moment (KVPolicy::compresses_once):
  // then whoever drives the sequences must call Compress.
  bool HasOncePolicy() const;
  // The longest KVPolicy::prompt_window of the policies (0 without any);
  // nullopt when some policy's state depends on the whole prompt.
  std::optional<int> PromptWindow() const;

  // --- Policies (kv/policy/policy.h), run after every committed step ---
  void AddPolicy(std::unique_ptr<KVPolicy> policy);
  const std::vector<std::unique_ptr<KVPolicy>>& policies() const { return policies_; }

  // --- Memory ---
  // Returns the memory of the pool's free pages to the OS now; the bytes.
  uint64_t ReleaseFreeMemory() { return pool_->ReleaseFreeMemory(); }
  // Bytes of pages in use over all sequences.
  uint64_t BytesInUse() const { return pool_->bytes_in_use(); }
  // Bytes `seq` keeps outside the pool: its own (SequenceKV::SideBytes) and
  // its policies' (KVPolicy::SideBytes). A sequence's kept bytes are its
  // pages plus these.
  uint64_t SideBytes(SeqId seq) const;

  // Every invariant: the pool's (BlockPool::CheckInvariants), each table's
  // (SequenceKV::CheckTables), every page's refcount equal to the references
  // the sequences hold, token/position/hash bookkeeping consistent. Internal
  // error naming the first broken one. O(pages); for tests.
  Status CheckInvariants() const;

 private:
  struct Sequence {
    std::unique_ptr<SequenceKV> kv;
    std::vector<int32_t> tokens, positions;
    std::vector<uint64_t> block_hashes;
    uint64_t salt = 0;
    bool entries_removed = false;
  };
  KVManager(ResolvedKVSpec spec, const KVManagerOptions& options);
  Sequence& Seq(SeqId id);
  const Sequence& Seq(SeqId id) const;
  // Extends the hash chain over the sequence's newly completed blocks.
  void ExtendHashes(Sequence& s) const;
  void MaybeReleaseMemory();

  ResolvedKVSpec spec_;
  KVManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  std::map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
  std::vector<std::unique_ptr<KVPolicy>> policies_;
  bool in_step_ = false;
  std::vector<StepRequest> step_;              // the step in progress
  std::vector<std::vector<int32_t>> step_data_;  // copies of its tokens and positions
};

}  // namespace kvx::kv
