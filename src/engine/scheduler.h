// Scheduler: continuous batching over one Engine. Requests (prompt token ids,
// sampling options, limits) are submitted from any thread; one scheduler
// thread owns the engine and runs steps:
//
//   between steps  take new requests, cancellations and RunBetweenSteps tasks;
//                  admit queued requests in FIFO order (priority first) while
//                  their prompt's KV fits the pool (counting the pages the
//                  radix prefix cache already holds for them, and the ones it
//                  could evict); a new request starts from the longest cached
//                  prefix of its prompt (kv/radix_cache.h: pages shared, not
//                  recomputed).
//   one step       decode rows first (one token per running sequence, oldest
//                  first), then prefill chunks of admitted prompts fill the
//                  rest of `max_step_tokens`; one Engine::Step (batched
//                  forward pass). When the pool cannot hold the step
//                  (ResourceExhausted: nothing changed), unused cached pages
//                  are evicted first (LRU), then the YOUNGEST running request
//                  is preempted (its computed blocks go to the prefix cache,
//                  its sequence is released, it goes back to the head of the
//                  queue and is recomputed on readmission, mostly from the
//                  cache), and the step is retried. Oldest requests therefore
//                  always progress: nothing starves.
//   after a step   each sequence whose input is consumed samples its next
//                  token with its own Sampler (seeded per request and sample),
//                  and events go to the request's callback; finished
//                  sequences give their full pages to the prefix cache (or
//                  are kept as a named session) and leave the batch.
//
// Determinism: a request's tokens depend only on the request (prompt,
// sampling options, seed), not on the other requests in the batch, how its
// prompt was chunked, whether its prefix came from the cache, or whether it
// was preempted: the forward pass computes each row and each sequence's
// attention independently (tests/batched_engine_test.cc), and row-wise codecs
// (f32, f16, bf16, int8/4) store the same bytes however the tokens arrive.
// Sealed codecs (KIVI with a residual window) encode a page from f32 inputs
// when a prompt chunk seals it directly and from its f16 staging copy
// otherwise, so with them chunking and cache hits change low-order bits.
//
// Compression moment: when the KV spec has policies that compress once
// (KVPolicy::compresses_once, e.g. `policy=snapkv,ratio=0.5`), each sample's
// sequence is compressed (Session::Compress) the moment it holds the
// request's whole base (session + prompt), after that step's logits and
// before its first token is sampled: query-aware, as `kvx run` does after
// the prompt. Prefill chunks stop at that point, so a preempted request
// (recomputed from its tokens) is compressed at the same token, and the
// prefix cache lookup stops short of it. A resumed session's request is
// compressed again after its prompt. A request may name an earlier moment
// (compress_at: after the context, before its question). Samples 1..n-1
// fork the compressed sequence whole (pages shared, copied on write).
//
// Compressed caches that can be reused (engine/compressed_cache.h). A
// compressed sequence cannot enter the radix prefix cache (its pages no
// longer hold its tokens), so a second cache keeps such sequences whole:
// a request that names its compression moment (compress_at > 0) leaves a
// fork of its sequence as compressed there, and a later request whose
// prompt extends exactly those tokens and compresses at the same moment
// forks it instead of computing and compressing the context again (N
// questions against one context compress once: SCBench's multi-query
// protocol). With continuous policies (which act at every step) a finished
// or preempted sequence is kept the same way, and a request whose tokens
// extend it continues from it. Without a named moment the radix cache still
// serves the uncompressed shared prefix and each request compresses its
// own copy-on-write view after its whole prompt (query-aware).
//
// Sessions (named sequences): a request with `save_session` keeps its
// sequence (sample 0) under that name when it finishes; a request with
// `resume_session` starts from that sequence's tokens and pages (a
// copy-on-write fork; the saved session stays as it was) and appends its
// prompt; a request with `continue_session` resumes the session if it
// exists (decided at Submit) and saves under its name either way. A session
// belongs to its tenant (the request's tenant_salt): names are per tenant,
// and another tenant's session is simply not there (NotFound, as a missing
// one). Sessions hold pool pages until dropped: at most `max_sessions` per
// tenant (a tenant's least recently used is dropped beyond, never another
// tenant's) and `max_sessions_total` in all (the least recently used of
// any tenant beyond). Save/restore to files (the server's) works on the
// scheduler thread inside RunBetweenSteps with SessionSequence /
// AdoptSession.
//
// Thread-safety: Submit, Cancel, Stats, RunBetweenSteps and Shutdown are
// thread-safe. Event callbacks run on the scheduler thread: they must not
// block or call back into the scheduler (except Cancel and Stats). The
// session methods marked "scheduler thread" may be called only from a
// RunBetweenSteps task. The engine must not be used by anyone else while
// the scheduler runs, and must outlive it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "engine/chunk_assembly.h"
#include "engine/engine.h"
#include "engine/preemption.h"
#include "kv/kv_manager.h"
#include "kv/tier/tier_store.h"
#include "model/sampler.h"
#include "util/status.h"

namespace kvx::kv {
class RadixCache;
}

namespace kvx::engine {

class CompressedCache;
class Session;
struct SwappedSequence;

using RequestId = uint64_t;

struct SchedulerOptions {
  // Tokens of one forward step: decode rows plus prefill chunks (>= 1).
  int max_step_tokens = 512;
  // Sequences running at once (decoding or prefilling; a request with n
  // samples counts n) (>= 1).
  int max_running = 64;
  // Requests in flight (queued or running); Submit fails with
  // ResourceExhausted beyond (>= 1).
  int max_queue = 4096;
  // Reuse cached prompt prefixes (kv/radix_cache.h).
  bool prefix_cache = true;
  // Named sessions kept at once per tenant: that tenant's least recently
  // used is dropped beyond, so one tenant's sessions never evict another's.
  int max_sessions = 64;
  // Named sessions kept at once in all tenants (the least recently used of
  // any tenant is dropped beyond): a bound for tenants without keys, where
  // anyone can name a new tenant. Callers with K known tenants give it at
  // least K * max_sessions.
  int max_sessions_total = 4096;
  // Seconds since some fixed origin (injectable for tests); default: steady
  // clock.
  std::function<double()> clock;
  // The KV tiers below the pool (kv/tier/tier_store.h; null: none). With
  // the prefix cache on, a queued request whose prompt has full tier blocks
  // the cache lacks waits while the store's I/O thread loads them; they are
  // imported into the pool and the cache, and the request is admitted from
  // them. Every finished or preempted sequence's full, final blocks are
  // written through to the tiers (off the scheduler thread but for a copy
  // of their pages). Shared: the store finishes its writes when its last
  // owner lets it go.
  std::shared_ptr<kv::tier::TierStore> tiers;
  // The prefill speed, in tokens per second, assumed until the steps
  // measure one: a tier load slower than recomputing at that speed is
  // abandoned. 0 (with tiers): measured at Create by a short prefill of its
  // own (128 tokens), so a new process's first lookups are not judged by a
  // guess (>= 0).
  double prefill_tokens_per_second = 0;
  // false: prefill_tokens_per_second stays the speed loads are judged by;
  // the steps' measurement does not replace it (a deployment that knows its
  // speed; tests whose hits must not depend on the machine's load: on a
  // tiny model the measured recompute is microseconds, which a disk read on
  // a loaded machine can lose).
  bool measure_prefill = true;
  // Chunk reuse (engine/chunk_assembly.h, docs/kv-reuse.md): the bytes of
  // the chunk cache (0: requests with chunks are refused) and the chunks
  // one request may name (>= 1).
  uint64_t chunk_cache_bytes = 0;
  int max_chunks = 64;
  // Preemption (engine/preemption.h): by cost (auto), always by swapping
  // the sequences' pages to host RAM and back, or always by recomputing.
  // Swapping needs sequences an image carries (no KV policy: their state is
  // not in the pages) and room in the swap space; else it recomputes.
  PreemptMode preempt = PreemptMode::kAuto;
  // Host RAM for swapped-out sequences, in bytes; 0: the pool's budget (a
  // swapped sequence held at most that much in the pool).
  uint64_t swap_bytes = 0;
  // The host copy bandwidth a swap costs, in bytes per second, until swaps
  // measure it; 0: measured at Create (MeasureCopyBandwidth) (>= 0).
  double copy_bytes_per_second = 0;
};

// What a request lets the prefix cache and the tiers do with its KV.
enum class CacheMode {
  kDefault,  // read and write: start from cached prefixes, leave its blocks for others
  kNone,     // neither: computed from scratch, its KV released at the end
  // As default, and the prompt's full blocks are pinned in the host-RAM
  // tier (kv/tier/ram_tier.h) until a request of the same tenant and prompt
  // unpins them or the tier's budget needs them back. Refused without a
  // host-RAM tier, with a session, or when the blocks exceed its budget.
  kPin,
  kUnpin,  // as default, and the prompt's full blocks are unpinned (the tenant's own only)
};
// "default", "none", "pin" or "unpin" (the APIs' "cache" field);
// InvalidArgument naming the choices for anything else.
Result<CacheMode> ParseCacheMode(std::string_view text);

struct GenerationRequest {
  // Prompt token ids (each in [0, n_vocab)). Non-empty unless resuming a
  // session (then appended to the session's tokens; may be empty). The
  // tokens (session's included) must leave room for one generated token:
  // fewer than the context length.
  std::vector<int32_t> prompt;
  // Tokens to generate per sample at most (>= 1). Generation also stops at
  // the end of the context (reason kLength).
  int max_tokens = 16;
  model::SamplerOptions sampling;  // seed included: sample i uses seed + i
  // Generation stops after any of these tokens (the token is reported).
  std::vector<int32_t> stop_tokens;
  // The model's end-of-generation tokens stop generation too.
  bool stop_at_eog = true;
  // Mixed into the prefix cache's keys: requests with different salts never
  // share cached pages (tenants).
  uint64_t tenant_salt = 0;
  // Samples: after the prompt, n - 1 copy-on-write forks of its sequence
  // (pages shared) decode independently (1 <= n <= max_running).
  int n = 1;
  // Higher is admitted first; FIFO within a priority.
  int priority = 0;
  // Start from the named session of this request's tenant (tenant_salt;
  // NotFound if it has none of that name).
  std::string resume_session;
  // On a normal finish (length or stop), keep sample 0's sequence under
  // this name (replacing a session of that name).
  std::string save_session;
  // A conversation under this name: Submit resumes the session when it
  // exists and starts it otherwise (NotFound if it does not exist and the
  // prompt is empty); the result is kept under the name either way.
  std::string continue_session;
  // The prompt was tokenized as a text of its own: when it resumes a
  // session, its leading BOS token (if any) is dropped, since the session's
  // text already began with one.
  bool drop_bos_when_resuming = false;
  CacheMode cache = CacheMode::kDefault;
  // A prompt made of chunks (engine/chunk_assembly.h): its prefix, chunks
  // and suffix are assembled, each chunk's KV from the chunk cache (key:
  // tokens, model, spec, tenant_salt), with its repair, instead of
  // prefilled. `prompt` must be chunks->Tokens(). The assembled sequence
  // (its KV is not a plain prefill's) never enters the prefix cache or the
  // tiers, nor reads them; no sessions. A preempted request is assembled
  // again at readmission (its generated tokens then prefilled).
  std::shared_ptr<const ChunkPrompt> chunks;
  // Run the compression moment (policies that compress once) after the
  // prompt. False keeps the whole prompt in the KV, e.g. a shared prefix's
  // warm-up request whose sequence is meant for the prefix cache.
  bool compress = true;
  // The compression moment, in prompt tokens (0 <= compress_at <=
  // prompt size): after prompt[0, compress_at), e.g. a shared context with
  // its question excluded. 0: after the whole prompt. A request that names
  // it leaves its compressed sequence in the compressed cache (with the
  // prefix cache on), and starts from an entry compressed at that moment
  // when one holds its tokens (see the header comment).
  int compress_at = 0;
};

// The part of a request Submit rejected (its status says what is wrong and
// how to fix it), for APIs that name the field at fault.
enum class RequestPart {
  kNone,       // not the request's content (queue full, shutting down)
  kPrompt,     // empty, or a token outside the vocabulary
  kContext,    // (session +) prompt leaves no room in the context
  kKvBudget,   // (session +) prompt needs more KV than the whole pool holds
  kMaxTokens,
  kSampling,
  kSamples,    // n
  kSession,    // resume_session / continue_session
  kCache,      // cache (pin without a host-RAM tier, with a session, or larger than the tier)
  kChunks,     // chunks: reuse off or impossible for the spec, too many, with a session, bad repair
};

enum class FinishReason { kLength, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "length", "stop", "cancelled", "error"

// Times of one request, in seconds (from the scheduler's clock).
struct RequestTiming {
  double queue_seconds = 0;  // submitted -> first admitted
  double ttft_seconds = 0;   // submitted -> first token of sample 0 (0 if none)
  double total_seconds = 0;  // submitted -> finished
  int prompt_tokens = 0;     // tokens of the (session +) prompt
  int cached_tokens = 0;     // of those, taken from the prefix cache or session at first admission
  // Of cached_tokens, the ones loaded from each tier (kind, tokens) for this
  // request; the rest were in the pool already.
  std::vector<std::pair<std::string, int>> cached_by_tier;
  // Chunk reuse (last assembly): tokens in the chunks, of those taken from
  // the chunk cache, and recomputed in context through the last layer.
  int chunk_tokens = 0;
  int chunk_cached_tokens = 0;
  int chunk_recomputed_tokens = 0;
  int generated_tokens = 0;  // over all samples
  int preemptions = 0;
};

struct RequestEvent {
  enum class Kind { kToken, kFinish };
  Kind kind = Kind::kToken;
  RequestId request = 0;
  int sample = 0;  // 0..n-1
  // kToken: the new token and its index among the sample's generated tokens.
  int32_t token = -1;
  int index = 0;
  // kFinish (one per sample): why the sample ended, and for kError the
  // status; `tokens`: every token the sample generated.
  FinishReason reason = FinishReason::kLength;
  Status status;
  std::vector<int32_t> tokens;
  // kFinish of the last sample to end: the request is over (no more events);
  // `timing` is filled.
  bool done = false;
  RequestTiming timing;
};

// Called on the scheduler thread; must not block.
using EventCallback = std::function<void(const RequestEvent&)>;

// Fixed-bucket histogram (Prometheus style: counts[i] counts samples <=
// bounds[i], the last count is +Inf).
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1, not cumulative
  double sum = 0;
  uint64_t count = 0;
  // Latency buckets from 1 ms to 60 s.
  static Histogram Latency();
  void Add(double value);
  // Approximate q-quantile (upper bound of the bucket that holds it); 0 if empty.
  double Quantile(double q) const;
};

struct PageClassStats {
  std::string label;   // e.g. "kivi2 (layers 0-29)", "f16 staging/sinks"
  size_t page_bytes = 0;
  int64_t pages_in_use = 0;
};

struct SchedulerStats {
  int queued = 0;             // requests waiting for admission
  int running_requests = 0;
  int running_sequences = 0;
  int sessions = 0;           // named sessions kept
  uint64_t pool_bytes_used = 0;
  uint64_t pool_budget_bytes = 0;
  std::vector<PageClassStats> page_classes;
  // Prefix cache.
  uint64_t cache_bytes = 0;         // approx.: cached blocks x the KV bytes of one block
  int64_t cache_blocks = 0;         // cached token blocks (page_tokens each)
  uint64_t prefix_lookups = 0;      // admissions that looked up the cache
  uint64_t prefix_lookup_tokens = 0;  // prompt tokens they looked up
  uint64_t prefix_hit_tokens = 0;     // of those, found cached
  uint64_t cache_evicted_blocks = 0;
  // Requests that waited for another request still prefilling a prefix they
  // share, to start from its blocks rather than compute them too.
  uint64_t prefix_waits = 0;
  // Compressed caches (engine/compressed_cache.h): compression moments run,
  // admissions that forked a kept compressed (or continuously evicted)
  // sequence instead, the tokens those held, and the entries kept now.
  uint64_t compressions = 0;
  uint64_t compressed_hits = 0;
  uint64_t compressed_hit_tokens = 0;
  int compressed_entries = 0;
  // KV tiers (empty without them): per tier its counters and load latency,
  // the store's lookups, abandoned loads, corrupt blocks and writes.
  std::vector<kv::tier::TierMetrics> tiers;
  kv::tier::TierStoreCounters tier_counters;
  uint64_t tier_hit_tokens = 0;  // prompt tokens admitted from blocks loaded from a tier
  // Chunk reuse: the chunk cache's counters (its bytes within
  // chunk_cache_bytes) and the chunk tokens assembled, taken from it,
  // computed alone (its misses; `full` does neither) and recomputed in
  // context.
  kv::ChunkCacheStats chunk_cache;
  uint64_t chunk_tokens = 0, chunk_cached_tokens = 0, chunk_computed_tokens = 0, chunk_recomputed_tokens = 0;
  // Tokens of preempted requests loaded back from a tier at readmission
  // (swap-in) instead of recomputed.
  uint64_t swapped_in_tokens = 0;
  // Preemptions by kind (preemptions = their sum): pages swapped to host RAM
  // and back, or sequences released and recomputed.
  uint64_t preempt_swaps = 0;
  uint64_t preempt_recomputes = 0;
  uint64_t swapped_bytes = 0;             // host RAM held by swapped-out sequences now (sessions included)
  // Idle named sessions whose pages went to host RAM to make room in the pool.
  uint64_t sessions_swapped_out = 0;
  double copy_bytes_per_second = 0;       // the swap cost's bandwidth (measured)
  // The scheduler thread's time in swaps (export and copy out, import back;
  // sessions included): what moving them off the thread could save.
  double swap_seconds = 0;
  // Work.
  uint64_t steps = 0;
  uint64_t prompt_tokens_computed = 0;  // prefill rows run (cache hits excluded)
  uint64_t tokens_generated = 0;
  uint64_t preemptions = 0;
  uint64_t requests_submitted = 0;
  uint64_t requests_finished = 0;   // done, any reason
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;
  double busy_seconds = 0;          // time inside steps
  // What the steps held (kvx bench --seqs N compares with decode-only steps
  // of N rows): decode rows (one token of a running sample each) and steps
  // without a prefill chunk, with their time.
  uint64_t decode_rows = 0;
  uint64_t decode_only_steps = 0;
  double decode_only_seconds = 0;
  // Time of the loop outside forward steps while work ran: admission,
  // sampling and event callbacks (sample_seconds, included).
  double host_seconds = 0;
  double sample_seconds = 0;
  double uptime_seconds = 0;
  Histogram ttft = Histogram::Latency();
  Histogram inter_token = Histogram::Latency();
  Histogram queue_time = Histogram::Latency();
};

enum class ShutdownMode {
  kDrain,   // stop accepting; finish every submitted request, then stop
  kCancel,  // cancel everything in flight (callbacks get kCancelled), then stop
};

class Scheduler {
 public:
  // Starts the scheduler thread. REQUIRES: `engine` outlives the scheduler
  // and nothing else drives it meanwhile. InvalidArgument for bad options.
  static Result<std::unique_ptr<Scheduler>> Create(Engine& engine, SchedulerOptions options = {});
  // Shutdown(kCancel) if not done yet.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request: the one gate every request passes (the server's
  // included). InvalidArgument for a bad request (empty prompt, token
  // outside the vocabulary, no room in the context, max_tokens < 1, bad
  // sampling options, n out of range, a session of another tenant or with
  // nothing to continue, tokens whose KV the whole pool cannot hold: such a
  // request could never be admitted), NotFound for a session that does not
  // exist;
  // `*rejected` (if given) says which part. ResourceExhausted when the
  // queue is full; InvalidArgument after Shutdown. A session that goes away
  // between Submit and admission fails the request then (kError, NotFound).
  // `on_event` is called for every token and finish (never from inside
  // Submit).
  Result<RequestId> Submit(GenerationRequest request, EventCallback on_event, RequestPart* rejected = nullptr);

  // Cancels a queued or running request: its sequences are released before
  // the next step and its callback gets kFinish/kCancelled (done). Unknown
  // or finished ids are ignored (false).
  bool Cancel(RequestId id);

  // A consistent snapshot, published at the end of every loop iteration
  // (after a step's events). Once RunBetweenSteps returns, the snapshot
  // covers every event delivered before the task ran.
  SchedulerStats Stats() const;

  // Runs `task` on the scheduler thread between two steps (no step in
  // progress; the engine and the session methods below are the task's) and
  // returns its status. Blocks the caller until done. From the scheduler
  // thread itself (a callback) it runs at once. After Shutdown:
  // InvalidArgument without running it.
  Status RunBetweenSteps(std::function<Status(Engine&)> task);

  // Stops the thread (see ShutdownMode); idempotent; blocks until stopped.
  void Shutdown(ShutdownMode mode);

  // --- Named sessions (scheduler thread: inside a RunBetweenSteps task) ---
  // A session is a manager sequence plus PENDING tokens: tokens that belong
  // to the conversation but are not in the KV yet (the last generated token
  // of a finished request is sampled, never fed). A request resuming the
  // session feeds pending + its prompt. Save both to restore exactly.
  //
  // Sessions are named per tenant (`salt`, the requests' tenant_salt):
  // every method sees only that tenant's, and another tenant's session is
  // NotFound with the message of a missing one.
  //
  // The manager sequence kept under `name` (NotFound otherwise). The
  // scheduler owns it: read it, fork it, do not release it.
  // A session swapped out to host RAM under pool pressure is imported back
  // first (ResourceExhausted when the pool has no room for it now).
  Result<kv::SeqId> SessionSequence(uint64_t salt, const std::string& name);
  Result<std::vector<int32_t>> SessionPendingTokens(uint64_t salt, const std::string& name) const;
  // Takes ownership of manager sequence `seq` (e.g. one restored from a
  // file) as tenant `salt`'s session `name` with `pending` tokens,
  // replacing (and releasing) that tenant's session of that name.
  // InvalidArgument if seq is unknown or already a session.
  Status AdoptSession(const std::string& name, kv::SeqId seq, uint64_t salt, std::vector<int32_t> pending = {});
  // Releases the session's sequence (NotFound if none).
  Status DropSession(uint64_t salt, const std::string& name);
  // The tenant's session names, sorted.
  std::vector<std::string> SessionNames(uint64_t salt) const;

  // (scheduler thread) The KV manager's and the prefix cache's invariants,
  // and every running sequence's cache lock held (tests).
  Status CheckInvariants() const;

  Engine& engine() { return engine_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Sample;
  struct Request;
  struct Task;
  struct SessionEntry {
    kv::SeqId seq = -1;  // -1 while swapped out
    std::vector<int32_t> pending;
    uint64_t last_used = 0;
    // Swapped to host RAM to make room in the pool (scheduler_swap.cc):
    // its next turn starts from this copy; null while in the pool.
    std::shared_ptr<const SwappedSequence> swapped;
  };
  // A session's name within its tenant.
  using SessionKey = std::pair<uint64_t, std::string>;  // (salt, name)
  // What the gate checks a resumed session against (any thread, under mu_).
  struct SessionSummary {
    int64_t tokens = 0;  // in the KV and pending
    bool has_pending = false;
  };

  Scheduler(Engine& engine, SchedulerOptions options);
  static double MeasurePrefill(Engine& engine);
  // The gate's parts (scheduler_gate.cc): the checks that need no session;
  // continue_session resolved against the sessions kept (under mu_); the
  // checks of a resumed session (at Submit and again at admission).
  Status CheckRequest(const GenerationRequest& r, RequestPart* part) const;
  Status CheckPin(const GenerationRequest& r) const;
  Status ResolveSession(GenerationRequest& r, RequestPart* part) const;
  Status CheckResume(const GenerationRequest& r, const SessionSummary& s, RequestPart* part) const;
  Status CheckPoolHolds(const std::string& what, int64_t tokens) const;
  SessionSummary Summary(const SessionEntry& e) const;
  Status CheckResumeAtAdmission(const GenerationRequest& r, const SessionEntry** session) const;
  // Publishes sessions_ to session_index_ after it changed.
  void IndexSessions();
  void Loop();
  double Now() const { return options_.clock(); }
  // The loop's parts (scheduler.cc: the loop; scheduler_admit.cc: admission,
  // in-flight prefix sharing, preemption; scheduler_step.cc: a step and what
  // follows it; each says what its functions do).
  void TakeInbox(std::vector<std::unique_ptr<Request>>* incoming, std::vector<RequestId>* cancels,
                 std::vector<std::shared_ptr<Task>>* tasks);
  void Enqueue(std::unique_ptr<Request> r);
  void Admit();
  // In-flight prefix sharing (scheduler_admit.cc says how).
  bool WaitsForPrefix(Request& r);
  // Tier lookups (scheduler_tiers.cc): true while `r` waits for a load;
  // imports a finished load into the pool and the prefix cache.
  bool WaitsForTiers(Request& r);
  std::vector<int32_t> LookupTokens(const Request& r) const;
  void ImportTierLoad(Request& r);
  // Chunks in the tiers (chunk reuse, docs/kv-reuse.md): a chunked request
  // waits while the chunks the chunk cache lacks are looked up in the
  // tiers; those found go into the chunk cache, so assembly takes them.
  bool WaitsForChunks(Request& r);
  void ImportChunkLoad(Request& r);
  // Write-through of a sequence leaving a request (finished or preempted);
  // nothing in write-back mode.
  void WriteThrough(const Request& r, kv::SeqId seq);
  // Writes the blocks of `seq` no tier is known to hold (write-back).
  void WriteBlocks(kv::SeqId seq);
  // Whether the request may use the prefix cache.
  bool Caches(const Request& r) const;
  void PublishPrefix(Sample& s, int blocks);
  // Whether `r` fits now; if so gives its samples their sequences.
  Status TryAdmit(Request& r, uint64_t* available, bool* admitted);
  // Chunk reuse (scheduler_chunks.cc): the gate's checks of `chunks`; the
  // assembly of every running sample that starts a chunked prompt, before
  // the step (false: none ran).
  Status CheckChunks(const GenerationRequest& r, RequestPart* part) const;
  bool AssembleChunks();
  // One sample's assembly; false when the request left the running set.
  bool AssembleSample(Request& r, Sample& s);
  bool RunStep();  // false: nothing to run
  void AfterStep(Request& r, Sample& s);
  // After a step (or an assembly) consumed input of `r`: the compression
  // moment of its samples in `reached`, forking samples, then sampling
  // every sample with nothing pending (r may leave the running set).
  void SampleReady(Request& r, const std::vector<Sample*>& reached);
  // The compression moment of the samples in `reached` that belong to `r`;
  // false when the request failed (and left the running set).
  bool CompressAtBase(Request& r, const std::vector<Sample*>& reached);
  bool ForkSiblings(Request& r);
  // Room for an operation of about `bytes` the pool could not hold: evicts
  // unused cached pages (LRU), else preempts the youngest running request
  // (*preempted; nullptr when pages were evicted). False when nothing can
  // give way (one request runs: the one that needs the room). The step, the
  // compression moment and forking samples all retry through it.
  bool MakeRoom(uint64_t bytes, Request** preempted);
  Request* Youngest();
  void Preempt(Request* r);
  // Swap preemption (scheduler_swap.cc): moves `r`'s sequences to host RAM
  // when the preemption mode and the cost say so and they can be exported;
  // false (nothing changed) to recompute instead.
  bool SwapOut(Request& r);
  // A swapped-out sequence back in the pool, sharing its leading pages with
  // `anchor` (the request's first sample swapped in) as it did before
  // (ResourceExhausted: no room yet; the image is kept).
  Result<kv::SeqId> SwapIn(const SwappedSequence& swapped, kv::SeqId anchor);
  // Under pool pressure: the least recently used named session in the pool
  // (not `keep`) swapped to host RAM, its pages released; false when none
  // can be (none left, a policy's state, the swap space full).
  bool SwapOutIdleSession(const SessionKey* keep);
  // A session's tokens and its release, wherever its sequence is.
  const std::vector<int32_t>& SessionTokens(const SessionEntry& e) const;
  void ReleaseSession(const SessionEntry& e);
  uint64_t SwappedBytes() const;
  uint64_t SwapSpace() const;  // --swap-bytes, or the pool's budget
  void FinishSample(Request& r, Sample& s, FinishReason reason, Status status);
  void FailRequest(Request& r, FinishReason reason, Status status);
  void CancelId(RequestId id);
  void Emit(Request& r, const RequestEvent& e);
  std::unique_ptr<Request> TakeRunning(Request* r);
  // Keeps `entry` under `key` (replacing a session there), then applies the
  // per-tenant and total quotas.
  void KeepSession(const SessionKey& key, SessionEntry entry);
  void DropLruSessions(uint64_t salt);
  void PublishStats();
  uint64_t KvBytesFor(int64_t tokens) const;
  int RunningSequences() const;

  Engine& engine_;
  SchedulerOptions options_;
  std::unique_ptr<kv::RadixCache> cache_;
  int n_vocab_ = 0;
  int page_tokens_ = 0;
  uint64_t block_bytes_ = 0;  // KV bytes of one page_tokens block
  bool compress_once_ = false;  // the spec has policies that compress once
  std::shared_ptr<kv::tier::TierStore> tiers_;  // null without tiers (or without the prefix cache)
  double prefill_seconds_per_token_ = 0;         // measured (moving average), for abandoning slow loads
  // The prefill cost tier loads and swaps are judged by: the steps'
  // measurement, else the options' speed, else 0 (unknown).
  double PrefillSecondsPerToken() const;
  double copy_bytes_per_second_ = 0;             // measured (moving average over swaps), for the swap cost
  bool CompressesAtBase(const Request& r) const;
  std::unique_ptr<ChunkAssembler> chunker_;  // null: chunk reuse off (chunker_status_ says why)
  bool chunks_to_tiers_ = false;  // whether the chunks the request being assembled computes go to the tiers
  Status chunker_status_;
  // The compressed cache's part (scheduler_compressed.cc): the base token
  // after which r compresses; the entry a sample of r may start from; a
  // compressed sample's sequence kept for others; a sequence leaving a
  // request handed to the cache that can hold it (ownership passes).
  int Moment(const Request& r) const;
  std::pair<kv::SeqId, int> LookupCompressed(const Request& r, const std::vector<int32_t>& tokens);
  void KeepCompressed(const Request& r, const Sample& s);
  void CacheSequence(kv::SeqId seq);
  std::unique_ptr<CompressedCache> compressed_;  // with the prefix cache

  // Shared with other threads, under mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<RequestId> cancels_;
  std::vector<std::shared_ptr<Task>> tasks_;
  std::map<RequestId, bool> live_;  // submitted and not done
  std::map<SessionKey, SessionSummary> session_index_;  // sessions_ as the gate sees them
  bool stopping_ = false;           // Shutdown called
  bool stopped_ = false;            // the thread ended
  ShutdownMode shutdown_mode_ = ShutdownMode::kDrain;
  RequestId next_id_ = 1;
  mutable std::mutex stats_mu_;
  SchedulerStats stats_;
  std::mutex shutdown_mu_;  // serialises Shutdown callers
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  // Scheduler thread only.
  std::vector<std::unique_ptr<Request>> queue_;    // priority desc, then id asc
  std::vector<std::unique_ptr<Request>> running_;  // by id: the last is the youngest
  std::map<SessionKey, SessionEntry> sessions_;
  uint64_t session_tick_ = 0;
  SchedulerStats work_;  // the loop's counters, copied to stats_
  double start_time_ = 0;
};

}  // namespace kvx::engine
