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
//  * ValuesFound (niah*, vt): RULER's exact match, made strict so that a model
//    cannot win by reciting every value of the context (as FirstInteger for
//    passkey). The output's items are its maximal runs of ASCII letters,
//    digits and '-'; the candidates are the items of the answers' shape
//    (ItemShape); the first K candidates (K = the number of answers) are
//    compared, case-insensitively, with the answers as a set. Returns the
//    share of answers matched (RULER's partial credit for several values; 0
//    or 1 for one).
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
// Whether more text can no longer change FirstInteger(text): its digit run
// has ended (a non-digit follows it). Generation stops there.
bool FirstIntegerDecided(std::string_view text);

// Lowercased words made of ASCII letters and digits; every other byte splits.
std::vector<std::string> Words(std::string_view text);

struct RougeScore {
  double precision = 0;
  double recall = 0;
  double f1 = 0;
};
RougeScore Rouge1(std::string_view candidate, std::string_view reference);

std::string_view FirstSentence(std::string_view text);

// The shape class of an answer item: "number" (digits only), "uuid"
// (8-4-4-4-12 hex digits), "word" (letters '-' letters), "capsN" (N uppercase
// letters, vt's variable names, so "VAR" is not one), else "other".
std::string ItemShape(std::string_view item);

// REQUIRES: answers non-empty, all of one shape.
double ValuesFound(std::string_view output, const std::vector<std::string>& answers);
// Whether ValuesFound(output + anything, answers) is already fixed: its first
// K candidates are complete. Generation stops there (scores unchanged, decode
// steps saved).
bool ValuesDecided(std::string_view output, const std::vector<std::string>& answers);

// `text` with every byte that is not part of a valid UTF-8 sequence replaced
// by U+FFFD (model outputs may end inside a character split over byte tokens).
std::string SanitizeUtf8(std::string_view text);

}  // namespace kvx::eval
