// Scoring rules for the generation probes of kvx eval (passkey, lines,
// needle). Exact definitions (also in docs/eval.md):
//
//  * FirstInteger: the first maximal run of ASCII digits in the text, as a
//    number (Landmark Attention's passkey rule: "first integer == K"). A run
//    longer than 18 digits does not fit and gives nullopt.
//  * Rouge1: unigram overlap of the lowercased ASCII-alphanumeric words of a
//    candidate and a reference, counts clipped (each reference word matches
//    at most as often as it occurs); precision = overlap / candidate words,
//    recall = overlap / reference words, F1 = 2PR / (P + R) (0 when either
//    side has no words). The needle score of gkamradt's NIAH is this F1
//    (the original scores 1-10 with an LLM judge; RULER uses exact match).
//  * FirstSentence: leading whitespace dropped, then the text up to and
//    including its first '.', '!', '?' or newline (the needle answer is one
//    sentence; what follows is not judged).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvx::eval {

std::optional<int64_t> FirstInteger(std::string_view text);

// Lowercased words made of ASCII letters and digits; every other byte splits.
std::vector<std::string> Words(std::string_view text);

struct RougeScore {
  double precision = 0;
  double recall = 0;
  double f1 = 0;
};
RougeScore Rouge1(std::string_view candidate, std::string_view reference);

std::string_view FirstSentence(std::string_view text);

// `text` with every byte that is not part of a valid UTF-8 sequence replaced
// by U+FFFD (model outputs may end inside a character split over byte tokens).
std::string SanitizeUtf8(std::string_view text);

}  // namespace kvx::eval
