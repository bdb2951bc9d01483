#include "eval/scbench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "eval/eval.h"
#include "eval/ruler.h"
#include "eval/stats.h"
#include "eval/text_score.h"

namespace kvx::eval {
namespace {

// One shared context: its tokens (BOS first) and its questions (tokens
// without BOS, the answer each expects), in the order asked.
struct SharedContext {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> questions;
  std::vector<std::string> answers;
};

Result<std::vector<SharedContext>> BuildContexts(const model::Tokenizer& tok, const Haystack& hay, int length,
                                                 const SharedContextOptions& o, int n_gen, uint64_t seed) {
  NiahSpec spec;
  spec.n_keys = o.questions;
  const std::vector<double> depths = {0.1, 0.5, 0.9};
  const int trials = (o.contexts + static_cast<int>(depths.size()) - 1) / static_cast<int>(depths.size());
  KVX_ASSIGN_OR_RETURN(ProbePlan plan, BuildNiahPlan(tok, hay, spec, {length}, depths, trials, n_gen, seed));
  // Trials of one depth come together: take them round-robin over depths.
  std::vector<const GenItem*> items;
  for (int t = 0; t < trials; ++t) {
    for (size_t d = 0; d < depths.size(); ++d) items.push_back(&plan.items[d * trials + t]);
  }
  items.resize(static_cast<size_t>(o.contexts));
  std::mt19937_64 rng(seed ^ 0x5cbe);
  std::vector<SharedContext> out;
  for (const GenItem* item : items) {
    if (item->question_start <= 0 || item->needles.size() != static_cast<size_t>(o.questions)) {
      return Internal("the niah_multikey prompt has no question mark or not one needle per question");
    }
    SharedContext c;
    c.context.assign(item->prompt.begin(), item->prompt.begin() + item->question_start);
    std::vector<size_t> order(item->needles.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const auto& [key, value] = item->needles[i];
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> q, tok.Encode(NiahQuestion(spec, key), false, false));
      c.questions.push_back(std::move(q));
      c.answers.push_back(value);
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Submits requests to a scheduler and waits for their answers.
class Asker {
 public:
  explicit Asker(engine::Scheduler* s) : s_(s) {}
  // Submits every request between two steps (so they run together), then
  // waits; the generated tokens of each, or the first error.
  Result<std::vector<std::vector<int32_t>>> Ask(std::vector<engine::GenerationRequest> requests) {
    std::vector<engine::RequestEvent> done(requests.size());
    int open = static_cast<int>(requests.size());
    std::mutex mu;
    std::condition_variable cv;
    KVX_RETURN_IF_ERROR(s_->RunBetweenSteps([&](engine::Engine&) -> Status {
      for (size_t i = 0; i < requests.size(); ++i) {
        KVX_RETURN_IF_ERROR(s_->Submit(std::move(requests[i]), [&, i](const engine::RequestEvent& e) {
                                 if (!e.done) return;
                                 std::lock_guard<std::mutex> l(mu);
                                 done[i] = e;
                                 if (--open == 0) cv.notify_all();
                               })
                                .status());
      }
      return Status::Ok();
    }));
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return open == 0; });
    std::vector<std::vector<int32_t>> out;
    for (const engine::RequestEvent& e : done) {
      if (e.reason == engine::FinishReason::kError) return e.status;
      out.push_back(e.tokens);
    }
    return out;
  }

 private:
  engine::Scheduler* s_;
};

engine::GenerationRequest Greedy(std::vector<int32_t> prompt, int n_gen) {
  engine::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n_gen;
  r.sampling.temperature = 0;
  return r;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The answers to one context's questions under `protocol`.
Result<std::vector<std::vector<int32_t>>> AskContext(engine::Scheduler& s, const SharedContext& c,
                                                     const std::string& protocol, int n_gen, int index) {
  Asker asker(&s);
  const int moment = static_cast<int>(c.context.size());
  // The context alone, compressed at its end and kept (see the header).
  engine::GenerationRequest warm = Greedy(c.context, 1);
  warm.compress_at = moment;
  KVX_RETURN_IF_ERROR(asker.Ask({warm}).status());
  if (protocol == "multi-query") {
    std::vector<engine::GenerationRequest> asks;
    for (const std::vector<int32_t>& q : c.questions) {
      engine::GenerationRequest r = Greedy(Concat(c.context, q), n_gen);
      r.compress_at = moment;
      asks.push_back(std::move(r));
    }
    return asker.Ask(std::move(asks));
  }
  const std::string session = "scbench-" + std::to_string(index);
  std::vector<std::vector<int32_t>> answers;
  for (size_t i = 0; i < c.questions.size(); ++i) {
    engine::GenerationRequest r = Greedy(i == 0 ? Concat(c.context, c.questions[0]) : c.questions[i], n_gen);
    if (i == 0) {
      r.compress_at = moment;
    } else {
      r.resume_session = session;
      r.compress = false;  // compressed once, at the context's end
    }
    r.save_session = session;
    KVX_ASSIGN_OR_RETURN(auto a, asker.Ask({std::move(r)}));
    answers.push_back(a[0]);
  }
  // Sessions hold their pages until dropped: the next context needs them.
  KVX_RETURN_IF_ERROR(s.RunBetweenSteps([&](engine::Engine&) { return s.DropSession(0, session); }));
  return answers;
}

std::string Detokenize(const model::Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::string text;
  for (int32_t t : tokens) {
    if (!tok.IsEog(t)) text += tok.TokenToPiece(t, /*special=*/false);
  }
  return text;
}

}  // namespace

Result<SharedContextResult> RunSharedContextEval(const model::Model& model, ThreadPool* threads,
                                                 const SharedContextOptions& o) {
  if (o.protocol != "multi-query" && o.protocol != "multi-turn") {
    return InvalidArgument("--protocol must be multi-query or multi-turn, not '" + o.protocol + "'");
  }
  if (o.questions < 2) return InvalidArgument("the shared-context protocols need at least 2 questions per context");
  if (o.contexts < 1) return InvalidArgument("the shared-context protocols need at least 1 context per length");
  if (o.specs.empty()) return InvalidArgument("give at least one --kv spec");
  if (o.lengths.empty()) return InvalidArgument("give at least one length");
  const model::Tokenizer& tok = model.tokenizer();
  KVX_ASSIGN_OR_RETURN(std::string essays, LoadEssays(o.data_dir + "/paul_graham_essays"));
  const Haystack hay = MakeHaystack(essays);
  const int n_gen = o.n_gen > 0 ? o.n_gen : RulerDefaultGen(Task::kNiahMultikey);
  // Multi-turn: every answer and later question joins the context, so the
  // length covers the context and the first question; the context grows
  // by the rest.
  std::vector<std::vector<SharedContext>> by_length;
  int n_ctx = 0;
  int64_t n_contexts = 0;
  double tokens = 0;  // the progress bar's weight: every spec runs every context
  auto context_tokens = [&](const SharedContext& c) {
    int total = static_cast<int>(c.context.size());
    for (const auto& q : c.questions) total += static_cast<int>(q.size()) + n_gen;
    return total;
  };
  for (int length : o.lengths) {
    KVX_ASSIGN_OR_RETURN(auto contexts, BuildContexts(tok, hay, length, o, n_gen, o.seed + length));
    for (const SharedContext& c : contexts) {
      n_ctx = std::max(n_ctx, context_tokens(c) + 1);
      tokens += context_tokens(c);
      ++n_contexts;
    }
    by_length.push_back(std::move(contexts));
  }
  if (o.progress != nullptr) o.progress->SetTotal(n_contexts * static_cast<int64_t>(o.specs.size()), tokens * o.specs.size());
  SharedContextResult result;
  result.protocol = o.protocol;
  for (const std::string& spec : o.specs) {
    engine::EngineOptions eo;
    KVX_ASSIGN_OR_RETURN(eo.kv_spec, kv::ParseKVSpec(spec));
    eo.n_ctx = n_ctx;
    eo.n_batch = o.n_batch;
    eo.n_seqs = o.questions + 1;
    Result<std::unique_ptr<engine::Engine>> eng = engine::Engine::Create(&model, threads, eo);
    if (!eng.ok()) return eng.status().WithContext(spec);
    engine::SchedulerOptions so;
    so.max_step_tokens = o.n_batch;
    so.max_running = std::min(o.questions + 1, o.n_batch);
    KVX_ASSIGN_OR_RETURN(auto sched, engine::Scheduler::Create(**eng, so));
    const auto t0 = std::chrono::steady_clock::now();
    SharedContextResult::SpecWork work;
    work.spec = spec;
    for (size_t l = 0; l < o.lengths.size(); ++l) {
      std::vector<SharedContextRow> rows(static_cast<size_t>(o.questions));
      for (int q = 0; q < o.questions; ++q) rows[q] = SharedContextRow{spec, o.lengths[l], q, 0, 0, 0, 1};
      int index = 0;
      if (o.progress != nullptr) o.progress->SetLabel(spec + ": " + o.protocol + " " + std::to_string(o.lengths[l]));
      for (const SharedContext& c : by_length[l]) {
        Result<std::vector<std::vector<int32_t>>> answers = AskContext(*sched, c, o.protocol, n_gen, index++);
        if (!answers.ok()) return answers.status().WithContext(spec + ", length " + std::to_string(o.lengths[l]));
        for (int q = 0; q < o.questions; ++q) {
          rows[q].n++;
          rows[q].hits += ValuesFound(Detokenize(tok, (*answers)[q]), {c.answers[q]}) >= 1.0;
        }
        work.contexts++;
        if (o.progress != nullptr) o.progress->Advance(1, context_tokens(c));
      }
      for (SharedContextRow& r : rows) {
        const Interval ci = WilsonInterval(r.hits, r.n);
        r.lo = ci.lo;
        r.hi = ci.hi;
        result.rows.push_back(r);
      }
    }
    sched->Shutdown(engine::ShutdownMode::kDrain);
    const engine::SchedulerStats st = sched->Stats();
    work.compressions = st.compressions;
    work.compressed_hits = st.compressed_hits;
    work.prefix_hit_tokens = st.prefix_hit_tokens;
    work.prompt_tokens_computed = st.prompt_tokens_computed;
    work.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.work.push_back(work);
  }
  return result;
}

std::string SharedContextTable(const SharedContextResult& r) {
  int questions = 0;
  for (const SharedContextRow& row : r.rows) questions = std::max(questions, row.question + 1);
  std::string out = "| spec | length |";
  std::string rule = "|---|---|";
  for (int q = 0; q < questions; ++q) {
    out += (r.protocol == "multi-turn" ? " turn " : " question ") + std::to_string(q + 1) + " |";
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  char buf[96];
  for (size_t i = 0; i < r.rows.size(); i += static_cast<size_t>(questions)) {
    out += "| " + r.rows[i].spec + " | " + std::to_string(r.rows[i].length) + " |";
    for (int q = 0; q < questions && i + q < r.rows.size(); ++q) {
      const SharedContextRow& c = r.rows[i + q];
      std::snprintf(buf, sizeof buf, " %.0f%% [%.0f, %.0f] (%d/%d) |", c.n ? 100.0 * c.hits / c.n : 0.0, 100 * c.lo,
                    100 * c.hi, c.hits, c.n);
      out += buf;
    }
    out += "\n";
  }
  out += "\n| spec | contexts | compressions | compressed-cache hits | prefix-cache hit tokens | prompt tokens computed | "
         "seconds |\n|---|---|---|---|---|---|---|\n";
  for (const auto& w : r.work) {
    std::snprintf(buf, sizeof buf, " %.1f |", w.seconds);
    out += "| " + w.spec + " | " + std::to_string(w.contexts) + " | " + std::to_string(w.compressions) + " | " +
           std::to_string(w.compressed_hits) + " | " + std::to_string(w.prefix_hit_tokens) + " | " +
           std::to_string(w.prompt_tokens_computed) + " |" + buf + "\n";
  }
  return out;
}

std::string SharedContextJson(const SharedContextResult& r) {
  nlohmann::json j;
  j["protocol"] = r.protocol;
  j["rows"] = nlohmann::json::array();
  for (const SharedContextRow& row : r.rows) {
    j["rows"].push_back({{"spec", row.spec}, {"length", row.length}, {"question", row.question}, {"n", row.n},
                         {"hits", row.hits}, {"lo", row.lo}, {"hi", row.hi}});
  }
  j["work"] = nlohmann::json::array();
  for (const auto& w : r.work) {
    j["work"].push_back({{"spec", w.spec}, {"contexts", w.contexts}, {"compressions", w.compressions},
                         {"compressed_hits", w.compressed_hits}, {"prefix_hit_tokens", w.prefix_hit_tokens},
                         {"prompt_tokens_computed", w.prompt_tokens_computed}, {"seconds", w.seconds}});
  }
  return j.dump(1) + "\n";
}

}  // namespace kvx::eval
