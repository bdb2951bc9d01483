#include "eval/head_calibration.h"

#include <algorithm>
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

  // duo: mass on `needle` positions. razor: first_pos = the call's first
  // query position, period = span (echo/induction).
  bool recording = false;
  std::vector<uint8_t> needle;  // [position] 1 = a key digit
  int first_pos = 0, period = 0, call_queries = 0;

  void OnProbabilities(int, int layer, int query_index, int head, int, const float* probs, const int32_t* positions,
                       int n) override {
    if (!recording) return;
    double stat = 0;
    if (period == 0) {
      for (int j = 0; j < n; ++j) {
        const int32_t p = positions[j];
        if (p >= 0 && p < static_cast<int32_t>(needle.size()) && needle[p]) stat += probs[j];
      }
    } else {
      // Query position i (the call's last `window` queries); earlier copies
      // of its token sit at i - k * period (k >= 1, after the BOS).
      const int i = first_pos + (call_queries - window_) + query_index;
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

}  // namespace

Result<kv::HeadTable> CalibrateHeads(engine::Engine& engine, const HeadCalibrationOptions& o) {
  if (o.method != "duo" && o.method != "razor") {
    return InvalidArgument("calibration method '" + o.method + "' is unknown; use duo or razor");
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
  auto owned = std::make_unique<HeadProbe>(L.n_layers, n_heads, duo ? 1 : o.span);
  HeadProbe* probe = owned.get();
  engine.kv_manager().AddPolicy(std::move(owned));

  // Each prompt with the number of its last tokens whose queries are observed.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> tails, needle_end;
  if (duo) {
    // Teacher forcing: the prompt, then the key's tokens but the last, so the
    // observed queries are those that predict each token of the key (the
    // first may be a space token that needs no retrieval).
    KVX_ASSIGN_OR_RETURN(ProbePlan plan, BuildPasskeyPlan(tok, o.lengths, o.depths, o.trials, 8, o.seed));
    for (GenItem& item : plan.items) {
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> answer, tok.Encode(" " + item.expected, false, false));
      needle_end.push_back(static_cast<int>(item.prompt.size()));
      tails.push_back(static_cast<int>(answer.size()));
      item.prompt.insert(item.prompt.end(), answer.begin(), answer.end() - 1);
      prompts.push_back(std::move(item.prompt));
    }
  } else {
    const std::vector<int32_t> candidates = CopyCandidateTokens(tok);
    if (candidates.empty()) return InvalidArgument("the vocabulary has no normal tokens for random spans");
    std::mt19937_64 rng(o.seed);
    KVX_ASSIGN_OR_RETURN(std::vector<int32_t> p, tok.Encode("", /*add_special=*/true, /*parse_special=*/false));  // BOS
    std::vector<int32_t> span(o.span);
    for (int32_t& t : span) t = candidates[rng() % candidates.size()];
    for (int r = 0; r < o.repeats; ++r) p.insert(p.end(), span.begin(), span.end());
    prompts.push_back(std::move(p));
    tails.push_back(o.span);
  }
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const std::vector<int32_t>& prompt = prompts[pi];
    const int n = static_cast<int>(prompt.size());
    if (n > engine.n_ctx()) {
      return InvalidArgument("a calibration prompt of " + std::to_string(n) + " tokens exceeds the context of " +
                             std::to_string(engine.n_ctx()) + "; raise -c or lower the lengths");
    }
    const int tail = tails[pi];
    if (tail > engine.n_batch()) return InvalidArgument("the observed tail exceeds the batch size");
    probe->set_window(tail);
    KVX_ASSIGN_OR_RETURN(auto session, engine.NewSession());
    probe->recording = false;
    KVX_RETURN_IF_ERROR(session->Feed(std::span<const int32_t>(prompt.data(), n - tail)).status());
    if (duo) {
      probe->needle.assign(n, 0);  // the key's digits inside the prompt (not the teacher-forced answer)
      for (int i = 0; i < needle_end[pi]; ++i) {
        const std::string piece = tok.TokenToPiece(prompt[i], false);
        probe->needle[i] = std::any_of(piece.begin(), piece.end(), [](char c) { return c >= '0' && c <= '9'; });
      }
      probe->period = 0;
    } else {
      probe->period = o.span;
      probe->first_pos = n - tail;
      probe->call_queries = tail;
    }
    probe->recording = true;
    Status fed = session->Feed(std::span<const int32_t>(prompt.data() + n - tail, tail)).status();
    probe->recording = false;
    KVX_RETURN_IF_ERROR(fed);
  }
  kv::HeadTable table;
  table.method = o.method;
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
