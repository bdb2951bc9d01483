#include "kv/kv_spec.h"

#include <cctype>
#include <limits>
#include <vector>

#include "kv/layout.h"

namespace kvx::kv {
namespace {

constexpr std::string_view kValidKeys = "codec, page, budget";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Parses a non-negative decimal integer that fits in uint64_t.
bool ParseUint(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

Status BadValue(std::string_view item, const std::string& why) {
  return InvalidArgument("bad --kv item '" + std::string(item) + "': " + why);
}

Result<uint64_t> ParseBytes(std::string_view item, std::string_view value) {
  size_t digits = 0;
  while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
  uint64_t number = 0;
  const std::string suffix = Lower(Trim(value.substr(digits)));
  uint64_t mult = 0;
  if (suffix.empty() || suffix == "b") mult = 1;
  else if (suffix == "k" || suffix == "kib") mult = 1ull << 10;
  else if (suffix == "m" || suffix == "mib") mult = 1ull << 20;
  else if (suffix == "g" || suffix == "gib") mult = 1ull << 30;
  if (!ParseUint(value.substr(0, digits), &number) || mult == 0) {
    return BadValue(item, "budget must be a whole number of bytes with an optional suffix K, M, G "
                          "(or KiB, MiB, GiB; binary), e.g. budget=512M");
  }
  if (number > std::numeric_limits<uint64_t>::max() / mult) return BadValue(item, "budget is too large");
  return number * mult;
}

std::string FormatBytes(uint64_t b) {
  if (b != 0 && b % (1ull << 30) == 0) return std::to_string(b >> 30) + "GiB";
  if (b != 0 && b % (1ull << 20) == 0) return std::to_string(b >> 20) + "MiB";
  if (b != 0 && b % (1ull << 10) == 0) return std::to_string(b >> 10) + "KiB";
  return std::to_string(b);
}

}  // namespace

std::string KVSpec::ToString() const {
  std::string s = "codec=" + std::string(CodecName(codec)) + ",page=" + std::to_string(page_tokens);
  if (budget_bytes != 0) s += ",budget=" + FormatBytes(budget_bytes);
  return s;
}

Result<KVSpec> ParseKVSpec(std::string_view text) {
  KVSpec spec;
  bool seen_codec = false, seen_page = false, seen_budget = false;
  for (std::string_view group : Split(text, ';')) {
    for (std::string_view raw_item : Split(group, ',')) {
      const std::string_view item = Trim(raw_item);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return InvalidArgument("bad --kv item '" + std::string(item) + "': expected key=value (keys: " +
                               std::string(kValidKeys) + ")");
      }
      const std::string_view key = Trim(item.substr(0, eq));
      const std::string_view value = Trim(item.substr(eq + 1));
      if (value.empty()) return BadValue(item, "missing value");
      bool* seen = nullptr;
      if (key == "codec") seen = &seen_codec;
      else if (key == "page") seen = &seen_page;
      else if (key == "budget") seen = &seen_budget;
      else {
        return InvalidArgument("unknown --kv key '" + std::string(key) + "' in '" + std::string(item) +
                               "'; valid keys: " + std::string(kValidKeys));
      }
      if (*seen) return InvalidArgument("duplicate --kv key '" + std::string(key) + "' in '" + std::string(item) + "'");
      *seen = true;
      if (key == "codec") {
        const std::optional<CodecId> id = ParseCodecName(value);
        if (!id) {
          return InvalidArgument("unknown --kv codec '" + std::string(value) + "'; valid codecs: " +
                                 std::string(kCodecChoices));
        }
        spec.codec = *id;
      } else if (key == "page") {
        uint64_t p = 0;
        if (!ParseUint(value, &p) || p < 1 || p > static_cast<uint64_t>(kMaxPageTokens) || (p & (p - 1)) != 0) {
          return BadValue(item, "page (tokens per page) must be a power of two in 1.." +
                                    std::to_string(kMaxPageTokens) + ", e.g. page=16");
        }
        spec.page_tokens = static_cast<int>(p);
      } else {
        KVX_ASSIGN_OR_RETURN(spec.budget_bytes, ParseBytes(item, value));
      }
    }
  }
  return spec;
}

}  // namespace kvx::kv
