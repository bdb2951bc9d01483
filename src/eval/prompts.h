// The inputs of kvx eval's probes, built before any spec runs (every spec sees
// the same token sequences). All randomness comes from the given seed
// (std::mt19937_64, values taken modulo the range, so the sequences are the
// same on every platform).
//
//  passkey  llama.cpp's passkey prompt (../shared/data/passkey/FORMAT.md):
//           prefix, junk units " The grass is green. ... There and back
//           again." with the needle " The pass key is K. Remember it. K is the
//           pass key." before unit round(depth * n_junk), then the suffix
//           " What is the pass key? The pass key is". K = rng % 50000 + 1.
//           n_junk is the largest count whose prompt (BOS included) leaves
//           n_gen tokens free within `length`.
//  lines    LongEval line retrieval (../shared/data/longeval/lines): the
//           records are far longer than these models' contexts, so each case
//           keeps a window of `n_lines` consecutive lines that contains the
//           asked line at the same relative depth as in the full record; the
//           header and question are kept verbatim and an answer cue in the
//           record's own format is appended: "\nline NAME: REGISTER_CONTENT
//           is <" (base models need a cue; LongChat wraps the prompt in a chat
//           template instead).
//  needle   gkamradt's needle in a haystack: Paul Graham essays (files sorted
//           by name, joined with blank lines) cut so the prompt fills
//           `length - n_gen` tokens; the needle sentence goes after the last
//           '.' at or before depth * (context chars) (depth 1: at the end,
//           depth 0: at the start); then the question and an answer cue.
//  copy     [BOS] span filler span: `span` tokens, `distance` filler tokens,
//           the span again. Source "random": span and filler drawn uniformly
//           from the vocabulary's normal tokens (no control, unknown, unused
//           or byte tokens); source "text": both are windows of a real text
//           (non-overlapping, at random offsets).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer.h"
#include "util/status.h"

namespace kvx::eval {

// One generation prompt of a retrieval probe.
struct GenItem {
  std::vector<int32_t> prompt;  // BOS included when the vocabulary adds it
  int n_gen = 16;               // tokens to generate at most (greedy)
  int cell = 0;                 // index of its grid cell
  std::string expected;         // passkey/lines: the number; needle: the answer sentence
  std::vector<std::string> answers;  // niah*, vt: every value asked (eval/ruler.h)
  // niah*: (key, value) of every needle, the asked key's first (kvx eval
  // --protocol asks them all: eval/scbench.h).
  std::vector<std::pair<std::string, std::string>> needles;
  // Tokens of the context, before the question (passkey's "What is the pass
  // key?", needle's question, lines' asked line, RULER's question): where a
  // KV policy compresses when the question is excluded (kvx eval
  // --compress excluded). prompt[0, question_start) is exactly the
  // tokenization of the context text (the longest common prefix, so a token
  // spanning the boundary goes with the question). -1: not split.
  int question_start = -1;
};

// Sets item->question_start from the prompt's text and the character where
// its question starts (item->prompt must be that text's tokens, BOS added).
Status MarkQuestion(const model::Tokenizer& tok, const std::string& text, size_t question_char, GenItem* item);

// A grid cell of a retrieval probe (the fields that apply are set).
struct GridCell {
  int length = 0;     // passkey/needle: target sequence length in tokens (prompt + n_gen)
  double depth = -1;  // passkey/needle: needle position as a fraction of the context; -1 n/a
  int n_lines = 0;    // lines: lines in the record
};

struct ProbePlan {
  std::vector<GridCell> cells;
  std::vector<GenItem> items;
};

inline constexpr std::string_view kNeedle =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
inline constexpr std::string_view kNeedleAnswer = "eat a sandwich and sit in Dolores Park on a sunny day.";
inline constexpr std::string_view kNeedleQuestion =
    "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer: The best thing to do in San Francisco is";

// The passkey prompt text for (n_junk, i_pos, key) exactly as llama.cpp
// builds it.
std::string PasskeyPromptText(int n_junk, int i_pos, int key);

// REQUIRES: lengths > n_gen, depths in [0, 1]. InvalidArgument when a length
// cannot hold even the prompt without junk.
Result<ProbePlan> BuildPasskeyPlan(const model::Tokenizer& tok, const std::vector<int>& lengths,
                                   const std::vector<double>& depths, int trials, int n_gen, uint64_t seed);

// `jsonl`: the content of a LongEval lines file. Uses the first `trials`
// cases for each count; a count whose prompts would not fit in
// `max_tokens - n_gen` tokens is dropped and listed in *dropped (if not null).
Result<ProbePlan> BuildLinesPlan(const model::Tokenizer& tok, std::string_view jsonl, const std::vector<int>& counts,
                                 int trials, int n_gen, int max_tokens, std::vector<int>* dropped);

// `haystack`: the essays' text (long enough for the longest length).
Result<ProbePlan> BuildNeedlePlan(const model::Tokenizer& tok, std::string_view haystack,
                                  const std::vector<int>& lengths, const std::vector<double>& depths, int n_gen);

// Inserts kNeedle into `context` at `depth` (see the header comment).
std::string InsertNeedle(std::string_view context, std::string_view needle, double depth);

struct CopySequence {
  int distance_index = 0;
  std::vector<int32_t> span;
  std::vector<int32_t> filler;
};

// Token ids a random copy span may use: not control, unknown, unused or byte
// tokens.
std::vector<int32_t> CopyCandidateTokens(const model::Tokenizer& tok);

std::vector<CopySequence> BuildRandomCopySequences(const std::vector<int32_t>& candidates, int span,
                                                   const std::vector<int>& distances, int trials, uint64_t seed);

// `text_tokens`: a tokenized text (no BOS). InvalidArgument when it is too
// short for a span plus the longest filler.
Result<std::vector<CopySequence>> BuildTextCopySequences(const std::vector<int32_t>& text_tokens, int span,
                                                         const std::vector<int>& distances, int trials, uint64_t seed);

}  // namespace kvx::eval
