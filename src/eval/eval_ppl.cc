// The ppl/kld pass of RunEval (eval_ppl.h) and the KV measurement of a run.
#include "eval/eval_ppl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "eval/perplexity.h"
#include "eval/stats.h"
#include "eval/storage_trip.h"
#include "model/sampler.h"
#include "util/mmap_file.h"
#include "util/clock.h"

namespace kvx::eval {
namespace {

bool Has(const std::vector<Task>& tasks, Task t) { return std::find(tasks.begin(), tasks.end(), t) != tasks.end(); }

// Whether ppl/kld use the split protocol (EvalOptions::compress): some
// spec has a policy that compresses once, and compression is on.
// Any policy, not only once ones: a continuous policy (a StreamingLLM
// window, H2O under a budget) or Quest's selection acts between steps or
// in decode steps only, so over one whole-chunk prefill it changes no
// logit (the sweep saw KLD exactly 0 at every ratio).
bool SplitTextChunks(const EvalOptions& opt, std::span<const EvalRun> runs) {
  if (!opt.storage_codec.empty()) return true;
  if (opt.compress == "none") return false;
  // --kld-score asks for its tokens after the context: a run without a
  // policy (a codec alone) is scored on the same positions, not on the
  // second half of each chunk, so its row compares with the policies'.
  if (opt.always_split || opt.kld_score > 0) return true;
  for (const EvalRun& run : runs) {
    if (!run.engine->kv_manager().policies().empty()) return true;
  }
  return false;
}

// The split protocol's context tokens of a chunk (kld_context: a share of
// the chunk below 1, else tokens): at least 1, and at least 2 tokens left to
// score.
int SplitContext(const EvalOptions& opt, int chunk_len) {
  const int ctx = opt.kld_context >= 1.0 ? static_cast<int>(opt.kld_context)
                                         : static_cast<int>(std::lround(opt.kld_context * chunk_len));
  return std::clamp(ctx, 1, chunk_len - 2);
}

// The chunk's logits of rows first..chunk_len-2. Split protocol: prefill
// the context (first tokens), Compress, then feed the rest one token at a
// time (teacher forced), each token's logits scored: every scored
// position sees the compressed context, as a served request's decode
// does (with `trip`, through the storage codec first: ThroughStorage).
// Otherwise one prefill with logits from row `first` on.
Status ChunkLogits(engine::Session& session, size_t n_vocab, const std::vector<int32_t>& chunk, int first, bool split,
                   StorageTrip* trip, std::vector<float>* logits) {
  if (!split) return session.FeedWithLogits(chunk, first, logits);
  const std::span<const int32_t> all(chunk);
  KVX_RETURN_IF_ERROR(session.Feed(all.first(first)).status());
  KVX_RETURN_IF_ERROR(session.Compress());
  std::unique_ptr<engine::Session> restored;
  if (trip) {
    KVX_ASSIGN_OR_RETURN(restored, ThroughStorage(session, all.first(first), trip));
  }
  engine::Session& tail = restored ? *restored : session;
  logits->resize((chunk.size() - 1 - first) * n_vocab);
  for (size_t j = first; j + 1 < chunk.size(); ++j) {
    KVX_ASSIGN_OR_RETURN(const float* row, tail.Feed(all.subspan(j, 1)));
    std::copy(row, row + n_vocab, logits->begin() + static_cast<long>((j - first) * n_vocab));
  }
  return Status::Ok();
}

}  // namespace

double LiveSlotFraction(const kv::SequenceKV& seq) {
  const kv::KVLayout& l = seq.layout();
  int64_t live = 0, slots = 0;
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int h = 0; h < l.n_kv_heads; ++h) {
      live += seq.LiveEntries(layer, h);
      slots += static_cast<int64_t>(seq.table(layer, h).num_pages()) * l.page_tokens;
    }
  }
  return slots > 0 ? static_cast<double>(live) / static_cast<double>(slots) : 1.0;
}

void ObserveKv(const EvalRun& run, uint64_t f16_bytes_per_token, KvMeasure* kv) {
  // Every byte kept outside the pool counts: the page bounds (quest), the
  // per-entry scales of a cross-layer merged cache (minicache's norms), the
  // key-channel masks of a pruned one (think) and the policies' per-sequence
  // statistics (KVManager::SideBytes).
  const kv::SequenceKV& seq = run.session->kv();
  const uint64_t side = run.engine->kv_manager().SideBytes(run.session->id());
  kv->Observe(run.engine->pool().bytes_in_use() + side, run.session->n_past(), f16_bytes_per_token,
              LiveSlotFraction(seq));
}

std::vector<TextTaskResult> RunTextTasks(const model::Model& model, const EvalOptions& opt,
                                         std::span<const int32_t> text, int n_chunks, std::span<const EvalRun> runs,
                                         uint64_t f16_bytes_per_token, const TextPassHooks& hooks) {
  const int chunk_len = opt.chunk;
  const bool split = SplitTextChunks(opt, runs);
  const int first = split ? SplitContext(opt, chunk_len) : chunk_len / 2;
  const int n_rows = chunk_len - 1 - first;
  const int n_vocab = model.config().n_vocab;
  const bool want_kld = Has(opt.tasks, Task::kKld);
  const size_t n_runs = runs.size();
  const model::Tokenizer& tok = model.tokenizer();

  struct RunState {
    MeanAccumulator nll, top1;
    std::vector<double> kl;
    KvMeasure kv;
    std::string error;
    double seconds = 0;
  };
  std::vector<RunState> st(n_runs);
  std::vector<double> base_lp(want_kld ? static_cast<size_t>(n_rows) * n_vocab : 0);
  std::vector<int32_t> base_top(want_kld ? n_rows : 0);
  std::vector<double> lq(n_vocab);
  std::vector<float> logits;
  std::vector<int32_t> chunk(chunk_len);
  const bool through_storage = !opt.storage_codec.empty();
  const kv::tier::StorageLevel storage =
      kv::tier::ParseStorageLevel(opt.storage_codec).value_or(kv::tier::StorageLevel::kLossless);
  std::vector<std::shared_ptr<const kv::tier::StorageTransform>> transforms(n_runs);
  if (through_storage && storage == kv::tier::StorageLevel::kCompact) {
    const Result<std::string> text = ReadNonEmptyTextFile(opt.storage_calib);
    const Result<std::vector<int32_t>> calib =
        text.ok() ? TokenizeCalibrationText(model, *text, opt.storage_calib_tokens) : text.status();
    for (size_t r = 1; r < n_runs; ++r) {
      Result<std::shared_ptr<const kv::tier::StorageTransform>> t =
          calib.ok() ? CalibrateStorage(*runs[r].engine, *calib, chunk_len, opt.storage_rates) : calib.status();
      if (t.ok()) {
        transforms[r] = *t;
      } else {
        st[r].error = "--storage-codec compact: " + t.status().message();
      }
    }
  }
  for (int c = 0; c < n_chunks; ++c) {
    std::copy(text.begin() + static_cast<size_t>(c) * chunk_len, text.begin() + static_cast<size_t>(c + 1) * chunk_len,
              chunk.begin());
    if (tok.add_bos() && tok.bos() >= 0) chunk[0] = tok.bos();
    for (size_t r = 0; r < n_runs; ++r) {
      hooks.set_label(r, want_kld ? "ppl+kld" : "ppl");
      RunState& s = st[r];
      if (!s.error.empty()) {
        hooks.advance(chunk_len);
        continue;
      }
      const double t0 = util::MonotonicSeconds();
      engine::Session& session = *runs[r].session;
      session.Reset();
      std::optional<StorageTrip> trip;
      if (r > 0 && through_storage) {
        trip.emplace();
        trip->level = storage;
        trip->transform = transforms[r];
      }
      const Status status =
          ChunkLogits(session, static_cast<size_t>(n_vocab), chunk, first, split, trip ? &*trip : nullptr, &logits);
      if (!status.ok()) {
        s.error = status.message();
        session.Reset();
        hooks.advance(chunk_len);
        continue;
      }
      if (trip) {
        s.kv.Observe(trip->bytes, trip->tokens, f16_bytes_per_token);
      } else {
        ObserveKv(runs[r], f16_bytes_per_token, &s.kv);
      }
      for (int j = first; j < chunk_len - 1; ++j) {
        const float* row = &logits[static_cast<size_t>(j - first) * n_vocab];
        s.nll.Add(NextTokenNll(row, n_vocab, chunk[j + 1]));  // as `kvx perplexity` scores it
        if (!want_kld) continue;
        const size_t k = static_cast<size_t>(j - first);
        if (r == 0) {
          LogSoftmax(row, n_vocab, &base_lp[k * n_vocab]);
          base_top[k] = model::ArgMax(row, n_vocab);
        } else if (st[0].error.empty()) {
          LogSoftmax(row, n_vocab, lq.data());
          s.kl.push_back(KlDivergence(&base_lp[k * n_vocab], lq.data(), n_vocab));
          s.top1.Add(model::ArgMax(row, n_vocab) == base_top[k] ? 1.0 : 0.0);
        }
      }
      session.Reset();
      s.seconds += util::MonotonicSeconds() - t0;
      hooks.advance(chunk_len);
    }
  }
  std::vector<TextTaskResult> out(n_runs);
  for (size_t r = 0; r < n_runs; ++r) {
    RunState& s = st[r];
    TextTaskResult& res = out[r];
    res.seconds = s.seconds;
    if (Has(opt.tasks, Task::kPpl)) {
      PplResult p;
      p.kv = s.kv;
      p.seconds = s.seconds;
      p.chunk = chunk_len;
      p.context = split ? first : 0;
      if (!s.error.empty()) {
        p.ok = false;
        p.error = s.error;
      } else {
        p.n_chunks = n_chunks;
        p.n_scored = static_cast<int>(s.nll.count());
        p.ppl = std::exp(s.nll.Mean());
        p.ppl_stderr = p.ppl * s.nll.StdErr();
      }
      res.ppl = p;
    }
    if (want_kld && r > 0) {
      KldResult k;
      k.context = split ? first : 0;
      k.kv = s.kv;
      k.seconds = s.seconds;
      if (!st[0].error.empty() || !s.error.empty()) {
        k.ok = false;
        k.error = !s.error.empty() ? s.error : "the baseline failed: " + st[0].error;
      } else {
        MeanAccumulator kl;
        for (double v : s.kl) kl.Add(v);
        k.per_position.assign(s.kl.begin(), s.kl.end());
        std::sort(s.kl.begin(), s.kl.end());
        k.n_positions = kl.count();
        k.mean = kl.Mean();
        k.mean_stderr = kl.StdErr();
        k.median = PercentileSorted(s.kl, 0.5);
        k.p90 = PercentileSorted(s.kl, 0.9);
        k.p99 = PercentileSorted(s.kl, 0.99);
        k.max = s.kl.empty() ? 0.0 : s.kl.back();
        k.top1 = s.top1.Mean();
        k.top1_stderr = s.top1.StdErr();
      }
      res.kld = k;
    }
  }
  return out;
}

}  // namespace kvx::eval
