// Small statistics used by kvx eval: mean with standard error, percentiles,
// log-softmax and the KL divergence between two next-token distributions;
// the intervals and the paired test that kvx eval's retrieval results carry
// (Wilson for hit rates, a bootstrap for mean scores, exact McNemar for two
// caches scored on the same prompts).
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
#include <span>
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

// The percentile bootstrap 95% interval of the mean of `values`: `reps`
// resamples of n values drawn with replacement (std::mt19937_64 seeded with
// `seed`, so the interval is the same on every run), their means' 2.5th and
// 97.5th percentiles. For scores that are not 0/1 (needle ROUGE), where
// Wilson does not apply. {0, 0} for no values.
Interval BootstrapMeanInterval(const std::vector<double>& values, int reps = 2000, uint64_t seed = 1);

// Exact McNemar test of two caches scored on the same prompts: of the
// discordant prompts, `only_a` are hits for a only and `only_b` for b only.
// Under "a and b are equally good" each discordant prompt goes either way
// with probability 1/2, so the two-sided p-value is
// min(1, 2 P(X <= min(only_a, only_b))), X ~ Binomial(only_a + only_b, 1/2)
// (the binomial test on the discordant pairs; concordant prompts carry no
// information). 1 when there is no discordant prompt.
double McNemarExactP(int64_t only_a, int64_t only_b);

// How b compares with a on paired prompts at level alpha (two-sided): kBetter
// when b wins significantly more discordant prompts, kWorse when fewer,
// else kIndistinguishable. No correction for multiple comparisons here: the
// caller owns the family (scripts/eviction_report.py applies Holm's).
enum class PairedVerdict { kBetter, kWorse, kIndistinguishable };
PairedVerdict McNemarVerdict(int64_t only_a, int64_t only_b, double alpha = 0.05);
const char* VerdictName(PairedVerdict v);  // "better", "worse", "indistinguishable"

// Student's t distribution with `df` (> 0) degrees of freedom: the
// two-sided tail P(|T| >= |t|), and the quantile q with P(|T| >= q) = alpha.
// The CDF is integrated (Simpson) after the substitution x = sqrt(df) tan u,
// under which the density becomes a smooth multiple of cos(u)^(df-1) on
// [0, pi/2): accurate for every t, heavy tails included.
double StudentTTwoSidedP(double t, double df);
double StudentTCritical(double df, double alpha = 0.05);

// The paired difference b - a of two per-position series scored on the same
// positions (the KLD of two caches against one reference): its mean, and a
// paired t test on the means of consecutive blocks of `block` positions
// (batch means: neighbouring positions of a text are correlated, so a
// per-position standard error would be too small). The last partial block
// is dropped from the test, not from the mean. Needs a.size() == b.size()
// and at least two blocks; otherwise n_blocks < 2 and p = 1.
struct PairedDifference {
  double mean = 0;      // mean of b - a over every position
  double mean_stderr = 0;  // of the block means' mean
  Interval ci95{0, 0};  // mean of the blocks' differences -+ t * stderr
  double p = 1;         // two-sided, t with n_blocks - 1 degrees of freedom
  int64_t n_positions = 0, n_blocks = 0;
  // kBetter when b is significantly lower (a KLD: better), kWorse when higher.
  PairedVerdict Verdict(double alpha = 0.05) const;
};
PairedDifference PairedBlockDifference(std::span<const float> a, std::span<const float> b, int block = 32);

// out[i] = logits[i] - log(sum_j exp(logits[j])), in double.
void LogSoftmax(const float* logits, int n, double* out);

// KL(P || Q) = sum_i exp(lp[i]) (lp[i] - lq[i]) for log-probabilities lp, lq.
double KlDivergence(const double* lp, const double* lq, int n);

}  // namespace kvx::eval
