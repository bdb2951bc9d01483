#include "util/byte_size.h"

#include <cctype>
#include <limits>
#include <string>

#include "util/printable.h"

namespace kvx {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  const std::string quoted = QuotePrintable(text, 64);
  const std::string_view t = Trim(text);
  size_t digits = 0;
  while (digits < t.size() && t[digits] >= '0' && t[digits] <= '9') ++digits;
  std::string suffix(Trim(t.substr(digits)));
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t mult = 0;
  if (suffix.empty() || suffix == "b") mult = 1;
  else if (suffix == "k" || suffix == "kib") mult = 1ull << 10;
  else if (suffix == "m" || suffix == "mib") mult = 1ull << 20;
  else if (suffix == "g" || suffix == "gib") mult = 1ull << 30;
  const std::string grammar = "give a whole number of bytes with an optional suffix K, M, G (or KiB, MiB, GiB; "
                              "binary), e.g. 512M";
  if (digits == 0 || mult == 0) return InvalidArgument(quoted + " is not a size: " + grammar);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const Status too_large = InvalidArgument(quoted + " is too large: sizes go up to 2^64 - 1 bytes; " + grammar);
  uint64_t number = 0;
  for (char c : t.substr(0, digits)) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (number > (kMax - d) / 10) return too_large;
    number = number * 10 + d;
  }
  if (number > kMax / mult) return too_large;
  return number * mult;
}

}  // namespace kvx
