// Printable: renders bytes that came from outside (a model file's keys,
// tensor names, architecture or tokenizer names; a user's path) so that they
// can go into a message or a terminal safely.
//
// A hostile GGUF can put anything in a string: a NUL byte (printf("%s")
// stops there, so the rest of the message would vanish), terminal escape
// sequences (ESC [ ... moves the cursor, rewrites earlier lines or changes
// the window title), a carriage return that overwrites the start of the line,
// C1 controls (U+009B is a one-character CSI on some terminals), bidi
// overrides that reorder what the reader sees, or invalid UTF-8. Printable()
// keeps ordinary text (ASCII and valid UTF-8, including non-Latin scripts)
// and writes every one of those as a visible escape, so the message shows
// exactly which bytes the file holds.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvx {

// Default cap on the bytes of input Printable() renders: a message quoting a
// file's string stays one readable line even if the string is megabytes.
inline constexpr size_t kPrintableMaxBytes = 256;

// `text` with
//   * C0 controls (0x00-0x1F), DEL (0x7F) and bytes that are not part of a
//     valid UTF-8 sequence written as \xNN;
//   * C1 controls (U+0080-U+009F) and the bidi controls (U+200E, U+200F,
//     U+202A-U+202E, U+2066-U+2069) written as \u{XXXX};
//   * everything after the first `max_bytes` input bytes replaced by
//     "...(N bytes)" (N: the full length), cut at a character boundary.
// The result holds no byte below 0x20 and is valid UTF-8.
std::string Printable(std::string_view text, size_t max_bytes = kPrintableMaxBytes);

// "'" + Printable(text, max_bytes) + "'": a file's string quoted in a message.
std::string QuotePrintable(std::string_view text, size_t max_bytes = kPrintableMaxBytes);

}  // namespace kvx
