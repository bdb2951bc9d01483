// RunEval: plans every probe input once, then runs the baseline and the specs
// (see eval.h for the order and the measurement rules).
#include <algorithm>
#include <cmath>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "engine/generate.h"
#include "engine/session.h"
#include "eval/eval.h"
#include "eval/eval_ppl.h"
#include "eval/prefill_cache.h"
#include "eval/ruler.h"
#include "eval/storage_trip.h"
#include "eval/text_score.h"
#include "kv/tier/storage_codec.h"
#include "model/sampler.h"
#include "util/mmap_file.h"
#include "util/clock.h"

namespace kvx::eval {

namespace {

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool Has(const std::vector<Task>& tasks, Task t) { return std::find(tasks.begin(), tasks.end(), t) != tasks.end(); }

std::string Truncate(std::string s, size_t n) {
  if (s.size() > n) {
    s.resize(n);
    while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
    if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xC0) s.pop_back();
    s += "...";
  }
  return s;
}

class Runner {
 public:
  Runner(const model::Model& model, ThreadPool* threads, const EvalOptions& options, const EvalHooks& hooks)
      : model_(model), threads_(threads), opt_(options), hooks_(hooks) {}

  Result<EvalReport> Run() {
    KVX_RETURN_IF_ERROR(Resolve());
    KVX_RETURN_IF_ERROR(Plan());
    KVX_RETURN_IF_ERROR(SetUpSpecs());
    // Added to the work the bar has done already (kvx tune runs this after
    // its KLD passes on the same bar).
    if (hooks_.progress) {
      const ProgressState& st = hooks_.progress->state();
      hooks_.progress->SetTotal(st.done_items + total_items_, st.done_weight + total_weight_);
    }
    if (Has(opt_.tasks, Task::kPpl) || Has(opt_.tasks, Task::kKld)) RunTextTasks();
    for (size_t r = 0; r < rts_.size() && !Cancelled(); ++r) {
      SpecResult& res = report_.specs[r];
      const double t0 = util::MonotonicSeconds();
      if (Has(opt_.tasks, Task::kCopy)) {
        SetLabel(r, "copy");
        res.copy = RunCopy(r);
        Update(r);
      }
      if (Has(opt_.tasks, Task::kPasskey)) {
        SetLabel(r, "passkey");
        res.passkey = RunRetrieval(r, passkey_, "first_integer");
        Update(r);
      }
      if (Has(opt_.tasks, Task::kLines)) {
        SetLabel(r, "lines");
        res.lines = RunRetrieval(r, lines_, "first_integer");
        Update(r);
      }
      if (Has(opt_.tasks, Task::kNeedle)) {
        SetLabel(r, "needle");
        res.needle = RunRetrieval(r, needle_, "rouge1_f1");
        Update(r);
      }
      for (const auto& [task, plan] : ruler_plans_) {
        SetLabel(r, TaskName(task));
        *res.Retrieval(task) = RunRetrieval(r, plan, "values_found");
        Update(r);
      }
      res.seconds += util::MonotonicSeconds() - t0;
      res.done = true;
      sessions_[r].reset();  // its pages go back to the pool
      Notify();
      if (hooks_.progress) hooks_.progress->Message(SummaryLine(res));
    }
    report_.complete = !Cancelled();
    Notify();
    return std::move(report_);
  }

 private:
  bool Cancelled() {
    if (!cancelled_ && hooks_.cancelled) cancelled_ = hooks_.cancelled();
    return cancelled_;
  }

  // ---- setup ----

  Status Resolve() {
    const model::ModelConfig& c = model_.config();
    EvalOptions& o = opt_;
    if (o.tasks.empty()) return InvalidArgument("no task given");
    if (o.n_ctx < 0) return InvalidArgument("context length must be >= 0 (0 = the model's own)");
    if (o.n_ctx == 0) o.n_ctx = c.n_ctx_train;
    const int n_ctx = o.n_ctx;
    if (n_ctx < 16) return InvalidArgument("context length must be at least 16 tokens");
    // --kld-context in tokens with --kld-score: the chunk is the context, the
    // scored tokens and the one whose next token is not known.
    const bool context_in_tokens = o.kld_context >= 1.0;
    if (o.kld_score < 0) return InvalidArgument("--kld-score must be >= 0 (0: the rest of each chunk)");
    if (context_in_tokens && o.kld_context != std::floor(o.kld_context)) {
      return InvalidArgument("--kld-context is a fraction below 1 or a whole number of tokens, got " +
                             std::to_string(o.kld_context));
    }
    if (o.kld_score > 0) {
      if (!context_in_tokens) {
        return InvalidArgument("--kld-score needs --kld-context in tokens (e.g. --kld-context 4096 --kld-score 256)");
      }
      const int64_t want = static_cast<int64_t>(o.kld_context) + o.kld_score + 1;
      if (want > n_ctx) {
        return InvalidArgument("--kld-context " + std::to_string(static_cast<int64_t>(o.kld_context)) +
                               " + --kld-score " + std::to_string(o.kld_score) + " + 1 = " + std::to_string(want) +
                               " tokens per chunk do not fit the context " + std::to_string(n_ctx) +
                               " (raise -c or shorten them)");
      }
      if (o.chunk != 0 && o.chunk != want) {
        return InvalidArgument("--chunk " + std::to_string(o.chunk) + " contradicts --kld-context + --kld-score + 1 = " +
                               std::to_string(want) + " (drop --chunk)");
      }
      o.chunk = static_cast<int>(want);
    }
    if (o.chunk == 0) o.chunk = n_ctx;
    if (o.chunk < 4 || o.chunk > n_ctx) {
      return InvalidArgument("the ppl/kld chunk (" + std::to_string(o.chunk) + ") must be in 4.." +
                             std::to_string(n_ctx) + " (the context)");
    }
    if (o.copy_span < 2) return InvalidArgument("copy span must be at least 2 tokens");
    if (o.copy_skip < 1 || o.copy_skip >= o.copy_span) {
      return InvalidArgument("copy skip must be in 1.." + std::to_string(o.copy_span - 1));
    }
    if (o.copy_trials < 1 || o.passkey_trials < 1 || o.lines_trials < 1 || o.ruler_trials < 1) {
      return InvalidArgument("trial counts must be at least 1");
    }
    const int max_d = n_ctx - 1 - 2 * o.copy_span;
    if (Has(o.tasks, Task::kCopy)) {
      if (max_d < 0) {
        return InvalidArgument("copy span " + std::to_string(o.copy_span) + " is too long for context " +
                               std::to_string(n_ctx));
      }
      if (o.copy_distances.empty()) o.copy_distances = {0, n_ctx / 32, n_ctx / 8, n_ctx / 2, max_d};
      for (int d : o.copy_distances) {
        if (d < 0 || d > max_d) {
          return InvalidArgument("copy distance " + std::to_string(d) + " does not fit: 1 + 2 x span (" +
                                 std::to_string(o.copy_span) + ") + distance must be <= context " +
                                 std::to_string(n_ctx) + ", so distances go up to " + std::to_string(max_d));
        }
      }
      std::vector<int> d = o.copy_distances;
      std::sort(d.begin(), d.end());
      d.erase(std::unique(d.begin(), d.end()), d.end());
      o.copy_distances = d;
    }
    lengths_defaulted_ = o.lengths.empty();
    // 3 * n_ctx in 64 bits: a model may claim a context up to 2^30 tokens.
    if (o.lengths.empty()) o.lengths = {n_ctx / 4, n_ctx / 2, static_cast<int>(int64_t{3} * n_ctx / 4), n_ctx};
    for (int l : o.lengths) {
      if (l < 1 || l > n_ctx) {
        return InvalidArgument("length " + std::to_string(l) + " is outside 1.." + std::to_string(n_ctx) +
                               " (the context)");
      }
    }
    if (o.ruler_gen < 0) return InvalidArgument("--ruler-gen must be >= 0 (0 = each task's default)");
    if (o.compress != "excluded" && o.compress != "included" && o.compress != "none") {
      return InvalidArgument("--compress must be excluded, included or none (got '" + o.compress + "')");
    }
    if (!o.storage_codec.empty()) {
      if (!kv::tier::ParseStorageLevel(o.storage_codec)) {
        return InvalidArgument("--storage-codec must be one of " + std::string(kv::tier::kStorageLevelChoices) +
                               " (got '" + o.storage_codec + "')");
      }
      for (Task t : o.tasks) {
        if (t == Task::kCopy) {
          return InvalidArgument("--storage-codec applies to ppl, kld and the retrieval tasks, not copy (drop --tasks "
                                 "copy, or run it without --storage-codec)");
        }
      }
    }
    if (!(o.kld_context > 0.0 && (o.kld_context < 1.0 || o.kld_context <= o.chunk - 2))) {
      return InvalidArgument("--kld-context must be a fraction strictly between 0 and 1 (the context's share of a "
                             "ppl/kld chunk) or a token count that leaves at least 2 tokens of the " +
                             std::to_string(o.chunk) + "-token chunk to score, got " + std::to_string(o.kld_context));
    }
    if (o.depths.empty()) o.depths = {0.0, 0.25, 0.5, 0.75, 1.0};
    for (double d : o.depths) {
      if (!(d >= 0.0 && d <= 1.0)) return InvalidArgument("depths are fractions in [0, 1]");
    }
    if (o.line_counts.empty()) o.line_counts = {2, 5, 10, 20, 40, 80, 160};
    for (int n : o.line_counts) {
      if (n < 1) return InvalidArgument("line counts must be positive");
    }
    if ((Has(o.tasks, Task::kPpl) || Has(o.tasks, Task::kKld)) && o.text.empty()) {
      return InvalidArgument("ppl and kld need a text: give one with -f FILE (e.g. ../shared/golden/stories_eval.txt)");
    }
    ModelInfo& mi = report_.model;
    mi.path = o.model_path;
    mi.name = c.name;
    mi.arch = c.arch_name;
    mi.n_layers = c.n_layers;
    mi.n_kv_heads = c.n_kv_heads;
    mi.head_dim = c.head_dim;
    mi.n_ctx_train = c.n_ctx_train;
    mi.n_vocab = c.n_vocab;
    mi.f16_bytes_per_token = 2ull * 2ull * c.n_layers * c.n_kv_heads * c.head_dim;
    report_.created_utc = UtcNow();
    return Status::Ok();
  }

  void AddWork(int64_t items, double weight) {
    total_items_ += items * static_cast<int64_t>(1 + opt_.specs.size());
    total_weight_ += weight * static_cast<double>(1 + opt_.specs.size());
  }

  Status Plan() {
    const model::Tokenizer& tok = model_.tokenizer();
    const EvalOptions& o = opt_;
    if (!o.text.empty()) {
      KVX_ASSIGN_OR_RETURN(text_tokens_, tok.Encode(o.text, /*add_special=*/true, /*parse_special=*/false));
    }
    if (Has(o.tasks, Task::kPpl) || Has(o.tasks, Task::kKld)) {
      const int n = static_cast<int>(text_tokens_.size());
      if (n < 2 * o.chunk) {
        return InvalidArgument("the text has " + std::to_string(n) + " tokens; ppl/kld with " +
                               std::to_string(o.chunk) + "-token chunks need at least " + std::to_string(2 * o.chunk) +
                               " (a longer text or a smaller --chunk)");
      }
      n_chunks_ = n / o.chunk;
      if (o.max_chunks >= 0) n_chunks_ = std::min(n_chunks_, o.max_chunks);
      if (n_chunks_ < 1) return InvalidArgument("--chunks must be at least 1");
      AddWork(n_chunks_, static_cast<double>(n_chunks_) * o.chunk);
    }
    if (Has(o.tasks, Task::kCopy)) {
      const std::vector<int32_t> candidates = CopyCandidateTokens(tok);
      if (candidates.empty()) return InvalidArgument("the vocabulary has no normal tokens for copy spans");
      report_.copy_candidates = static_cast<int>(candidates.size());
      copy_random_ = BuildRandomCopySequences(candidates, o.copy_span, o.copy_distances, o.copy_trials, o.seed);
      if (!text_tokens_.empty()) {
        std::vector<int32_t> raw = text_tokens_;
        if (!raw.empty() && tok.add_bos() && raw.front() == tok.bos()) raw.erase(raw.begin());
        KVX_ASSIGN_OR_RETURN(copy_text_,
                             BuildTextCopySequences(raw, o.copy_span, o.copy_distances, o.copy_trials, o.seed + 1));
      }
      for (const auto* seqs : {&copy_random_, &copy_text_}) {
        for (const CopySequence& s : *seqs) AddWork(1, 2.0 * s.span.size() + s.filler.size());
      }
    }
    if (lengths_defaulted_ && HasGridTask()) {
      KVX_RETURN_IF_ERROR(DropShortDefaultLengths());
    }
    auto add_plan = [&](const ProbePlan& p) {
      for (const GenItem& it : p.items) AddWork(1, static_cast<double>(it.prompt.size() + it.n_gen));
    };
    if (Has(o.tasks, Task::kPasskey)) {
      for (int l : o.lengths) {
        if (l <= o.passkey_gen) return InvalidArgument("passkey lengths must exceed --passkey-gen");
      }
      KVX_ASSIGN_OR_RETURN(passkey_,
                           BuildPasskeyPlan(tok, o.lengths, o.depths, o.passkey_trials, o.passkey_gen, o.seed + 2));
      add_plan(passkey_);
    }
    if (Has(o.tasks, Task::kLines)) {
      const std::string path = o.data_dir + "/longeval/lines/200_lines.jsonl";
      auto content = ReadFileToString(path);
      if (!content.ok()) {
        return NotFound("lines needs the LongEval data: cannot read " + path + " (" + content.status().message() +
                        "); point --data at ../shared/data");
      }
      KVX_ASSIGN_OR_RETURN(lines_, BuildLinesPlan(tok, *content, o.line_counts, o.lines_trials, o.lines_gen, o.n_ctx,
                                                  &report_.dropped_line_counts));
      if (lines_.cells.empty()) {
        return InvalidArgument("no line count fits the context " + std::to_string(o.n_ctx) +
                               "; give smaller counts with --lines");
      }
      std::vector<int> kept;
      for (const GridCell& c : lines_.cells) kept.push_back(c.n_lines);
      opt_.line_counts = kept;
      add_plan(lines_);
    }
    if (Has(o.tasks, Task::kNeedle)) {
      for (int l : o.lengths) {
        if (l <= o.needle_gen) return InvalidArgument("needle lengths must exceed --needle-gen");
      }
      KVX_ASSIGN_OR_RETURN(std::string haystack, LoadEssays(o.data_dir + "/paul_graham_essays"));
      KVX_ASSIGN_OR_RETURN(needle_, BuildNeedlePlan(tok, haystack, o.lengths, o.depths, o.needle_gen));
      add_plan(needle_);
    }
    KVX_RETURN_IF_ERROR(PlanRuler());
    for (const auto& [task, plan] : ruler_plans_) add_plan(plan);
    report_.settings = opt_;
    report_.settings.text.clear();  // the text itself is not part of the report
    return Status::Ok();
  }

  bool HasGridTask() const {
    for (Task t : opt_.tasks) {
      if (t == Task::kPasskey || t == Task::kNeedle || IsRulerTask(t)) return true;
    }
    return false;
  }

  int RulerGen(Task t) const { return opt_.ruler_gen > 0 ? opt_.ruler_gen : RulerDefaultGen(t); }

  static NiahSpec NiahSpecOf(Task t) {
    NiahSpec s;
    if (t == Task::kNiahWord) s.value = NeedleKind::kWord;
    if (t == Task::kNiahUuid) s.value = NeedleKind::kUuid;
    if (t == Task::kNiahMultikey) s.n_keys = 4;
    if (t == Task::kNiahMultivalue) s.n_values = 4;
    return s;
  }

  // The RULER tasks' plans; each task draws from its own seed, so adding or
  // dropping a task leaves the others' prompts unchanged.
  Status PlanRuler() {
    const model::Tokenizer& tok = model_.tokenizer();
    const EvalOptions& o = opt_;
    std::optional<Haystack> hay;
    for (Task t : o.tasks) {
      if (!IsRulerTask(t)) continue;
      const int n_gen = RulerGen(t);
      for (int l : o.lengths) {
        if (l <= n_gen) {
          return InvalidArgument(std::string(TaskName(t)) + ": lengths must exceed its answer tokens (" +
                                 std::to_string(n_gen) + ", --ruler-gen)");
        }
      }
      const uint64_t seed = o.seed + 16 + static_cast<uint64_t>(t);
      Result<ProbePlan> plan = InvalidArgument("unplanned");
      if (t == Task::kVt) {
        plan = BuildVtPlan(tok, o.lengths, o.depths, o.ruler_trials, n_gen, seed);
      } else {
        if (!hay) {
          KVX_ASSIGN_OR_RETURN(std::string text, LoadEssays(o.data_dir + "/paul_graham_essays"));
          hay = MakeHaystack(text);
        }
        plan = BuildNiahPlan(tok, *hay, NiahSpecOf(t), o.lengths, o.depths, o.ruler_trials, n_gen, seed);
      }
      if (!plan.ok()) return plan.status().WithContext(std::string(TaskName(t)));
      ruler_plans_[t] = std::move(*plan);
    }
    return Status::Ok();
  }

  // The default lengths are fractions of the context; with a verbose
  // tokenizer (stories260K spells words letter by letter) the shortest may not
  // hold even the bare prompt. Those are dropped (at least the context itself
  // stays); lengths the user gives are checked strictly by the planners.
  Status DropShortDefaultLengths() {
    const model::Tokenizer& tok = model_.tokenizer();
    int min_len = 0;
    if (Has(opt_.tasks, Task::kPasskey)) {
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(PasskeyPromptText(0, 0, 50000), true, false));
      min_len = std::max(min_len, static_cast<int>(ids.size()) + opt_.passkey_gen);
    }
    if (Has(opt_.tasks, Task::kNeedle)) {
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           tok.Encode(std::string(kNeedle) + std::string(kNeedleQuestion), true, false));
      min_len = std::max(min_len, static_cast<int>(ids.size()) + opt_.needle_gen);
    }
    for (Task t : opt_.tasks) {
      if (!IsRulerTask(t)) continue;
      Result<int> bare = t == Task::kVt ? VtBareTokens(tok) : NiahBareTokens(tok, NiahSpecOf(t));
      KVX_RETURN_IF_ERROR(bare.status());
      min_len = std::max(min_len, *bare + RulerGen(t));
    }
    // Room for some haystack too: at least a quarter of the length.
    min_len += min_len / 3;
    std::vector<int> kept;
    for (int l : opt_.lengths) {
      if (l >= min_len) kept.push_back(l);
    }
    if (kept.empty()) kept.push_back(opt_.n_ctx);
    opt_.lengths = kept;
    return Status::Ok();
  }

  Status SetUpSpecs() {
    std::vector<std::string> all = {opt_.baseline};
    all.insert(all.end(), opt_.specs.begin(), opt_.specs.end());
    engine::EngineOptions so;
    so.n_ctx = opt_.n_ctx;
    so.n_batch = opt_.n_batch;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string context = std::string(i == 0 ? "baseline" : "--kv") + " '" + all[i] + "'";
      auto spec = kv::ParseKVSpec(all[i]);
      if (!spec.ok()) return spec.status().WithContext(context);
      so.kv_spec = std::move(*spec);
      auto rt = engine::Engine::Create(&model_, threads_, so);
      if (!rt.ok()) return rt.status().WithContext(context);
      if (opt_.compress == "none" && (*rt)->kv_manager().HasOncePolicy()) {
        // Its row would carry the policy's name for a cache it never touched.
        return InvalidArgument(std::string(i == 0 ? "--baseline" : "--kv") + " '" + all[i] +
                               "' has a policy that compresses only when asked (mode=once) and --compress none "
                               "never asks, so it would not run: use --compress excluded or included (or "
                               "mode=continuous where the policy has it)");
      }
      auto session = (*rt)->NewSession();
      if (!session.ok()) return session.status().WithContext("--kv '" + all[i] + "'");
      SpecResult res;
      res.spec = all[i];
      res.canonical = (*rt)->kv_spec().ToString();
      res.is_baseline = i == 0;
      report_.specs.push_back(std::move(res));
      rts_.push_back(std::move(*rt));
      sessions_.push_back(std::move(*session));
    }
    return Status::Ok();
  }

  // ---- progress and updates ----

  std::string SpecLabel(size_t r) const {
    return (r == 0 ? std::string("baseline ")
                   : "spec " + std::to_string(r) + "/" + std::to_string(rts_.size() - 1) + " ") +
           report_.specs[r].spec;
  }
  void SetLabel(size_t r, std::string_view task) {
    if (hooks_.progress) hooks_.progress->SetLabel(SpecLabel(r) + ": " + std::string(task));
  }
  void Advance(double weight) {
    if (hooks_.progress) hooks_.progress->Advance(1, weight);
  }
  void Notify() {
    if (hooks_.on_update) hooks_.on_update(report_);
  }
  void Update(size_t r) {
    SpecResult& s = report_.specs[r];
    s.kv = KvMeasure();
    for (const TaskOutcome* t : std::initializer_list<const TaskOutcome*>{
             s.ppl ? &*s.ppl : nullptr, s.kld ? &*s.kld : nullptr, s.copy ? &*s.copy : nullptr}) {
      if (t) s.kv.Merge(t->kv);
    }
    for (Task t : kRetrievalTasks) {
      if (const std::optional<RetrievalResult>& r = *s.Retrieval(t)) s.kv.Merge(r->kv);
    }
    Notify();
  }
  static std::string SummaryLine(const SpecResult& s) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "done: %s%s  (%.1f s, KV peak %.1f KiB, %.2fx vs f16, %.0f%% of slots live)",
                  s.spec.c_str(), s.is_baseline ? " [baseline]" : "", s.seconds, s.kv.peak_bytes / 1024.0,
                  s.kv.CompressionVsF16(), 100.0 * s.kv.live_fraction.value_or(1.0));
    return buf;
  }

  EvalRun RunOf(size_t r) const { return EvalRun{rts_[r].get(), sessions_[r].get()}; }
  void Observe(size_t r, KvMeasure* kv) { ObserveKv(RunOf(r), report_.model.f16_bytes_per_token, kv); }

  // ---- ppl + kld: chunk by chunk over every spec (eval_ppl.cc) ----

  void RunTextTasks() {
    std::vector<EvalRun> runs;
    for (size_t r = 0; r < rts_.size(); ++r) runs.push_back(RunOf(r));
    const TextPassHooks hooks{[this](size_t r, std::string_view task) { SetLabel(r, task); },
                              [this](double weight) { Advance(weight); }};
    std::vector<TextTaskResult> results = eval::RunTextTasks(model_, opt_, text_tokens_, n_chunks_, runs,
                                                             report_.model.f16_bytes_per_token, hooks);
    for (size_t r = 0; r < results.size(); ++r) {
      SpecResult& res = report_.specs[r];
      res.seconds += results[r].seconds;
      if (results[r].ppl) res.ppl = std::move(results[r].ppl);
      if (results[r].kld) res.kld = std::move(results[r].kld);
      Update(r);
    }
  }

  // ---- copy ----

  CopyResult RunCopy(size_t r) {
    CopyResult res;
    res.span = opt_.copy_span;
    res.skip = opt_.copy_skip;
    const double t0 = util::MonotonicSeconds();
    const model::Tokenizer& tok = model_.tokenizer();
    const bool bos = tok.add_bos() && tok.bos() >= 0;
    const int n_vocab = model_.config().n_vocab;
    engine::Session& session = *sessions_[r];
    std::vector<float> logits;
    for (int src = 0; src < 2; ++src) {
      const std::vector<CopySequence>& seqs = src == 0 ? copy_random_ : copy_text_;
      if (seqs.empty()) continue;
      CopySource out;
      out.source = src == 0 ? "random" : "text";
      out.chance = src == 0 ? 1.0 / report_.copy_candidates : -1.0;
      std::vector<int64_t> hit(opt_.copy_distances.size()), first_hit(opt_.copy_distances.size()),
          scored(opt_.copy_distances.size());
      for (const CopySequence& s : seqs) {
        if (!res.ok) {
          Advance(2.0 * s.span.size() + s.filler.size());
          continue;
        }
        Status status = RunCopySequence(session, s, bos, n_vocab, &logits, &hit[s.distance_index],
                                        &first_hit[s.distance_index], &scored[s.distance_index]);
        if (status.ok()) Observe(r, &res.kv);
        session.Reset();
        if (!status.ok()) {
          res.ok = false;
          res.error = status.message();
        }
        out.n_sequences++;
        Advance(2.0 * s.span.size() + s.filler.size());
      }
      int64_t h = 0, fh = 0, n = 0;
      for (size_t d = 0; d < opt_.copy_distances.size(); ++d) {
        CopyDistance cd;
        cd.distance = opt_.copy_distances[d];
        cd.n_scored = scored[d];
        cd.accuracy = scored[d] ? static_cast<double>(hit[d]) / scored[d] : 0.0;
        cd.first_accuracy = scored[d] ? static_cast<double>(first_hit[d]) / scored[d] : 0.0;
        out.by_distance.push_back(cd);
        h += hit[d];
        fh += first_hit[d];
        n += scored[d];
      }
      out.n_scored = n;
      out.accuracy = n ? static_cast<double>(h) / n : 0.0;
      out.first_accuracy = n ? static_cast<double>(fh) / n : 0.0;
      res.sources.push_back(std::move(out));
    }
    res.seconds = util::MonotonicSeconds() - t0;
    return res;
  }

  Status RunCopySequence(engine::Session& session, const CopySequence& s, bool bos, int n_vocab,
                         std::vector<float>* logits, int64_t* hit, int64_t* first_hit, int64_t* scored) {
    const int span = static_cast<int>(s.span.size());
    const int skip = opt_.copy_skip;
    session.Reset();
    // First occurrence: row i predicts token i + 1 of [BOS] span.
    std::vector<int32_t> seg1;
    if (bos) seg1.push_back(model_.tokenizer().bos());
    seg1.insert(seg1.end(), s.span.begin(), s.span.end());
    KVX_RETURN_IF_ERROR(session.FeedWithLogits(seg1, 0, logits));
    const int off = bos ? 1 : 0;
    int first_ok = 0;
    for (int k = skip; k < span; ++k) {
      const float* row = &(*logits)[static_cast<size_t>(off + k - 1) * n_vocab];
      if (model::ArgMax(row, n_vocab) == s.span[k]) first_ok++;
    }
    if (!s.filler.empty()) KVX_RETURN_IF_ERROR(session.Feed(s.filler).status());
    if (opt_.compress != "none") KVX_RETURN_IF_ERROR(session.Compress());  // the repeat is the question
    // The repeat without its last token: row i predicts repeat token i + 1.
    std::vector<int32_t> seg3(s.span.begin(), s.span.end() - 1);
    KVX_RETURN_IF_ERROR(session.FeedWithLogits(seg3, 0, logits));
    int ok = 0;
    for (int k = skip; k < span; ++k) {
      const float* row = &(*logits)[static_cast<size_t>(k - 1) * n_vocab];
      if (model::ArgMax(row, n_vocab) == s.span[k]) ok++;
    }
    *hit += ok;
    *first_hit += first_ok;
    *scored += span - skip;
    return Status::Ok();
  }

  // ---- passkey, lines, needle, niah*, vt ----

  // EvalOptions::storage_codec on a retrieval prompt: all of it but its last
  // token (*rest: what the session has not been fed yet) is fed, compressed
  // when the spec compresses, and its full blocks go through the storage
  // codec and back, as a tier hit of the same prompt would serve them; the
  // last token is left in *rest for the answer's prefill.
  Status PromptThroughStorage(size_t r, const std::vector<int32_t>& prompt, std::vector<int32_t>* rest,
                              StorageTrip* trip) {
    trip->level = *kv::tier::ParseStorageLevel(opt_.storage_codec);  // checked by Resolve
    trip->transform = storage_transforms_[r];
    const std::span<const int32_t> context = std::span(prompt).first(prompt.size() - 1);
    KVX_RETURN_IF_ERROR(sessions_[r]->Feed(std::span(*rest).first(rest->size() - 1)).status());
    if (opt_.compress != "none") KVX_RETURN_IF_ERROR(sessions_[r]->Compress());
    KVX_ASSIGN_OR_RETURN(sessions_[r], ThroughStorage(*sessions_[r], context, trip));
    rest->assign(prompt.end() - 1, prompt.end());
    return Status::Ok();
  }

  // The compact level's transform of run r, calibrated once, before its
  // first prompt (while its session holds no pages).
  Status CalibrateStorageOnce(size_t r) {
    if (r == 0 || opt_.storage_codec != "compact" || storage_transforms_[r]) return Status::Ok();
    sessions_[r]->Reset();
    KVX_ASSIGN_OR_RETURN(std::string text, ReadNonEmptyTextFile(opt_.storage_calib));
    KVX_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                         TokenizeCalibrationText(model_, std::move(text), opt_.storage_calib_tokens));
    Result<std::shared_ptr<const kv::tier::StorageTransform>> t = CalibrateStorage(*rts_[r], tokens, opt_.chunk, opt_.storage_rates);
    if (!t.ok()) return t.status().WithContext("--storage-codec compact");
    storage_transforms_[r] = *t;
    return Status::Ok();
  }

  RetrievalResult RunRetrieval(size_t r, const ProbePlan& plan, const std::string& metric) {
    RetrievalResult res;
    res.metric = metric;
    const double t0 = util::MonotonicSeconds();
    for (const GridCell& c : plan.cells) {
      CellResult cr;
      cr.cell = c;
      res.cells.push_back(cr);
    }
    const model::Tokenizer& tok = model_.tokenizer();
    const std::optional<int> prompt_window = rts_[r]->kv_manager().PromptWindow();
    // The pages, and how the policies' observers take part in a prompt call
    // (their arithmetic: prefill_cache.h).
    const std::string page_key =
        PrefillCache::PageKey(rts_[r]->kv_spec()) + "|" + rts_[r]->PromptArithmeticKey(opt_.n_batch);
    engine::GenerateOptions g;
    g.sampler.temperature = 0;  // greedy
    g.sampler.repeat_penalty = 1.0f;
    g.stop_at_eog = true;
    std::vector<int32_t> out;
    engine::GenerateStats stats;
    // values_found: stop once more tokens cannot change the score.
    const bool values = metric == "values_found";
    std::string so_far;
    const GenItem* current = nullptr;
    if (const Status calibrated = CalibrateStorageOnce(r); !calibrated.ok()) {
      res.ok = false;
      res.error = calibrated.message();
    }
    // Stop once more tokens cannot change the score: every value found
    // (niah*, vt), or the first integer's digits ended (passkey, lines).
    const bool integer = metric == "first_integer";
    auto stop_when_decided = [&](int32_t, const std::string& piece) {
      so_far += piece;
      return integer ? !FirstIntegerDecided(so_far) : !ValuesDecided(so_far, current->answers);
    };
    for (const GenItem& item : plan.items) {
      const double weight = static_cast<double>(item.prompt.size() + item.n_gen);
      if (res.ok && Cancelled()) res.ok = false, res.error = "cancelled";
      if (!res.ok) {
        Advance(weight);
        continue;
      }
      sessions_[r]->Reset();
      g.n_predict = item.n_gen;
      g.compress_at = -1;
      if (opt_.compress == "excluded" && item.question_start > 0) g.compress_at = item.question_start;
      if (opt_.compress == "included") g.compress_at = static_cast<int>(item.prompt.size());
      so_far.clear();
      current = &item;
      // The prompt's early calls from another spec's prefill when it can
      // stand for this one's (prefill_cache.h); this spec runs the rest.
      const int fed = g.compress_at > 0 ? g.compress_at : static_cast<int>(item.prompt.size());
      const int shared = opt_.prefill_cache_mib > 0 ? SharedPrefixLength(prompt_window, fed, opt_.n_batch) : 0;
      Status status = Status::Ok();
      std::vector<int32_t> rest = item.prompt;
      if (shared > 0) {
        const PrefillCache::Key key{page_key, &plan, static_cast<size_t>(&item - plan.items.data()), shared};
        if (auto restored = prefill_cache_.Restore(key, *rts_[r])) {
          sessions_[r] = std::move(*restored);
          report_.specs[r].prefill_reused += shared;
        } else {
          status = sessions_[r]->Feed(std::span<const int32_t>(item.prompt).first(static_cast<size_t>(shared))).status();
          if (status.ok()) prefill_cache_.Store(key, *sessions_[r]);
        }
        rest.erase(rest.begin(), rest.begin() + shared);
        if (g.compress_at > 0) g.compress_at -= shared;
      }
      std::optional<StorageTrip> trip;
      if (status.ok() && r > 0 && !opt_.storage_codec.empty()) {
        trip.emplace();
        status = PromptThroughStorage(r, item.prompt, &rest, &*trip);
        if (status.ok()) g.compress_at = -1;  // compressed before the trip
      }
      engine::Session& session = *sessions_[r];
      if (status.ok()) {
        status = engine::Generate(&session, rest, g, values || integer ? engine::TokenCallback(stop_when_decided) : nullptr,
                                  &out, &stats);
      }
      if (!status.ok()) {
        res.ok = false;
        res.error = status.message();
        session.Reset();
        Advance(weight);
        continue;
      }
      if (trip) {
        res.kv.Observe(trip->bytes, trip->tokens, report_.model.f16_bytes_per_token);
      } else {
        Observe(r, &res.kv);
      }
      session.Reset();
      const std::string text = tok.Decode(out, /*special=*/false);
      double score = 0;
      bool hit = false;
      if (metric == "rouge1_f1") {
        const RougeScore rs = Rouge1(FirstSentence(text), item.expected);
        score = rs.f1;
        hit = rs.recall >= 1.0;
      } else if (metric == "values_found") {
        score = ValuesFound(text, item.answers);
        hit = score >= 1.0;
      } else {
        const std::optional<int64_t> v = FirstInteger(text);
        hit = v.has_value() && std::to_string(*v) == item.expected;
        score = hit ? 1.0 : 0.0;
      }
      CellResult& cr = res.cells[static_cast<size_t>(item.cell)];
      if (cr.n == 0) cr.example = SanitizeUtf8(Truncate(text, 160));
      cr.n++;
      cr.hits += hit ? 1 : 0;
      cr.score_sum += score;
      cr.prompt_tokens_sum += static_cast<double>(item.prompt.size());
      res.n++;
      res.hits += hit ? 1 : 0;
      res.score_sum += score;
      res.prompts.push_back({static_cast<int>(&item - plan.items.data()), item.cell, hit, score});
      if (hooks_.on_prompt) hooks_.on_prompt(r, res.prompts.back());
      Advance(weight);
    }
    res.seconds = util::MonotonicSeconds() - t0;
    return res;
  }

  const model::Model& model_;
  ThreadPool* threads_;
  EvalOptions opt_;
  EvalHooks hooks_;
  bool cancelled_ = false;
  EvalReport report_;
  std::vector<std::unique_ptr<engine::Engine>> rts_;
  std::vector<std::unique_ptr<engine::Session>> sessions_;
  std::vector<int32_t> text_tokens_;
  int n_chunks_ = 0;
  std::vector<CopySequence> copy_random_, copy_text_;
  ProbePlan passkey_, lines_, needle_;
  std::map<Task, ProbePlan> ruler_plans_;  // in task order
  std::map<size_t, std::shared_ptr<const kv::tier::StorageTransform>> storage_transforms_;  // compact, per run
  PrefillCache prefill_cache_{static_cast<uint64_t>(opt_.prefill_cache_mib) << 20};
  bool lengths_defaulted_ = false;
  int64_t total_items_ = 0;
  double total_weight_ = 0;
};

}  // namespace

Result<EvalReport> RunEval(const model::Model& model, ThreadPool* threads, const EvalOptions& options,
                           const EvalHooks& hooks) {
  Runner runner(model, threads, options, hooks);
  return runner.Run();
}

}  // namespace kvx::eval
