#include "eval/head_calibration.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "engine/session.h"
#include "eval/prompts.h"
#include "kv/policy/policy.h"

namespace kvx::eval {
namespace {

// Observes the last `window` queries of each call while `recording`, and
// accumulates per (layer, query head) the mean of a per-query statistic.
class HeadProbe : public kv::KVPolicy, public kv::AttentionObserver {
 public:
  HeadProbe(int n_layers, int n_heads, int window)
      : n_heads_(n_heads), window_(window), sum_(static_cast<size_t>(n_layers) * n_heads, 0.0),
        count_(sum_.size(), 0) {}
  std::string_view name() const override { return "head-calibration"; }
  Status OnStepCommitted(kv::KVManager&, kv::SeqId) override { return Status::Ok(); }
  kv::AttentionObserver* observer() override { return this; }
  int QueryWindow() const override { return window_; }
  void set_window(int w) { window_ = w; }

  // The observed call's first query position. duo (period 0): the mass
  // outside the first `sinks` and the last `recent` positions. razor:
  // echo/induction with the span's `period`.
  bool recording = false;
  int first_pos = 0, period = 0, sinks = 0, recent = 0;

  void OnProbabilities(int, int layer, int query_index, int head, int, const float* probs, const int32_t* positions,
                       int n) override {
    if (!recording) return;
    const int i = first_pos + query_index;  // the call is exactly the observed queries
    double stat = 0;
    if (period == 0) {
      // Only the mass above a uniform share counts: attention spread evenly
      // over the far context averages values much as the kept part does, so
      // dropping it barely moves the output; a spike on a few far tokens does.
      const float uniform = 1.0f / static_cast<float>(n);
      for (int j = 0; j < n; ++j) {
        const int32_t p = positions[j];
        if (p >= sinks && i - p >= recent) stat += std::max(0.0f, probs[j] - uniform);
      }
    } else {
      // Earlier copies of query i's token sit at i - k * period (k >= 1, after the BOS).
      double echo = 0, induction = 0;
      for (int j = 0; j < n; ++j) {
        const int32_t p = positions[j];
        if (p >= i || p < 1) continue;
        if ((i - p) % period == 0) echo += probs[j];
        if ((i - p + 1) % period == 0 && i - p + 1 >= period) induction += probs[j];
      }
      stat = std::max(echo, induction);
    }
    std::lock_guard<std::mutex> lock(mu_);
    sum_[static_cast<size_t>(layer) * n_heads_ + head] += stat;
    ++count_[static_cast<size_t>(layer) * n_heads_ + head];
  }

  double Mean(int layer, int head) const {
    const size_t i = static_cast<size_t>(layer) * n_heads_ + head;
    return count_[i] > 0 ? sum_[i] / count_[i] : 0.0;
  }

 private:
  int n_heads_, window_;
  std::mutex mu_;
  std::vector<double> sum_;
  std::vector<int64_t> count_;
};

// A calibration prompt and how many of its last tokens' queries are observed.
struct CalibPrompt {
  std::vector<int32_t> tokens;
  int tail = 0;
};

// Teacher forcing: the prompt, then the key's tokens but the last, so the
// observed queries are those that predict each token of the key.
Result<std::vector<CalibPrompt>> PasskeyPrompts(const model::Tokenizer& tok, const HeadCalibrationOptions& o) {
  KVX_ASSIGN_OR_RETURN(ProbePlan plan, BuildPasskeyPlan(tok, o.lengths, o.depths, o.trials, 8, o.seed));
  std::vector<CalibPrompt> out;
  for (GenItem& item : plan.items) {
    KVX_ASSIGN_OR_RETURN(std::vector<int32_t> answer, tok.Encode(" " + item.expected, false, false));
    item.prompt.insert(item.prompt.end(), answer.begin(), answer.end() - 1);
    out.push_back({std::move(item.prompt), static_cast<int>(answer.size())});
  }
  return out;
}

// BOS, `length` - 1 - span tokens of the text (from a seeded offset) in which
// a span of `copy_span` tokens sits at `depth` of the room that leaves the
// window after it, then the span again but its last token: the observed
// queries predict the repeat, which only a head reaching past the window can.
Result<std::vector<CalibPrompt>> CopyPrompts(const model::Tokenizer& tok, const HeadCalibrationOptions& o) {
  if (o.text.empty()) return InvalidArgument("copy calibration needs a text (--text FILE of natural text)");
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> text, tok.Encode(o.text, false, false));
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> bos, tok.Encode("", /*add_special=*/true, /*parse_special=*/false));
  std::mt19937_64 rng(o.seed);
  std::vector<CalibPrompt> out;
  for (int length : o.lengths) {
    const int body = length - static_cast<int>(bos.size()) - o.copy_span;
    const int room = body - o.copy_span - o.window;
    if (room < 0) {
      return InvalidArgument("a copy calibration prompt of " + std::to_string(length) + " tokens has no room for a " +
                             std::to_string(o.copy_span) + "-token span a window (" + std::to_string(o.window) +
                             ") away from its copy; raise --lengths");
    }
    if (static_cast<int>(text.size()) < body) {
      return InvalidArgument("the copy text has " + std::to_string(text.size()) + " tokens, fewer than the " +
                             std::to_string(body) + " a " + std::to_string(length) +
                             "-token prompt needs; give a longer --text");
    }
    for (double depth : o.depths) {
      for (int t = 0; t < o.trials; ++t) {
        const size_t from = rng() % (text.size() - static_cast<size_t>(body) + 1);
        CalibPrompt p;
        p.tokens = bos;
        p.tokens.insert(p.tokens.end(), text.begin() + from, text.begin() + from + body);
        const size_t span_at = bos.size() + static_cast<size_t>(std::lround(depth * room));
        const std::vector<int32_t> span(p.tokens.begin() + span_at, p.tokens.begin() + span_at + o.copy_span);
        p.tokens.insert(p.tokens.end(), span.begin(), span.end() - 1);
        p.tail = o.copy_span;
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

// RazorAttention: BOS, then `repeats` copies of `span` random normal tokens;
// the last copy's queries are observed.
Result<std::vector<CalibPrompt>> RepeatedRandomPrompt(const model::Tokenizer& tok, const HeadCalibrationOptions& o) {
  const std::vector<int32_t> candidates = CopyCandidateTokens(tok);
  if (candidates.empty()) return InvalidArgument("the vocabulary has no normal tokens for random spans");
  std::mt19937_64 rng(o.seed);
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> p, tok.Encode("", /*add_special=*/true, /*parse_special=*/false));  // BOS
  std::vector<int32_t> span(o.span);
  for (int32_t& t : span) t = candidates[rng() % candidates.size()];
  for (int r = 0; r < o.repeats; ++r) p.insert(p.end(), span.begin(), span.end());
  return std::vector<CalibPrompt>{{std::move(p), o.span}};
}

}  // namespace

Result<kv::HeadTable> CalibrateHeads(engine::Engine& engine, const HeadCalibrationOptions& o) {
  if (o.method != "duo" && o.method != "razor") {
    return InvalidArgument("calibration method '" + o.method + "' is unknown; use duo or razor");
  }
  if (o.method == "duo" && o.calib != "copy" && o.calib != "passkey") {
    return InvalidArgument("calibration data '" + o.calib + "' is unknown; use copy or passkey");
  }
  const model::Model& model = engine.model();
  const model::Tokenizer& tok = model.tokenizer();
  const kv::KVLayout& L = engine.kv_manager().spec().layout;
  const int n_heads = model.config().n_heads;
  const bool duo = o.method == "duo";
  if (!duo && (o.span < 2 || o.repeats < 2 || o.span > engine.n_batch())) {
    return InvalidArgument("razor calibration needs span in 2.." + std::to_string(engine.n_batch()) +
                           " and at least 2 repeats");
  }
  std::vector<CalibPrompt> prompts;
  if (!duo) {
    KVX_ASSIGN_OR_RETURN(prompts, RepeatedRandomPrompt(tok, o));
  } else if (o.calib == "copy") {
    KVX_ASSIGN_OR_RETURN(prompts, CopyPrompts(tok, o));
  } else {
    KVX_ASSIGN_OR_RETURN(prompts, PasskeyPrompts(tok, o));
  }
  auto owned = std::make_unique<HeadProbe>(L.n_layers, n_heads, 1);
  HeadProbe* probe = owned.get();
  engine.kv_manager().AddPolicy(std::move(owned));
  probe->period = duo ? 0 : o.span;
  probe->sinks = o.sinks;
  probe->recent = o.window;
  for (const CalibPrompt& prompt : prompts) {
    const int n = static_cast<int>(prompt.tokens.size());
    if (n > engine.n_ctx()) {
      return InvalidArgument("a calibration prompt of " + std::to_string(n) + " tokens exceeds the context of " +
                             std::to_string(engine.n_ctx()) + "; raise -c or lower the lengths");
    }
    if (prompt.tail > engine.n_batch()) return InvalidArgument("the observed tail exceeds the batch size");
    probe->set_window(prompt.tail);
    KVX_ASSIGN_OR_RETURN(auto session, engine.NewSession());
    probe->recording = false;
    KVX_RETURN_IF_ERROR(session->Feed(std::span<const int32_t>(prompt.tokens.data(), n - prompt.tail)).status());
    probe->first_pos = n - prompt.tail;
    probe->recording = true;
    Status fed = session->Feed(std::span<const int32_t>(prompt.tokens.data() + n - prompt.tail, prompt.tail)).status();
    probe->recording = false;
    KVX_RETURN_IF_ERROR(fed);
  }
  kv::HeadTable table;
  table.method = o.method;
  table.calib = duo ? o.calib : "repeated random tokens";
  table.n_layers = L.n_layers;
  table.n_kv_heads = L.n_kv_heads;
  const int G = n_heads / L.n_kv_heads;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      double best = 0;
      for (int g = 0; g < G; ++g) best = std::max(best, probe->Mean(l, h * G + g));
      table.scores.push_back(best);
    }
  }
  return table;
}

}  // namespace kvx::eval
