#include "eval/prompts.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

namespace kvx::eval {

namespace {

constexpr std::string_view kPasskeyPrefix =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you "
    "about the important information there.";
constexpr std::string_view kPasskeyJunk =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr std::string_view kPasskeySuffix = " What is the pass key? The pass key is";

Result<int> CountTokens(const model::Tokenizer& tok, std::string_view text) {
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, /*add_special=*/true, /*parse_special=*/false));
  return static_cast<int>(ids.size());
}

// Largest n in [0, hi_limit] with fits(n) true, assuming fits is monotone
// (true up to some n, then false). REQUIRES: fits(0).
template <class Fits>
Result<int64_t> LargestFitting(int64_t hi_limit, Fits fits) {
  int64_t lo = 0, hi = 1;
  while (hi <= hi_limit) {
    KVX_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, hi_limit + 1);  // fits(hi) is false or hi is out of range
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    KVX_ASSIGN_OR_RETURN(bool ok, fits(mid));
    if (ok) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace

Status MarkQuestion(const model::Tokenizer& tok, const std::string& text, size_t question_char, GenItem* item) {
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ctx, tok.Encode(text.substr(0, std::min(question_char, text.size())), true, false));
  size_t common = 0;
  while (common < ctx.size() && common < item->prompt.size() && ctx[common] == item->prompt[common]) ++common;
  item->question_start = static_cast<int>(common);
  return Status::Ok();
}

std::string PasskeyPromptText(int n_junk, int i_pos, int key) {
  const std::string k = std::to_string(key);
  const std::string needle = " The pass key is " + k + ". Remember it. " + k + " is the pass key.";
  std::string p(kPasskeyPrefix);
  for (int i = 0; i < n_junk; ++i) {
    if (i == i_pos) p += needle;
    p += kPasskeyJunk;
  }
  if (i_pos >= n_junk) p += needle;  // depth 1: after the last unit
  p += kPasskeySuffix;
  return p;
}

Result<ProbePlan> BuildPasskeyPlan(const model::Tokenizer& tok, const std::vector<int>& lengths,
                                   const std::vector<double>& depths, int trials, int n_gen, uint64_t seed) {
  ProbePlan plan;
  std::mt19937_64 rng(seed);
  for (int length : lengths) {
    const int budget = length - n_gen;
    for (double depth : depths) {
      const int cell = static_cast<int>(plan.cells.size());
      plan.cells.push_back(GridCell{length, depth, 0});
      for (int t = 0; t < trials; ++t) {
        const int key = static_cast<int>(rng() % 50000) + 1;
        auto prompt_for = [&](int64_t n) {
          return PasskeyPromptText(static_cast<int>(n), static_cast<int>(std::lround(depth * n)), key);
        };
        KVX_ASSIGN_OR_RETURN(int base, CountTokens(tok, prompt_for(0)));
        if (base > budget) {
          return InvalidArgument("passkey length " + std::to_string(length) + " is too short: the prompt without " +
                                 "filler already has " + std::to_string(base) + " tokens and " + std::to_string(n_gen) +
                                 " are reserved for the answer");
        }
        KVX_ASSIGN_OR_RETURN(int64_t n_junk, LargestFitting(100000, [&](int64_t n) -> Result<bool> {
                               KVX_ASSIGN_OR_RETURN(int c, CountTokens(tok, prompt_for(n)));
                               return c <= budget;
                             }));
        GenItem item;
        const std::string text = prompt_for(n_junk);
        KVX_ASSIGN_OR_RETURN(item.prompt, tok.Encode(text, true, false));
        KVX_RETURN_IF_ERROR(MarkQuestion(tok, text, text.size() - kPasskeySuffix.size(), &item));
        item.n_gen = n_gen;
        item.cell = cell;
        item.expected = std::to_string(key);
        plan.items.push_back(std::move(item));
      }
    }
  }
  return plan;
}

Result<ProbePlan> BuildLinesPlan(const model::Tokenizer& tok, std::string_view jsonl, const std::vector<int>& counts,
                                 int trials, int n_gen, int max_tokens, std::vector<int>* dropped) {
  struct Case {
    std::string head, tail, name, expected;
    std::vector<std::string> lines;
    int target = 0;
  };
  std::vector<Case> cases;
  size_t pos = 0;
  int line_no = 0;
  while (pos < jsonl.size() && static_cast<int>(cases.size()) < trials) {
    size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    std::string_view row = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j = nlohmann::json::parse(row, nullptr, /*allow_exceptions=*/false);
    const std::string where = "LongEval lines file, line " + std::to_string(line_no);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + ": not a JSON object");
    if (!j.contains("prompt") || !j["prompt"].is_string() || !j.contains("random_idx") || !j["random_idx"].is_array() ||
        j["random_idx"].empty() || !j["random_idx"][0].is_string() || !j.contains("expected_number") ||
        !j["expected_number"].is_number_integer()) {
      return InvalidArgument(where + ": needs fields prompt, random_idx [name, index] and expected_number");
    }
    Case c;
    const std::string prompt = j["prompt"].get<std::string>();
    c.name = j["random_idx"][0].get<std::string>();
    c.expected = std::to_string(j["expected_number"].get<int64_t>());
    const std::string marker = ": REGISTER_CONTENT is <";
    // Record lines: "line NAME: REGISTER_CONTENT is <N>".
    size_t first = std::string::npos, last_end = 0, p = 0;
    while (p < prompt.size()) {
      size_t e = prompt.find('\n', p);
      if (e == std::string::npos) e = prompt.size();
      const std::string_view l(prompt.data() + p, e - p);
      if (l.substr(0, 5) == "line " && l.find(marker) != std::string_view::npos) {
        if (first == std::string::npos) first = p;
        last_end = e;
        if (l.substr(5, c.name.size() + 1) == c.name + ":") c.target = static_cast<int>(c.lines.size());
        c.lines.emplace_back(l);
      }
      p = e + 1;
    }
    if (first == std::string::npos || c.lines.empty()) return InvalidArgument(where + ": no record lines found");
    if (c.lines[static_cast<size_t>(c.target)].substr(5, c.name.size() + 1) != c.name + ":") {
      return InvalidArgument(where + ": the asked line '" + c.name + "' is not in the record");
    }
    c.head = prompt.substr(0, first);
    c.tail = prompt.substr(last_end);
    while (!c.tail.empty() && (c.tail.back() == ' ' || c.tail.back() == '\n')) c.tail.pop_back();
    c.tail += "\nline " + c.name + marker;
    cases.push_back(std::move(c));
  }
  if (cases.empty()) return InvalidArgument("the LongEval lines file has no cases");
  ProbePlan plan;
  for (int n : counts) {
    ProbePlan cell_plan;
    bool fits = true;
    for (const Case& c : cases) {
      const int total = static_cast<int>(c.lines.size());
      const int m = std::min(n, total);
      const double frac = total > 1 ? static_cast<double>(c.target) / (total - 1) : 0.0;
      int start = c.target - static_cast<int>(std::lround(frac * (m - 1)));
      start = std::clamp(start, 0, total - m);
      std::string prompt = c.head;
      for (int i = start; i < start + m; ++i) {
        if (i > start) prompt += '\n';
        prompt += c.lines[static_cast<size_t>(i)];
      }
      prompt += c.tail;
      GenItem item;
      KVX_ASSIGN_OR_RETURN(item.prompt, tok.Encode(prompt, true, false));
      KVX_RETURN_IF_ERROR(MarkQuestion(tok, prompt, prompt.size() - c.tail.size(), &item));
      if (static_cast<int>(item.prompt.size()) + n_gen > max_tokens) {
        fits = false;
        break;
      }
      item.n_gen = n_gen;
      item.cell = static_cast<int>(plan.cells.size());
      item.expected = c.expected;
      cell_plan.items.push_back(std::move(item));
    }
    if (!fits) {
      if (dropped) dropped->push_back(n);
      continue;
    }
    plan.cells.push_back(GridCell{0, -1, n});
    for (GenItem& it : cell_plan.items) plan.items.push_back(std::move(it));
  }
  return plan;
}

std::string InsertNeedle(std::string_view context, std::string_view needle, double depth) {
  if (context.empty()) return std::string(needle);
  if (depth >= 1.0) return std::string(context) + " " + std::string(needle);
  const size_t at = static_cast<size_t>(std::floor(std::max(0.0, depth) * static_cast<double>(context.size())));
  const size_t dot = context.rfind('.', at);
  if (dot == std::string_view::npos) return std::string(needle) + " " + std::string(context);
  return std::string(context.substr(0, dot + 1)) + " " + std::string(needle) + std::string(context.substr(dot + 1));
}

Result<ProbePlan> BuildNeedlePlan(const model::Tokenizer& tok, std::string_view haystack,
                                  const std::vector<int>& lengths, const std::vector<double>& depths, int n_gen) {
  ProbePlan plan;
  auto cut = [&](int64_t chars) {
    size_t n = std::min(static_cast<size_t>(chars), haystack.size());
    while (n > 0 && n < haystack.size() && (static_cast<unsigned char>(haystack[n]) & 0xC0) == 0x80) --n;
    return haystack.substr(0, n);
  };
  for (int length : lengths) {
    const int budget = length - n_gen;
    for (double depth : depths) {
      auto prompt_for = [&](int64_t chars) {
        return InsertNeedle(cut(chars), kNeedle, depth) + std::string(kNeedleQuestion);
      };
      KVX_ASSIGN_OR_RETURN(int base, CountTokens(tok, prompt_for(0)));
      if (base > budget) {
        return InvalidArgument("needle length " + std::to_string(length) + " is too short: needle and question " +
                               "alone take " + std::to_string(base) + " tokens and " + std::to_string(n_gen) +
                               " are reserved for the answer");
      }
      KVX_ASSIGN_OR_RETURN(int64_t chars,
                           LargestFitting(static_cast<int64_t>(haystack.size()), [&](int64_t c) -> Result<bool> {
                             KVX_ASSIGN_OR_RETURN(int n, CountTokens(tok, prompt_for(c)));
                             return n <= budget;
                           }));
      if (static_cast<size_t>(chars) >= haystack.size()) {
        return InvalidArgument("the needle haystack is too short for length " + std::to_string(length));
      }
      GenItem item;
      const std::string text = prompt_for(chars);
      KVX_ASSIGN_OR_RETURN(item.prompt, tok.Encode(text, true, false));
      KVX_RETURN_IF_ERROR(MarkQuestion(tok, text, text.size() - kNeedleQuestion.size(), &item));
      item.n_gen = n_gen;
      item.cell = static_cast<int>(plan.cells.size());
      item.expected = std::string(kNeedleAnswer);
      plan.cells.push_back(GridCell{length, depth, 0});
      plan.items.push_back(std::move(item));
    }
  }
  return plan;
}

std::vector<int32_t> CopyCandidateTokens(const model::Tokenizer& tok) {
  std::vector<int32_t> ids;
  const uint32_t excluded = model::kAttrControl | model::kAttrUnknown | model::kAttrUnused | model::kAttrByte;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const uint32_t a = tok.Attr(id);
    if ((a & excluded) != 0 || a == model::kAttrUndefined) continue;
    if (tok.TokenText(id).empty()) continue;
    ids.push_back(id);
  }
  return ids;
}

std::vector<CopySequence> BuildRandomCopySequences(const std::vector<int32_t>& candidates, int span,
                                                   const std::vector<int>& distances, int trials, uint64_t seed) {
  std::vector<CopySequence> seqs;
  if (candidates.empty()) return seqs;
  std::mt19937_64 rng(seed);
  auto draw = [&] { return candidates[rng() % candidates.size()]; };
  for (size_t d = 0; d < distances.size(); ++d) {
    for (int t = 0; t < trials; ++t) {
      CopySequence s;
      s.distance_index = static_cast<int>(d);
      for (int i = 0; i < span; ++i) s.span.push_back(draw());
      for (int i = 0; i < distances[d]; ++i) s.filler.push_back(draw());
      seqs.push_back(std::move(s));
    }
  }
  return seqs;
}

Result<std::vector<CopySequence>> BuildTextCopySequences(const std::vector<int32_t>& text_tokens, int span,
                                                         const std::vector<int>& distances, int trials, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(text_tokens.size());
  const int max_d = distances.empty() ? 0 : *std::max_element(distances.begin(), distances.end());
  if (n < 2 * (span + max_d)) {
    return InvalidArgument("the text has " + std::to_string(n) + " tokens; copy spans from text need at least " +
                           std::to_string(2 * (span + max_d)) + " (a longer text or shorter distances)");
  }
  std::mt19937_64 rng(seed);
  std::vector<CopySequence> seqs;
  for (size_t d = 0; d < distances.size(); ++d) {
    const int dist = distances[d];
    for (int t = 0; t < trials; ++t) {
      CopySequence s;
      s.distance_index = static_cast<int>(d);
      const int64_t a = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - span + 1));
      int64_t b = 0;
      bool ok = dist == 0;
      for (int tries = 0; !ok && tries < 1000; ++tries) {
        b = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - dist + 1));
        ok = b + dist <= a || a + span <= b;
      }
      if (!ok) return Internal("could not place a copy filler window");
      s.span.assign(text_tokens.begin() + a, text_tokens.begin() + a + span);
      s.filler.assign(text_tokens.begin() + b, text_tokens.begin() + b + dist);
      seqs.push_back(std::move(s));
    }
  }
  return seqs;
}

}  // namespace kvx::eval
