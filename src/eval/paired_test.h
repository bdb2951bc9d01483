// Paired comparison of two configurations answered on the SAME prompts (a
// spec against the full cache, or two specs): McNemar's exact test.
//
// Only the discordant prompts carry information: b = prompts the reference
// solves and the candidate misses, c = the reverse. Under "no difference"
// each discordant prompt is a fair coin, so b ~ Binomial(b + c, 1/2); the
// two-sided exact p-value is min(1, 2 P[X <= min(b, c)]). Unlike comparing
// two Wilson intervals, the pairing removes the prompts' own difficulty, so
// 18 losses and no gains out of 46 prompts separate clearly (p ~ 8e-6) even
// where the intervals of 28/46 and 46/46 would also, and 2 losses out of 50
// do not (p = 0.5).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvx::eval {

// Two-sided exact McNemar p-value for b and c discordant prompts (1 when
// b + c == 0). b, c >= 0.
double McNemarExactP(int64_t b, int64_t c);

enum class PairedVerdict { kIndistinguishable, kBetter, kWorse };
// "indistinguishable", "better", "worse".
std::string_view PairedVerdictName(PairedVerdict v);

struct PairedComparison {
  int64_t n = 0;             // prompts both answered
  int64_t reference_only = 0;  // b: the reference hits, the candidate misses
  int64_t candidate_only = 0;  // c: the candidate hits, the reference misses
  double p = 1.0;            // McNemarExactP(b, c)
  PairedVerdict verdict = PairedVerdict::kIndistinguishable;
};

// Compares per-prompt outcomes (1 = hit) of the candidate against the
// reference, prompt i with prompt i; the verdict is better / worse when
// p < alpha, else indistinguishable. The outcome vectors must have the same
// length (the same prompts): a mismatch returns n = 0 with p = 1 and the
// caller should not pair them.
PairedComparison ComparePaired(const std::vector<uint8_t>& reference, const std::vector<uint8_t>& candidate,
                               double alpha = 0.05);

}  // namespace kvx::eval
