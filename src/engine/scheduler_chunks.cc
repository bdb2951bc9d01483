// Chunk reuse in the scheduler (GenerationRequest::chunks, docs/kv-reuse.md):
// the gate's checks of a chunked prompt, and its assembly
// (engine/chunk_assembly.h) in place of a prefill. An assembly is a step of
// its own (model::RowRecompute runs one sequence per forward pass): it runs
// between admission and the batched step, and the request then decodes in
// the batch like any other.
#include <string>

#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {

Status Scheduler::CheckChunks(const GenerationRequest& r, RequestPart* part) const {
  *part = RequestPart::kChunks;
  if (chunker_ == nullptr) return chunker_status_;
  const ChunkPrompt& c = *r.chunks;
  if (c.gaps.size() > c.chunks.size()) return InvalidArgument("a chunked prompt has more gaps than chunks");
  if (static_cast<int>(c.chunks.size()) > options_.max_chunks) {
    return InvalidArgument("the request names " + std::to_string(c.chunks.size()) + " chunks, more than the " +
                           std::to_string(options_.max_chunks) + " allowed: merge neighbouring chunks");
  }
  if (!r.resume_session.empty() || !r.continue_session.empty()) {
    return InvalidArgument("chunks cannot continue a session (an assembled prompt starts a sequence of its own): "
                           "drop the session or send the chunks' text in the prompt");
  }
  if (c.repair.mode == ChunkRepairMode::kBlend && c.repair.blend_layer >= engine_.model().config().n_layers) {
    return InvalidArgument("chunk repair " + c.repair.ToString() + ": the check layer must be below the model's " +
                           std::to_string(engine_.model().config().n_layers) + " layers");
  }
  *part = RequestPart::kPrompt;
  if (r.prompt != c.Tokens()) return InvalidArgument("the prompt must be the chunked prompt's tokens (ChunkPrompt::Tokens)");
  return Status::Ok();
}

bool Scheduler::AssembleChunks() {
  if (chunker_ == nullptr) return false;
  auto fresh = [](const Sample& s) { return s.session != nullptr && !s.finished && s.session->n_past() == 0; };
  std::vector<Request*> todo;
  for (auto& r : running_) {
    if (r->req.chunks == nullptr) continue;
    for (const Sample& s : r->samples) {
      if (fresh(s)) {
        todo.push_back(r.get());
        break;
      }
    }
  }
  for (Request* r : todo) {
    std::vector<Sample*> reached;  // assembled with nothing left to feed
    bool alive = true;
    for (Sample& s : r->samples) {
      if (!fresh(s)) continue;
      if (!(alive = AssembleSample(*r, s))) break;
      if (s.pending.empty() && CompressesAtBase(*r)) reached.push_back(&s);
    }
    if (alive) SampleReady(*r, reached);
  }
  return !todo.empty();
}

bool Scheduler::AssembleSample(Request& r, Sample& s) {
  const ChunkPrompt& c = *r.req.chunks;
  const double t0 = Now();
  for (;;) {
    ChunkUsage usage;
    chunks_to_tiers_ = r.req.cache != CacheMode::kNone;
    Result<const float*> logits = chunker_->Assemble(s.session.get(), c.prefix, c.chunks, c.suffix, c.repair, &usage, c.gaps);
    if (logits.ok()) {
      s.logits.assign(*logits, *logits + n_vocab_);
      s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(r.base.size()));
      if (s.index == 0) {
        r.timing.chunk_tokens = static_cast<int>(usage.chunk_tokens);
        r.timing.chunk_cached_tokens = static_cast<int>(usage.cached_tokens);
        r.timing.chunk_recomputed_tokens = static_cast<int>(usage.recomputed_tokens);
      }
      work_.chunk_tokens += static_cast<uint64_t>(usage.chunk_tokens);
      work_.chunk_cached_tokens += static_cast<uint64_t>(usage.cached_tokens);
      work_.chunk_computed_tokens += static_cast<uint64_t>(usage.computed_tokens);
      work_.chunk_recomputed_tokens += static_cast<uint64_t>(usage.recomputed_tokens);
      work_.prompt_tokens_computed += static_cast<uint64_t>(usage.prefix_tokens + usage.computed_tokens +
                                                            usage.recomputed_tokens + usage.suffix_tokens + usage.gap_tokens);
      work_.chunk_cache = chunker_->cache().stats();
      work_.steps++;
      work_.busy_seconds += Now() - t0;
      return true;
    }
    // A failed assembly may have fed the prefix: start again from an empty sequence.
    s.session = engine_.AdoptSequence(engine_.kv_manager().AddSequence(r.req.tenant_salt));
    Request* victim = nullptr;
    if (logits.status().code() == StatusCode::kResourceExhausted &&
        MakeRoom(KvBytesFor(static_cast<int64_t>(r.base.size())), &victim)) {
      if (victim == &r) return false;
      continue;
    }
    FailRequest(r, FinishReason::kError, logits.status().WithContext("assembling the chunks"));
    return false;
  }
}

}  // namespace kvx::engine
