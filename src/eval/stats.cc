#include "eval/stats.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kvx::eval {

double MeanAccumulator::StdErr() const {
  if (n_ < 2) return 0.0;
  const double mean = sum_ / n_;
  const double var = sum2_ / n_ - mean * mean;
  return std::sqrt(std::max(0.0, var) / (n_ - 1));
}

double PercentileSorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  p = std::clamp(p, 0.0, 1.0);
  const double h = (static_cast<double>(sorted.size()) - 1) * p;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return PercentileSorted(values, p);
}

void LogSoftmax(const float* logits, int n, double* out) {
  if (n <= 0) return;
  double max_logit = logits[0];
  for (int i = 1; i < n; ++i) max_logit = std::max(max_logit, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double lse = max_logit + std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

double KlDivergence(const double* lp, const double* lq, int n) {
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double d = lp[i] - lq[i];
    if (d != 0) kl += std::exp(lp[i]) * d;
  }
  return kl;
}

Interval WilsonInterval(int64_t hits, int64_t n, double z) {
  if (n <= 0) return {};
  const double p = static_cast<double>(hits) / static_cast<double>(n), nn = static_cast<double>(n), z2 = z * z;
  const double center = p + z2 / (2 * nn);
  const double spread = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  const double denom = 1 + z2 / nn;
  // At 0 or n hits the formula's far end is 0 or 1 exactly on paper; in
  // floating point it can land a rounding below 1, and a spec answering every
  // prompt would then look "above" a full cache that answers every prompt too.
  return {hits == 0 ? 0.0 : std::max(0.0, (center - spread) / denom),
          hits == n ? 1.0 : std::min(1.0, (center + spread) / denom)};
}

Interval BootstrapMeanInterval(const std::vector<double>& values, int reps, uint64_t seed) {
  if (values.empty()) return {0, 0};
  std::mt19937_64 rng(seed);
  const size_t n = values.size();
  std::vector<double> means(static_cast<size_t>(std::max(1, reps)));
  for (double& m : means) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += values[rng() % n];
    m = sum / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  return {PercentileSorted(means, 0.025), PercentileSorted(means, 0.975)};
}

double McNemarExactP(int64_t only_a, int64_t only_b) {
  const int64_t n = only_a + only_b, k = std::min(only_a, only_b);
  if (n <= 0) return 1.0;
  // P(X <= k) = sum_{i<=k} C(n, i) / 2^n, each term from lgamma (n is a
  // count of prompts: no overflow, and the sum of a few terms keeps precision).
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i) {
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
  }
  return std::min(1.0, 2 * tail);
}

PairedVerdict McNemarVerdict(int64_t only_a, int64_t only_b, double alpha) {
  if (McNemarExactP(only_a, only_b) >= alpha) return PairedVerdict::kIndistinguishable;
  return only_b > only_a ? PairedVerdict::kBetter : PairedVerdict::kWorse;
}

const char* VerdictName(PairedVerdict v) {
  switch (v) {
    case PairedVerdict::kBetter:
      return "better";
    case PairedVerdict::kWorse:
      return "worse";
    case PairedVerdict::kIndistinguishable:
      break;
  }
  return "indistinguishable";
}

double StudentTTwoSidedP(double t, double df) {
  if (!(df > 0) || std::isnan(t)) return 1.0;
  // P(0 <= T <= |t|) = G / sqrt(pi) * integral_0^U cos(u)^(df-1) du with
  // U = atan(|t| / sqrt(df)) and G = Gamma((df+1)/2) / Gamma(df/2).
  const double upper = std::atan(std::fabs(t) / std::sqrt(df));
  const double g = std::exp(std::lgamma((df + 1) / 2) - std::lgamma(df / 2)) / std::sqrt(M_PI);
  const auto f = [&](double u) {
    const double c = std::cos(u);
    return c > 0 ? std::pow(c, df - 1) : (df > 1 ? 0.0 : 1.0);
  };
  constexpr int kSteps = 2048;  // even; the integrand is smooth on the whole range
  const double h = upper / kSteps;
  double sum = f(0) + f(upper);
  for (int i = 1; i < kSteps; ++i) sum += f(i * h) * (i % 2 ? 4 : 2);
  const double half = g * sum * h / 3;  // P(0 <= T <= |t|)
  return std::clamp(1.0 - 2.0 * half, 0.0, 1.0);
}

double StudentTCritical(double df, double alpha) {
  double lo = 0, hi = 1e6;
  for (int i = 0; i < 200 && hi - lo > 1e-9 * std::max(1.0, lo); ++i) {
    const double mid = 0.5 * (lo + hi);
    (StudentTTwoSidedP(mid, df) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedVerdict PairedDifference::Verdict(double alpha) const {
  if (n_blocks < 2 || p >= alpha) return PairedVerdict::kIndistinguishable;
  return mean < 0 ? PairedVerdict::kBetter : PairedVerdict::kWorse;
}

PairedDifference PairedBlockDifference(std::span<const float> a, std::span<const float> b, int block) {
  PairedDifference d;
  if (a.size() != b.size() || a.empty() || block < 1) return d;
  d.n_positions = static_cast<int64_t>(a.size());
  double total = 0;
  for (size_t i = 0; i < a.size(); ++i) total += static_cast<double>(b[i]) - a[i];
  d.mean = total / static_cast<double>(a.size());
  MeanAccumulator blocks;
  const size_t bs = static_cast<size_t>(block);
  for (size_t at = 0; at + bs <= a.size(); at += bs) {
    double sum = 0;
    for (size_t i = at; i < at + bs; ++i) sum += static_cast<double>(b[i]) - a[i];
    blocks.Add(sum / static_cast<double>(bs));
  }
  d.n_blocks = blocks.count();
  if (d.n_blocks < 2) return d;
  d.mean_stderr = blocks.StdErr();
  const double df = static_cast<double>(d.n_blocks - 1), m = blocks.Mean();
  const double half = StudentTCritical(df) * d.mean_stderr;
  d.ci95 = {m - half, m + half};
  d.p = d.mean_stderr > 0 ? StudentTTwoSidedP(m / d.mean_stderr, df) : (m == 0 ? 1.0 : 0.0);
  return d;
}

}  // namespace kvx::eval
