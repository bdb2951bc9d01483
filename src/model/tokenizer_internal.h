// Internals shared by tokenizer.cc, tokenizer_spm.cc, tokenizer_bpe.cc and
// tokenizer_unicode.cc. Not part of the public interface.
//
// Thread-safety: a TokenizerImpl is immutable after Build; the encoders keep
// all mutable state on the stack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"
#include "util/status.h"

namespace kvx::model {

// Hash for heterogeneous (string_view) lookup in unordered_map<std::string>.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// ---- unicode helpers (tokenizer_unicode.cc) ----

// Length of the UTF-8 sequence that starts with lead byte `c` (1 for
// continuation/invalid bytes, as llama.cpp does).
inline size_t Utf8SeqLen(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}
// Strict validation (no overlongs, surrogates or code points > U+10FFFF).
// Returns the offset of the first offending byte, or npos if valid.
size_t FindInvalidUtf8(std::string_view s);
void AppendUtf8(uint32_t cp, std::string* out);
// GPT-2 byte-level BPE: byte -> its printable code point as UTF-8.
const std::string& ByteToBpeChar(uint8_t b);
// Inverse of ByteToBpeChar for one code point; -1 if the code point is not
// one of the 256 images.
int BpeCodepointToByte(uint32_t cp);
// Replaces every "▁" (U+2581) with ' '.
std::string UnescapeSpmSpaces(std::string_view s);

// ---- BPE pre-tokenizer (tokenizer_bpe.cc) ----

class BpePreTokenizer {
 public:
  // Compiles the regex list for `pre` (tokenizer.ggml.pre); Unimplemented for
  // unknown names. `pre` must already be normalized by NormalizeBpePre.
  static Result<std::unique_ptr<BpePreTokenizer>> Create(const std::string& pre);
  ~BpePreTokenizer();
  // Splits valid UTF-8 `text` into words: each regex in turn splits every
  // current piece into matches and the gaps between them.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  BpePreTokenizer() = default;
  std::vector<void*> codes_;  // pcre2_code_8*
};

struct BpePreInfo {
  std::string regex_set;   // canonical name of the regex list
  bool ignore_merges = false;
  bool clean_spaces = true;
  bool default_add_bos = false;
};
// Maps a tokenizer.ggml.pre value to its settings; Unimplemented (listing the
// supported names) if kvx does not know it.
Result<BpePreInfo> NormalizeBpePre(const std::string& pre);

// ---- the vocabulary ----

struct TokenizerImpl {
  struct Token {
    std::string text;
    float score = 0.0f;
    uint32_t attr = kAttrNormal;
  };

  VocabKind kind = VocabKind::kSpm;
  std::vector<Token> tokens;
  StringIdMap token_to_id;
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, unk = -1, pad = -1, sep = -1, eot = -1, eom = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  bool clean_spaces = false;
  bool ignore_merges = false;
  std::vector<uint8_t> is_eog;  // per id

  // Control / user-defined / unknown tokens, longest text first (the
  // special-token partition tries them in this order).
  std::vector<int32_t> special_tokens;
  // TokenToPiece(id, special=true) for every id.
  std::vector<std::string> pieces;

  // SPM: ASCII bytes that occur in no token of two or more characters (they
  // never merge, so the encoder may cut the text at them).
  bool spm_isolated[128];
  // SPM byte fallback: byte -> token ("<0xNN>", else the one-byte text), -1.
  int32_t byte_token[256];

  // BPE: "left right" -> rank.
  StringIdMap merge_rank;
  std::unique_ptr<BpePreTokenizer> pre;

  int32_t Find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  int32_t n() const { return static_cast<int32_t>(tokens.size()); }
};

// Builds the impl: attributes, specials, EOG set, caches.
Result<std::unique_ptr<TokenizerImpl>> BuildTokenizerImpl(TokenizerVocab vocab);

// Appends the ids of one raw-text fragment (no special tokens inside).
// SPM: `text` is already space-escaped ("▁"). REQUIRES: valid UTF-8.
void SpmEncodeFragment(const TokenizerImpl& v, std::string_view text, std::vector<int32_t>* out);
void BpeEncodeFragment(const TokenizerImpl& v, std::string_view text, std::vector<int32_t>* out);

}  // namespace kvx::model
