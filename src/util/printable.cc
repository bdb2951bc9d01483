#include "util/printable.h"

#include <algorithm>
#include <cstdint>

namespace kvx {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] and its code point,
// or 0 when s[i] does not start one (stray continuation byte, overlong form,
// surrogate, beyond U+10FFFF, or cut short by the end of the text).
size_t DecodeUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c0 = b(0);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
  }
  uint32_t v = c0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) v = (v << 6) | (b(k) & 0x3F);
  *cp = v;
  return len;
}

bool IsInvisibleControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

constexpr char kHex[] = "0123456789ABCDEF";

}  // namespace

std::string Printable(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text, i, &cp);
    if (i + (len == 0 ? 1 : len) > max_bytes) break;
    if (len == 0 || cp < 0x20 || cp == 0x7F) {
      const auto byte = static_cast<uint8_t>(text[i]);
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
      ++i;
    } else if (IsInvisibleControl(cp)) {
      out += "\\u{";
      for (int shift = cp > 0xFF ? 12 : 4; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 0xF];
      out += '}';
      i += len;
    } else {
      out.append(text.data() + i, len);
      i += len;
    }
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string QuotePrintable(std::string_view text, size_t max_bytes) {
  return "'" + Printable(text, max_bytes) + "'";
}

}  // namespace kvx
