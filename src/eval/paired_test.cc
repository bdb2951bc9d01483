#include "eval/paired_test.h"

#include <algorithm>
#include <cmath>

namespace kvx::eval {

double McNemarExactP(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n <= 0) return 1.0;
  const int64_t k_max = std::min(b, c);
  // P[X <= k_max], X ~ Binomial(n, 1/2), term by term in log space so that
  // n in the thousands neither overflows C(n, k) nor underflows 2^-n.
  const double log_half_n = -static_cast<double>(n) * std::log(2.0);
  const double log_n_fact = std::lgamma(static_cast<double>(n) + 1.0);
  double tail = 0.0;
  for (int64_t k = 0; k <= k_max; ++k) {
    tail += std::exp(log_n_fact - std::lgamma(static_cast<double>(k) + 1.0) -
                     std::lgamma(static_cast<double>(n - k) + 1.0) + log_half_n);
  }
  return std::min(1.0, 2.0 * tail);
}

std::string_view PairedVerdictName(PairedVerdict v) {
  switch (v) {
    case PairedVerdict::kBetter: return "better";
    case PairedVerdict::kWorse: return "worse";
    default: return "indistinguishable";
  }
}

PairedComparison ComparePaired(const std::vector<uint8_t>& reference, const std::vector<uint8_t>& candidate,
                               double alpha) {
  PairedComparison out;
  if (reference.size() != candidate.size()) return out;
  out.n = static_cast<int64_t>(reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    const bool r = reference[i] != 0, c = candidate[i] != 0;
    out.reference_only += r && !c;
    out.candidate_only += c && !r;
  }
  out.p = McNemarExactP(out.reference_only, out.candidate_only);
  if (out.p < alpha) {
    out.verdict = out.candidate_only > out.reference_only ? PairedVerdict::kBetter : PairedVerdict::kWorse;
  }
  return out;
}

}  // namespace kvx::eval
