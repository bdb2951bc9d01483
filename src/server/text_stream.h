// TextStream: turns a sample's generated token pieces into text a client can
// be sent piece by piece: valid UTF-8 only (a multi-byte character split
// over byte tokens is held until complete; bytes that can never form one
// become U+FFFD), and OpenAI's `stop` strings honoured — generation text
// ends before the first stop string, and text that might be the start of a
// stop string is held back until the next piece decides.
//
// Thread-safety: not thread-safe (one per sample).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvx::server {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {});

  // Adds the bytes of one token; returns the text that became safe to send
  // (possibly empty). After a stop string appeared, stopped() is true and
  // further calls return "".
  std::string Add(std::string_view piece);
  // The end of the sample: everything still held back (an incomplete UTF-8
  // tail becomes U+FFFD; a partial stop string is just text).
  std::string Flush();

  bool stopped() const { return stopped_; }
  // Everything returned so far.
  const std::string& text() const { return text_; }

 private:
  std::string Emit(size_t n);

  std::vector<std::string> stops_;
  std::string pending_;
  std::string text_;
  bool stopped_ = false;
};

// Bytes of the longest prefix of `s` that is valid UTF-8 up to an incomplete
// (but so far valid) multi-byte sequence at the very end.
size_t CompleteUtf8Prefix(std::string_view s);
// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view s);
// Whether `s` is valid UTF-8.
bool IsValidUtf8(std::string_view s);

}  // namespace kvx::server
