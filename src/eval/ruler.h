// RULER-style retrieval probes for kvx eval (Hsieh et al., 2024, "RULER:
// What's the Real Context Size of Your Long-Context Language Models?"):
// RULER's task definitions, built over the same length x depth grid as
// passkey. Unlike passkey's repeated filler, the needles of the niah tasks
// sit in natural text (Paul Graham essays), where every token is new, so a
// KV cache that blurs old tokens loses them (issue 23).
//
//  niah      One needle "One of the special magic <kinds> for KEY is: VALUE."
//            in the essays, KEY an adjective-noun word ("rich-brick"), VALUE a
//            word, a 7-digit number or a UUID (RULER niah_single_2/3, and its
//            generator with words as values), then RULER's question with an
//            answer prefix ("... The special magic number for KEY mentioned
//            in the provided text is").
//  niah_multikey    four needles with distinct keys, one asked (RULER
//            niah_multikey_1): the other three are distractors.
//  niah_multivalue  four needles with the same key and different values, all
//            asked (RULER niah_multivalue).
//  vt        variable tracking (RULER vt, one chain of four hops): in
//            llama.cpp's noise lines, "VAR ABCDE = 12345" then "VAR FGHIJ =
//            VAR ABCDE" ..., asked which variables hold 12345; one solved
//            example with 3-letter names comes first, as in RULER.
//
// Depth: the needle the answer depends on that lies furthest from the
// question (niah: the needle; multikey: the asked one; multivalue: the
// earliest value; vt: the chain's first assignment) goes before haystack unit
// round(depth * m), where m is the number of haystack units (essay sentences,
// noise lines) kept; the other needles go at seeded random units (multikey:
// anywhere; multivalue and vt: after that first one). m is the largest count
// whose prompt (BOS included) leaves n_gen tokens free within the cell's
// length, so the prompt never exceeds the context.
//
// Each trial draws fresh keys and values and (niah) its own start sentence in
// the essays (RULER always starts at the first essay), so trials differ in
// text, not only in needles. Keys and values never occur in the essays, and
// every drawn string is distinct, so an answer can only come from its needle.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "eval/prompts.h"
#include "model/tokenizer.h"
#include "util/status.h"

namespace kvx::eval {

// What a key or a value is.
enum class NeedleKind { kWord, kNumber, kUuid };
// "words", "numbers", "uuids" (RULER's type names, used in the prompts).
std::string_view NeedleKindPlural(NeedleKind k);

struct NiahSpec {
  NeedleKind key = NeedleKind::kWord;
  NeedleKind value = NeedleKind::kNumber;
  int n_keys = 1;    // needles with distinct keys; the first key is asked
  int n_values = 1;  // needles (values) per key; every value of the asked key is asked
};

// The essays as RULER uses them: whitespace runs collapsed to one space, then
// split into sentences (a sentence ends at '.', '!' or '?' followed by a
// space; the mark stays with its sentence).
struct Haystack {
  std::string text;  // the collapsed text (for "does not occur" checks)
  std::vector<std::string> sentences;
};
Haystack MakeHaystack(std::string_view raw);

// A random key or value of `kind` (words: "adjective-noun"; numbers: 7
// digits; UUIDs: version 4), as the niah tasks draw them.
std::string RandomNeedleString(NeedleKind kind, std::mt19937_64& rng);

// The Paul Graham essays of `dir` (its .txt files but LICENSE*, sorted by
// name, concatenated): the haystack of needle, niah* and rag, and kvx
// tune's default text. NotFound naming the folder when there are none.
Result<std::string> LoadEssays(const std::string& dir);

// "One of the special magic numbers for KEY is: VALUE."
std::string NiahNeedle(NeedleKind value_kind, std::string_view key, std::string_view value);

// The question that ends a niah prompt asking `key` (after the context,
// newline first), with its answer prefix.
std::string NiahQuestion(const NiahSpec& spec, std::string_view key);

// REQUIRES: lengths > n_gen, depths in [0, 1], trials >= 1. Each item's
// `answers` holds the asked values. InvalidArgument when a length cannot hold
// the prompt without any haystack, or the haystack runs out.
Result<ProbePlan> BuildNiahPlan(const model::Tokenizer& tok, const Haystack& hay, const NiahSpec& spec,
                                const std::vector<int>& lengths, const std::vector<double>& depths, int trials,
                                int n_gen, uint64_t seed);

// Tokens (BOS included) of a prompt with every needle and no haystack: the
// least a length must hold besides the answer.
Result<int> NiahBareTokens(const model::Tokenizer& tok, const NiahSpec& spec);
Result<int> VtBareTokens(const model::Tokenizer& tok);

inline constexpr int kVtHops = 4;  // RULER's default: 5 variables per chain
inline constexpr std::string_view kVtNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// As BuildNiahPlan; each item's `answers` are the chain's 5 variable names.
Result<ProbePlan> BuildVtPlan(const model::Tokenizer& tok, const std::vector<int>& lengths,
                              const std::vector<double>& depths, int trials, int n_gen, uint64_t seed);

}  // namespace kvx::eval
