// Small statistics used by kvx eval: mean with standard error, percentiles,
// log-softmax and the KL divergence between two next-token distributions.
//
// Conventions: sums are accumulated in double; log-softmax uses the max-shift
// (log-sum-exp) form, so large logits do not overflow. KL(P || Q) is computed
// from log-probabilities as sum_i p_i (log p_i - log q_i); when both rows are
// bit-identical every term is exactly 0, so a cache compared with itself gives
// KLD 0 exactly (not merely small).
//
// Thread-safety: pure functions; MeanAccumulator is a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvx::eval {

// Running mean and standard error of the mean of a stream of numbers.
class MeanAccumulator {
 public:
  void Add(double x) {
    n_++;
    sum_ += x;
    sum2_ += x * x;
  }
  int64_t count() const { return n_; }
  double sum() const { return sum_; }
  double Mean() const { return n_ > 0 ? sum_ / n_ : 0.0; }
  // sqrt(var / (n - 1)) with var = E[x^2] - E[x]^2 (llama.cpp's estimate);
  // 0 when n < 2.
  double StdErr() const;

 private:
  int64_t n_ = 0;
  double sum_ = 0;
  double sum2_ = 0;
};

// The p-quantile (0 <= p <= 1) of `values` with linear interpolation between
// order statistics (numpy's default, "type 7"): h = (n - 1) p,
// q = x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]) on the sorted
// values. Returns 0 for an empty input. `values` is taken by value (sorted
// here).
double Percentile(std::vector<double> values, double p);

// Same, on values that are already sorted ascending (no copy).
double PercentileSorted(const std::vector<double>& sorted, double p);

// The Wilson score interval of a proportion `hits` / `n` at normal quantile
// z (1.96: 95%): {lo, hi} = (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) /
// (1 + z^2/n), p = hits / n. Stays within [0, 1] and is not empty at 0 or
// n hits, unlike the normal approximation. {0, 1} for n = 0.
struct Interval {
  double lo = 0, hi = 1;
};
Interval WilsonInterval(int64_t hits, int64_t n, double z = 1.96);

// The exact (binomial) McNemar test of two paired classifiers on the same
// prompts: b prompts only the first gets right, c only the second. Two-sided
// p-value = min(1, 2 P(X <= min(b, c))), X ~ Binomial(b + c, 1/2); 1 when
// b + c = 0. Exact rather than chi-square because retrieval comparisons
// have few discordant prompts.
double McNemarExactP(int64_t b, int64_t c);

// out[i] = logits[i] - log(sum_j exp(logits[j])), in double.
void LogSoftmax(const float* logits, int n, double* out);

// KL(P || Q) = sum_i exp(lp[i]) (lp[i] - lq[i]) for log-probabilities lp, lq.
double KlDivergence(const double* lp, const double* lq, int n);

}  // namespace kvx::eval
