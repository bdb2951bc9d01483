#include "eval/ruler.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "util/mmap_file.h"

namespace kvx::eval {

namespace {

// Keys and word values are adjective-noun pairs, as RULER's (which draws them
// from the wonderwords lists); these short lists are ours. 80 x 80 = 6400
// pairs, none of which occurs in the essays (checked per draw anyway).
constexpr std::string_view kAdjectives[] = {
    "able",   "absent", "acid",   "agile",  "amber",  "ancient", "angry",  "aware",  "bitter", "blank",
    "bold",   "brave",  "brief",  "bright", "broad",  "calm",    "cheap",  "chilly", "clever", "cloudy",
    "coarse", "cold",   "crisp",  "curly",  "damp",   "dark",    "deep",   "dense",  "dim",    "dizzy",
    "dry",    "dusty",  "eager",  "early",  "empty",  "faint",   "fancy",  "fast",   "fierce", "flat",
    "fresh",  "gentle", "giant",  "glad",   "golden", "grand",   "green",  "happy",  "hollow", "humble",
    "icy",    "idle",   "jolly",  "keen",   "large",  "lazy",    "loud",   "lucky",  "mellow", "mild",
    "misty",  "modern", "narrow", "noble",  "odd",    "pale",    "plain",  "proud",  "quick",  "quiet",
    "rapid",  "rare",   "rich",   "rough",  "royal",  "rusty",   "shiny",  "silent", "sleepy", "solid"};
constexpr std::string_view kNouns[] = {
    "anchor", "apple",  "arrow",  "badge",  "basket", "beacon", "bottle", "branch", "brick",  "bridge",
    "bucket", "button", "cabin",  "camera", "candle", "canyon", "carpet", "castle", "cherry", "circle",
    "closet", "cobweb", "comet",  "copper", "cradle", "crystal", "dagger", "desert", "dolphin", "donkey",
    "dragon", "drum",   "eagle",  "engine", "falcon", "feather", "fiddle", "forest", "fossil", "garden",
    "garlic", "glacier", "goblet", "hammer", "harbor", "helmet", "island", "jacket", "kettle", "ladder",
    "lantern", "lemon", "lizard", "magnet", "marble", "meadow", "mirror", "mitten", "needle", "oyster",
    "paddle", "parrot", "pebble", "pepper", "pillow", "planet", "pocket", "puzzle", "rabbit", "ribbon",
    "saddle", "shovel", "spider", "statue", "tunnel", "turtle", "violin", "wagon",  "walnut", "whistle"};

constexpr std::string_view kNiahHeaderOne =
    "A special magic {k} is hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {k} afterwards.";
constexpr std::string_view kNiahHeaderMany =
    "Some special magic {k} are hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {k} afterwards.";
constexpr std::string_view kNiahQuestionOne =
    "What is the special magic {k} for {q} mentioned in the provided text? The special magic {k} for {q} "
    "mentioned in the provided text is";
constexpr std::string_view kNiahQuestionMany =
    "What are all the special magic {k} for {q} mentioned in the provided text? The special magic {k} for {q} "
    "mentioned in the provided text are";
constexpr std::string_view kVtHeader = "Memorize and track the chain(s) of variable assignment hidden in the following text.";
// RULER's answer prefix ends in "they are: "; the trailing space is dropped
// because SentencePiece tokenizers put a word's space in the word's token.
constexpr std::string_view kVtQuestion =
    "Question: Find all variables that are assigned the value {q} in the text above. Answer: According to the "
    "chain(s) of variable assignment in the text above, {n} variables are assigned the value {q}, they are:";
constexpr int kVtIclNoise = 5;  // noise lines of the solved example

std::string Replace(std::string_view tmpl, std::string_view key, std::string_view value) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t at = tmpl.find(key, pos);
    if (at == std::string_view::npos) break;
    out.append(tmpl.substr(pos, at - pos));
    out.append(value);
    pos = at + key.size();
  }
  out.append(tmpl.substr(pos));
  return out;
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

std::string RandomString(NeedleKind kind, std::mt19937_64& rng) {
  switch (kind) {
    case NeedleKind::kWord: {
      // Two statements: the operands of one `+` are drawn in an unspecified
      // order (gcc drew the noun first, clang the adjective), so one seed gave
      // different prompts per compiler. The noun first keeps gcc's prompts,
      // which the committed reports were made with.
      const std::string_view noun = kNouns[rng() % std::size(kNouns)];
      const std::string_view adjective = kAdjectives[rng() % std::size(kAdjectives)];
      return std::string(adjective) + "-" + std::string(noun);
    }
    case NeedleKind::kNumber:
      return std::to_string(1000000 + rng() % 9000000);  // 7 digits, as RULER
    case NeedleKind::kUuid: {
      // A version-4 UUID: 122 random bits, version nibble 4, variant 10xx.
      const uint64_t hi = rng(), lo = rng();
      constexpr char kHex[] = "0123456789abcdef";
      std::string s;
      for (int i = 0; i < 32; ++i) {
        const uint64_t word = i < 16 ? hi : lo;
        int nibble = static_cast<int>((word >> (4 * (15 - i % 16))) & 0xF);
        if (i == 12) nibble = 4;
        if (i == 16) nibble = 8 | (nibble & 3);
        if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
        s += kHex[nibble];
      }
      return s;
    }
  }
  return "";
}

// Draws strings of `kind` that are not in `used` and do not occur in
// `forbidden_lower` (the haystack, lowercased), and adds them to `used`.
Result<std::string> DrawFresh(NeedleKind kind, std::mt19937_64& rng, std::string_view forbidden_lower,
                              std::set<std::string>* used) {
  for (int tries = 0; tries < 1000; ++tries) {
    std::string s = RandomString(kind, rng);
    if (used->count(s) != 0 || forbidden_lower.find(ToLower(s)) != std::string_view::npos) continue;
    used->insert(s);
    return s;
  }
  return Internal("could not draw a needle string that is new to the haystack");
}

std::string VarName(int letters, std::mt19937_64& rng) {
  std::string s;
  for (int i = 0; i < letters; ++i) s += static_cast<char>('A' + rng() % 26);
  return s;
}

Result<int> CountTokens(const model::Tokenizer& tok, std::string_view text) {
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, /*add_special=*/true, /*parse_special=*/false));
  return static_cast<int>(ids.size());
}

// Largest m in [0, hi_limit] with fits(m), for fits monotone (true up to some
// m, then false), searched outward from `guess` so that a good estimate costs
// a few evaluations. REQUIRES: fits(0).
template <class Fits>
Result<int64_t> LargestFittingFrom(int64_t hi_limit, int64_t guess, Fits fits) {
  guess = std::clamp<int64_t>(guess, 0, hi_limit);
  int64_t lo = 0, hi = hi_limit + 1;  // fits(lo); !fits(hi) or hi out of range
  KVX_ASSIGN_OR_RETURN(bool ok, fits(guess));
  int64_t step = 1;
  if (ok) {
    lo = guess;
    while (lo + step <= hi_limit) {
      KVX_ASSIGN_OR_RETURN(bool up, fits(lo + step));
      if (!up) {
        hi = lo + step;
        break;
      }
      lo += step;
      step *= 2;
    }
  } else {
    hi = guess;
    while (hi - step > 0) {
      KVX_ASSIGN_OR_RETURN(bool down, fits(hi - step));
      if (down) {
        lo = hi - step;
        break;
      }
      hi -= step;
      step *= 2;
    }
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    KVX_ASSIGN_OR_RETURN(bool mid_ok, fits(mid));
    (mid_ok ? lo : hi) = mid;
  }
  return lo;
}

// A needle to insert before haystack unit round(frac * m).
struct Needle {
  double frac = 0;
  std::string text;
};

// Units 0..m-1 (from `unit(i)`) with the needles inserted, joined by `sep`.
// Needles at the same unit keep their order in `needles`.
template <class Unit>
std::string Weave(int64_t m, const std::vector<Needle>& needles, Unit unit, std::string_view sep) {
  std::vector<std::pair<int64_t, size_t>> at;
  for (size_t i = 0; i < needles.size(); ++i) {
    at.emplace_back(std::llround(needles[i].frac * static_cast<double>(m)), i);
  }
  std::sort(at.begin(), at.end());
  std::string out;
  size_t k = 0;
  auto add = [&](std::string_view piece) {
    if (!out.empty()) out.append(sep);
    out.append(piece);
  };
  for (int64_t u = 0; u <= m; ++u) {
    while (k < at.size() && at[k].first == u) add(needles[at[k++].second].text);
    if (u < m) add(unit(u));
  }
  return out;
}

// Fractions for needles that must come after `depth`: depth + u (1 - depth),
// u uniform, sorted (so a chain keeps its order).
std::vector<double> FractionsAfter(double depth, int n, std::mt19937_64& rng) {
  std::vector<double> f;
  for (int i = 0; i < n; ++i) {
    const double u = static_cast<double>(rng() % 1000001) / 1e6;
    f.push_back(depth + u * (1.0 - depth));
  }
  std::sort(f.begin(), f.end());
  return f;
}

Status TooShort(int length, int base, int n_gen) {
  return InvalidArgument("length " + std::to_string(length) + " is too short: the prompt without any haystack " +
                         "already has " + std::to_string(base) + " tokens and " + std::to_string(n_gen) +
                         " are reserved for the answer");
}

}  // namespace

std::string_view NeedleKindPlural(NeedleKind k) {
  switch (k) {
    case NeedleKind::kWord:
      return "words";
    case NeedleKind::kNumber:
      return "numbers";
    case NeedleKind::kUuid:
      return "uuids";
  }
  return "?";
}

std::string RandomNeedleString(NeedleKind kind, std::mt19937_64& rng) { return RandomString(kind, rng); }

Result<std::string> LoadEssays(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.size() > 4 && name.substr(name.size() - 4) == ".txt" && name.rfind("LICENSE", 0) != 0) {
      files.push_back(e.path().string());
    }
  }
  if (ec || files.empty()) {
    return NotFound("needle, niah, rag and kvx tune need the Paul Graham essays: no .txt files in " + dir +
                    "; point --data at ../shared/data");
  }
  std::sort(files.begin(), files.end());
  std::string hay;
  for (const std::string& f : files) {
    KVX_ASSIGN_OR_RETURN(std::string text, ReadFileToString(f));
    hay += text;
  }
  return hay;
}

Haystack MakeHaystack(std::string_view raw) {
  Haystack h;
  std::string text;
  bool space = false;
  for (char c : raw) {
    const bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
    if (ws) {
      space = !text.empty();
      continue;
    }
    if (space) text += ' ';
    space = false;
    text += c;
  }
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '.' || c == '!' || c == '?') && i + 1 < text.size() && text[i + 1] == ' ') {
      h.sentences.push_back(text.substr(start, i + 1 - start));
      start = i + 2;
    }
  }
  if (start < text.size()) h.sentences.push_back(text.substr(start));
  h.text = ToLower(text);
  return h;
}

std::string NiahNeedle(NeedleKind value_kind, std::string_view key, std::string_view value) {
  return "One of the special magic " + std::string(NeedleKindPlural(value_kind)) + " for " + std::string(key) +
         " is: " + std::string(value) + ".";
}

namespace {

struct NiahText {
  std::string header, tail;  // before and after the context
};

NiahText NiahFrame(const NiahSpec& spec, std::string_view asked_key) {
  const bool one = spec.n_values == 1;
  std::string kind(NeedleKindPlural(spec.value));
  if (one) kind.pop_back();  // "number"
  NiahText t;
  t.header = Replace(one ? kNiahHeaderOne : kNiahHeaderMany, "{k}", kind) + "\n";
  t.tail = "\n" + Replace(Replace(one ? kNiahQuestionOne : kNiahQuestionMany, "{k}", kind), "{q}", asked_key);
  return t;
}

}  // namespace

std::string NiahQuestion(const NiahSpec& spec, std::string_view key) { return NiahFrame(spec, key).tail; }

Result<int> NiahBareTokens(const model::Tokenizer& tok, const NiahSpec& spec) {
  std::mt19937_64 rng(0);
  const std::string key = RandomString(spec.key, rng);
  std::vector<Needle> needles;
  for (int i = 0; i < spec.n_keys * spec.n_values; ++i) {
    needles.push_back(Needle{0.0, NiahNeedle(spec.value, key, RandomString(spec.value, rng))});
  }
  const NiahText f = NiahFrame(spec, key);
  return CountTokens(tok, f.header + Weave(0, needles, [](int64_t) { return std::string(); }, " ") + f.tail);
}

Result<ProbePlan> BuildNiahPlan(const model::Tokenizer& tok, const Haystack& hay, const NiahSpec& spec,
                                const std::vector<int>& lengths, const std::vector<double>& depths, int trials,
                                int n_gen, uint64_t seed) {
  if (spec.n_keys < 1 || spec.n_values < 1) return InvalidArgument("niah needs at least one key and one value");
  if (hay.sentences.empty()) return InvalidArgument("the niah haystack has no text");
  const int64_t n_sent = static_cast<int64_t>(hay.sentences.size());
  // Tokens of each sentence as it appears in the context (after a space), to
  // estimate how many fit; counted lazily, at most once each.
  std::vector<int> sent_tokens(static_cast<size_t>(n_sent), -1);
  auto sentence_tokens = [&](int64_t i) -> Result<int> {
    int& n = sent_tokens[static_cast<size_t>(i)];
    if (n < 0) {
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(" " + hay.sentences[static_cast<size_t>(i)], false, false));
      n = static_cast<int>(ids.size());
    }
    return n;
  };
  ProbePlan plan;
  std::mt19937_64 rng(seed);
  for (int length : lengths) {
    const int budget = length - n_gen;
    for (double depth : depths) {
      const int cell = static_cast<int>(plan.cells.size());
      plan.cells.push_back(GridCell{length, depth, 0});
      for (int t = 0; t < trials; ++t) {
        std::set<std::string> used;
        std::vector<std::string> keys;
        std::vector<Needle> needles;
        GenItem item;
        for (int k = 0; k < spec.n_keys; ++k) {
          KVX_ASSIGN_OR_RETURN(std::string key, DrawFresh(spec.key, rng, hay.text, &used));
          keys.push_back(key);
        }
        // The asked key's values: the first at `depth`, the rest after it.
        const std::vector<double> later = FractionsAfter(depth, spec.n_values - 1, rng);
        for (int v = 0; v < spec.n_values; ++v) {
          KVX_ASSIGN_OR_RETURN(std::string value, DrawFresh(spec.value, rng, hay.text, &used));
          needles.push_back(Needle{v == 0 ? depth : later[static_cast<size_t>(v - 1)],
                                   NiahNeedle(spec.value, keys[0], value)});
          item.answers.push_back(value);
          item.needles.emplace_back(keys[0], value);
        }
        // Distractor keys, anywhere, each with as many values.
        for (int k = 1; k < spec.n_keys; ++k) {
          for (int v = 0; v < spec.n_values; ++v) {
            KVX_ASSIGN_OR_RETURN(std::string value, DrawFresh(spec.value, rng, hay.text, &used));
            const double u = static_cast<double>(rng() % 1000001) / 1e6;
            needles.push_back(Needle{u, NiahNeedle(spec.value, keys[static_cast<size_t>(k)], value)});
            item.needles.emplace_back(keys[static_cast<size_t>(k)], value);
          }
        }
        const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_sent));
        const NiahText frame = NiahFrame(spec, keys[0]);
        auto unit = [&](int64_t i) -> const std::string& {
          return hay.sentences[static_cast<size_t>((start + i) % n_sent)];
        };
        auto prompt_for = [&](int64_t m) { return frame.header + Weave(m, needles, unit, " ") + frame.tail; };
        KVX_ASSIGN_OR_RETURN(int base, CountTokens(tok, prompt_for(0)));
        if (base > budget) return TooShort(length, base, n_gen);
        int64_t guess = 0;
        for (int sum = base; guess < n_sent; ++guess) {
          KVX_ASSIGN_OR_RETURN(int n, sentence_tokens((start + guess) % n_sent));
          if (sum + n > budget) break;
          sum += n;
        }
        KVX_ASSIGN_OR_RETURN(int64_t m, LargestFittingFrom(n_sent, guess, [&](int64_t c) -> Result<bool> {
                               KVX_ASSIGN_OR_RETURN(int n, CountTokens(tok, prompt_for(c)));
                               return n <= budget;
                             }));
        if (m >= n_sent) {
          return InvalidArgument("the essays (" + std::to_string(n_sent) + " sentences) are too short for length " +
                                 std::to_string(length));
        }
        const std::string text = prompt_for(m);
        KVX_ASSIGN_OR_RETURN(item.prompt, tok.Encode(text, true, false));
        KVX_RETURN_IF_ERROR(MarkQuestion(tok, text, text.size() - frame.tail.size(), &item));
        item.n_gen = n_gen;
        item.cell = cell;
        item.expected = item.answers[0];
        plan.items.push_back(std::move(item));
      }
    }
  }
  return plan;
}

namespace {

// One chain: names[0] = value, names[i] = names[i - 1].
struct Chain {
  std::vector<std::string> names;
  std::string value;
  std::vector<std::string> Statements() const {
    std::vector<std::string> s = {"VAR " + names[0] + " = " + value};
    for (size_t i = 1; i < names.size(); ++i) s.push_back("VAR " + names[i] + " = VAR " + names[i - 1]);
    return s;
  }
};

Chain DrawChain(int letters, std::mt19937_64& rng, const std::string& avoid_value) {
  Chain c;
  std::set<std::string> seen;
  while (static_cast<int>(c.names.size()) < kVtHops + 1) {
    std::string n = VarName(letters, rng);
    if (n == "VAR" || !seen.insert(n).second) continue;
    c.names.push_back(n);
  }
  do {
    c.value = std::to_string(10000 + rng() % 90000);
  } while (c.value == avoid_value);
  return c;
}

std::string VtPrompt(const Chain& c, int64_t m, const std::vector<double>& fracs) {
  std::vector<Needle> needles;
  const std::vector<std::string> st = c.Statements();
  for (size_t i = 0; i < st.size(); ++i) needles.push_back(Needle{fracs[i], st[i]});
  const std::string context = Weave(m, needles, [](int64_t) { return kVtNoise; }, "\n");
  return std::string(kVtHeader) + "\n\n" + context + "\n" +
         Replace(Replace(kVtQuestion, "{q}", c.value), "{n}", std::to_string(c.names.size()));
}

}  // namespace

Result<int> VtBareTokens(const model::Tokenizer& tok) {
  std::mt19937_64 rng(0);
  const Chain icl = DrawChain(3, rng, "");
  const Chain chain = DrawChain(5, rng, icl.value);
  const std::vector<double> fracs(kVtHops + 1, 0.0);
  std::string icl_answer;
  for (const std::string& n : icl.names) icl_answer += " " + n;
  return CountTokens(tok, VtPrompt(icl, kVtIclNoise, fracs) + icl_answer + "\n\n" + VtPrompt(chain, 0, fracs));
}

Result<ProbePlan> BuildVtPlan(const model::Tokenizer& tok, const std::vector<int>& lengths,
                              const std::vector<double>& depths, int trials, int n_gen, uint64_t seed) {
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> unit_ids, tok.Encode("\n" + std::string(kVtNoise), false, false));
  const int64_t unit_tokens = std::max<int64_t>(1, static_cast<int64_t>(unit_ids.size()));
  ProbePlan plan;
  std::mt19937_64 rng(seed);
  for (int length : lengths) {
    const int budget = length - n_gen;
    for (double depth : depths) {
      const int cell = static_cast<int>(plan.cells.size());
      plan.cells.push_back(GridCell{length, depth, 0});
      for (int t = 0; t < trials; ++t) {
        // The solved example (RULER's in-context example: 3-letter names).
        const Chain icl = DrawChain(3, rng, "");
        const std::vector<double> icl_fracs = FractionsAfter(0.0, kVtHops + 1, rng);
        std::string icl_answer;
        for (const std::string& n : icl.names) icl_answer += " " + n;
        const std::string prefix = VtPrompt(icl, kVtIclNoise, icl_fracs) + icl_answer + "\n\n";
        const Chain chain = DrawChain(5, rng, icl.value);
        std::vector<double> fracs = FractionsAfter(depth, kVtHops, rng);
        fracs.insert(fracs.begin(), depth);
        auto prompt_for = [&](int64_t m) { return prefix + VtPrompt(chain, m, fracs); };
        KVX_ASSIGN_OR_RETURN(int base, CountTokens(tok, prompt_for(0)));
        if (base > budget) return TooShort(length, base, n_gen);
        KVX_ASSIGN_OR_RETURN(int64_t m, LargestFittingFrom(1000000, (budget - base) / unit_tokens,
                                                           [&](int64_t c) -> Result<bool> {
                                                             KVX_ASSIGN_OR_RETURN(int n, CountTokens(tok, prompt_for(c)));
                                                             return n <= budget;
                                                           }));
        GenItem item;
        const std::string text = prompt_for(m);
        KVX_ASSIGN_OR_RETURN(item.prompt, tok.Encode(text, true, false));
        // The question is the text after the last line break (VtPrompt's last line).
        KVX_RETURN_IF_ERROR(MarkQuestion(tok, text, text.rfind('\n'), &item));
        item.n_gen = n_gen;
        item.cell = cell;
        item.answers = chain.names;
        item.expected = chain.names[0];
        plan.items.push_back(std::move(item));
      }
    }
  }
  return plan;
}

}  // namespace kvx::eval
