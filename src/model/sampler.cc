#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "ops/nn.h"
#include "util/step_profile.h"

namespace kvx::model {

Status SamplerOptions::Validate() const {
  // One range per option, whoever sets it (CLI, eval, later the server): a
  // value outside it is an error, never silently "off" (top-p 2 used to be).
  if (!std::isfinite(temperature)) return InvalidArgument("--temp must be a finite number (<= 0: greedy)");
  if (top_k < 0) return InvalidArgument("--top-k must be >= 0 (0 disables it)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgument("--top-p must be in (0, 1] (1 disables it)");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return InvalidArgument("--min-p must be in [0, 1] (0 disables it)");
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
    return InvalidArgument("--repeat-penalty must be a finite number > 0 (1 disables it)");
  }
  if (repeat_last_n < 0) return InvalidArgument("--repeat-last-n must be >= 0");
  return Status::Ok();
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

void Sampler::Accept(int32_t token) { history_.push_back(token); }

int32_t ArgMax(const float* logits, int n) {
  // Two passes: the maximum in 16 independent lanes (the compiler turns the
  // selects into vector max instructions), then its first index. The one-pass
  // loop compared against logits[best], a dependent load per element: over a
  // 49k vocabulary it was 2% of decode time at depth 0 (kvx bench, 2 threads).
  // NaNs never compare greater, so they are skipped as before.
  constexpr int kLanes = 16;
  if (n <= 0) return 0;
  float lane[kLanes];
  for (float& x : lane) x = -std::numeric_limits<float>::infinity();
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
  }
  float best = -std::numeric_limits<float>::infinity();
  for (float x : lane) best = x > best ? x : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (int j = 0; j < n; ++j) {
    if (logits[j] == best) return j;
  }
  return 0;  // every value NaN
}

// Cost: the server samples every running sequence on its scheduler thread
// between steps, so a token must cost microseconds, not milliseconds. The
// chain never sorts the whole vocabulary: greedy is ArgMax over the logits
// (no copy without a penalty); top-k selects its k with nth_element; top-p
// sorts only the prefix it keeps, in growing rounds (most of the mass sits
// in few tokens); min-p is a threshold; with no cut-off the draw walks the
// vocabulary in id order. (A full std::sort of 49152 candidates per token,
// the OpenAI default temperature 1 with top_p 1, took ~10 ms: a 32-row step
// spent longer sampling than computing.) The result is a draw from the same
// distribution as before; a given seed may pick other tokens than the
// sort-everything version did.
int32_t Sampler::Sample(const float* logits, int n_vocab) {
  util::ScopedPhase phase(util::StepPhase::kSampling);
  // Repetition penalty (CTRL-style, as llama.cpp): divide positive logits,
  // multiply negative ones, once per distinct recent token.
  const float* l = logits;
  if (options_.repeat_penalty != 1.0f && options_.repeat_last_n > 0) {
    penalized_.assign(logits, logits + n_vocab);
    const size_t from = history_.size() > static_cast<size_t>(options_.repeat_last_n)
                            ? history_.size() - options_.repeat_last_n
                            : 0;
    std::unordered_set<int32_t> seen(history_.begin() + from, history_.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= n_vocab) continue;
      float& x = penalized_[t];
      x = x > 0 ? x / options_.repeat_penalty : x * options_.repeat_penalty;
    }
    l = penalized_.data();
  }
  const int32_t best = ArgMax(l, n_vocab);
  int32_t token = best;
  if (options_.temperature > 0.0f && n_vocab > 1) token = Draw(l, n_vocab, l[best]);
  history_.push_back(token);
  return token;
}

int32_t Sampler::Draw(const float* l, int n_vocab, float max_logit) {
  if (!std::isfinite(max_logit)) return ArgMax(l, n_vocab);
  const double t = options_.temperature;
  if (options_.top_k == 0 && options_.top_p >= 1.0f && options_.min_p <= 0.0f) {
    // No cut-off: softmax(l / t) over the whole vocabulary (vectorised),
    // drawn in id order.
    weights_.resize(n_vocab);
    for (int i = 0; i < n_vocab; ++i) weights_[i] = static_cast<float>(l[i] / t);
    ops::Softmax(weights_.data(), n_vocab);
    double total = 0;
    for (float w : weights_) total += w;
    std::uniform_real_distribution<double> uniform(0.0, total);
    double r = uniform(rng_);
    for (int i = 0; i < n_vocab; ++i) {
      if (r < weights_[i]) return i;
      r -= weights_[i];
    }
    return ArgMax(l, n_vocab);
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  auto p1 = [&](const Candidate& c) { return std::exp(static_cast<double>(c.logit) - max_logit); };  // unnormalised, t = 1
  candidates_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) candidates_[i] = {i, l[i]};
  size_t sorted = 0;  // candidates_[0, sorted) are the best, in order
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < candidates_.size()) {
    // (partial_sort: most candidates lose one comparison with the heap's
    // top; nth_element was 5x slower here.)
    std::partial_sort(candidates_.begin(), candidates_.begin() + options_.top_k, candidates_.end(), by_logit);
    candidates_.resize(options_.top_k);
    sorted = candidates_.size();
  }
  if (options_.top_p < 1.0f) {
    // The smallest best-first prefix holding top_p of the probability: sort
    // only as far as it reaches, in rounds of 64, 256, 1024, ...
    double sum = 0;
    if (sorted == candidates_.size()) {
      for (const Candidate& c : candidates_) sum += p1(c);
    } else {
      // sum_j exp(l_j - max) = 1 / softmax(l)[argmax] (a vectorised exp).
      weights_.assign(l, l + n_vocab);
      ops::Softmax(weights_.data(), n_vocab);
      sum = 1.0 / weights_[ArgMax(l, n_vocab)];
    }
    const double want = options_.top_p * sum;
    double cum = 0;
    size_t i = 0, round = 64;
    while (i < candidates_.size()) {
      if (i == sorted) {
        // (partial_sort for the first small round; for large ones its heap
        // is slower than selecting the round, then sorting it.)
        const auto from = candidates_.begin() + sorted, upto = candidates_.begin() + std::min(candidates_.size(), sorted + round);
        if (sorted == 0) {
          std::partial_sort(from, upto, candidates_.end(), by_logit);
        } else {
          std::nth_element(from, upto - 1, candidates_.end(), by_logit);
          std::sort(from, upto, by_logit);
        }
        sorted = upto - candidates_.begin();
        round *= 4;
      }
      cum += p1(candidates_[i++]);
      if (cum >= want) break;
    }
    candidates_.resize(i);
  }
  if (options_.min_p > 0.0f) {
    // p / p_max >= min_p; the best candidate always stays.
    auto below = [&](const Candidate& c) { return c.logit != max_logit && p1(c) < options_.min_p; };
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(), below), candidates_.end());
  }
  // Temperature, then draw (best first when sorted, else by id).
  double total = 0;
  weights_.resize(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) {
    weights_[i] = static_cast<float>(std::exp((static_cast<double>(candidates_[i].logit) - max_logit) / t));
    total += weights_[i];
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng_);
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (r < weights_[i]) return candidates_[i].id;
    r -= weights_[i];
  }
  return candidates_.front().id;
}

}  // namespace kvx::model
