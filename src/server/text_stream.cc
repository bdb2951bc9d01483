#include "server/text_stream.h"

#include <algorithm>

namespace kvx::server {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the UTF-8 sequence starting at s[i] if it is valid and complete,
// 0 if invalid, -1 if valid so far but cut off by the end of s.
int SequenceLength(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = 0;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return n;
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = SequenceLength(s, i);
    if (n < 0) return i;
    i += n == 0 ? 1 : static_cast<size_t>(n);  // invalid bytes are "complete" (they become U+FFFD)
  }
  return i;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int n = SequenceLength(s, i);
    if (n <= 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = SequenceLength(s, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

TextStream::TextStream(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string TextStream::Emit(size_t n) {
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::Add(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  // A stop string anywhere in the pending text ends the sample before it
  // (the earliest one wins).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = Emit(first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that could begin a stop string, and an
  // incomplete UTF-8 character.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  const size_t safe = std::min(pending_.size() - hold, CompleteUtf8Prefix(pending_));
  return Emit(safe);
}

std::string TextStream::Flush() {
  if (stopped_) return {};
  return Emit(pending_.size());
}

}  // namespace kvx::server
