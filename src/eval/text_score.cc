#include "eval/text_score.h"

#include <algorithm>
#include <map>

namespace kvx::eval {

namespace {
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) { return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

std::optional<int64_t> FirstInteger(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && !IsDigit(text[i])) ++i;
  if (i == text.size()) return std::nullopt;
  size_t j = i;
  while (j < text.size() && IsDigit(text[j])) ++j;
  if (j - i > 18) return std::nullopt;
  int64_t v = 0;
  for (size_t k = i; k < j; ++k) v = v * 10 + (text[k] - '0');
  return v;
}

bool FirstIntegerDecided(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && !IsDigit(text[i])) ++i;
  while (i < text.size() && IsDigit(text[i])) ++i;
  return i < text.size() && i > 0 && IsDigit(text[i - 1]);
}

std::vector<std::string> Words(std::string_view text) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : text) {
    if (IsAlnum(c)) {
      cur.push_back(Lower(c));
    } else if (!cur.empty()) {
      words.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

RougeScore Rouge1(std::string_view candidate, std::string_view reference) {
  const std::vector<std::string> cand = Words(candidate);
  const std::vector<std::string> ref = Words(reference);
  RougeScore s;
  if (cand.empty() || ref.empty()) return s;
  std::map<std::string, int> ref_counts;
  for (const std::string& w : ref) ref_counts[w]++;
  int overlap = 0;
  for (const std::string& w : cand) {
    auto it = ref_counts.find(w);
    if (it != ref_counts.end() && it->second > 0) {
      it->second--;
      overlap++;
    }
  }
  s.precision = static_cast<double>(overlap) / cand.size();
  s.recall = static_cast<double>(overlap) / ref.size();
  s.f1 = overlap == 0 ? 0.0 : 2 * s.precision * s.recall / (s.precision + s.recall);
  return s;
}

std::string_view FirstSentence(std::string_view text) {
  size_t start = 0;
  while (start < text.size() &&
         (text[start] == ' ' || text[start] == '\n' || text[start] == '\t' || text[start] == '\r')) {
    ++start;
  }
  text.remove_prefix(start);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.' || c == '!' || c == '?' || c == '\n') return text.substr(0, i + 1);
  }
  return text;
}

std::string ItemShape(std::string_view item) {
  if (item.empty()) return "other";
  auto all = [&](auto pred) { return std::all_of(item.begin(), item.end(), pred); };
  auto hex = [](char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  if (all([](char c) { return IsDigit(c); })) return "number";
  if (all([](char c) { return c >= 'A' && c <= 'Z'; })) return "caps" + std::to_string(item.size());
  if (item.size() == 36) {
    bool uuid = true;
    for (size_t i = 0; i < item.size(); ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      uuid = uuid && (dash ? item[i] == '-' : hex(item[i]));
    }
    if (uuid) return "uuid";
  }
  const size_t dash = item.find('-');
  auto letters = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return IsAlnum(c) && !IsDigit(c); });
  };
  if (dash != std::string_view::npos && letters(item.substr(0, dash)) && letters(item.substr(dash + 1))) {
    return "word";
  }
  return "other";
}

namespace {

// The first `k` items of `shape` in `output` (lowercased), and whether more
// output could change them: false until k items are complete (followed by a
// character that cannot extend them).
std::vector<std::string> Candidates(std::string_view output, const std::string& shape, size_t k, bool* decided) {
  *decided = false;
  auto in_item = [](char c) { return IsAlnum(c) || c == '-'; };
  std::vector<std::string> picked;
  size_t i = 0;
  while (i < output.size() && picked.size() < k) {
    if (!in_item(output[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < output.size() && in_item(output[j])) ++j;
    std::string_view item = output.substr(i, j - i);
    while (!item.empty() && item.front() == '-') item.remove_prefix(1);
    while (!item.empty() && item.back() == '-') item.remove_suffix(1);
    // An item running to the end of the output may still grow.
    if (ItemShape(item) == shape && j < output.size()) {
      std::string low(item);
      for (char& c : low) c = Lower(c);
      picked.push_back(low);
    }
    i = j;
  }
  if (picked.size() >= k) *decided = true;
  return picked;
}

}  // namespace

double ValuesFound(std::string_view output, const std::vector<std::string>& answers) {
  if (answers.empty()) return 0.0;
  bool decided = false;
  // At the end of the output an item is complete: count it.
  std::vector<std::string> picked = Candidates(std::string(output) + " ", ItemShape(answers[0]), answers.size(),
                                               &decided);
  int found = 0;
  for (const std::string& a : answers) {
    std::string low = a;
    for (char& c : low) c = Lower(c);
    auto it = std::find(picked.begin(), picked.end(), low);
    if (it != picked.end()) {
      picked.erase(it);  // each candidate matches one answer
      ++found;
    }
  }
  return static_cast<double>(found) / static_cast<double>(answers.size());
}

bool ValuesDecided(std::string_view output, const std::vector<std::string>& answers) {
  if (answers.empty()) return true;
  bool decided = false;
  Candidates(output, ItemShape(answers[0]), answers.size(), &decided);
  return decided;
}

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int len = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      min = 0x10000;
    }
    bool ok = len > 0 && i + len <= text.size();
    uint32_t cp = len == 1 ? c : (len == 2 ? c & 0x1F : (len == 3 ? c & 0x0F : c & 0x07));
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.append(text.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace kvx::eval
