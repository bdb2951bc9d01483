// Tokenizer: text <-> token ids for llama-family GGUF models.
//
// Two vocabulary kinds are supported, with llama.cpp's behaviour as the
// specification (ids must match llama_tokenize bit for bit):
//
//  * SPM ("llama" in tokenizer.ggml.model): SentencePiece-style. A space is
//    prepended (add_space_prefix), spaces become U+2581 "▁", the text is split
//    into UTF-8 characters and adjacent symbols are merged greedily, always
//    taking the pair whose merged token has the highest score (ties: leftmost).
//    Symbols that are not tokens fall back to byte tokens <0xNN>. Where the
//    vocabulary has no byte tokens, kvx emits the unknown token (consecutive
//    unknown characters fuse into one, as Hugging Face's fuse_unk does);
//    llama.cpp throws there instead.
//  * BPE ("gpt2"): byte-level BPE. A pre-tokenizer regex (chosen by
//    tokenizer.ggml.pre) splits the text into words, each word's bytes are
//    mapped to printable code points (GPT-2's byte-to-unicode table), then
//    merged by rank from tokenizer.ggml.merges.
//
// Before either, control / user-defined / unknown token texts are cut out of
// the input ("special token partition"): user-defined tokens always, control
// and unknown ones only when parse_special is true.
//
// Thread-safety: immutable after construction; Encode/Decode may be called
// concurrently from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace kvx::gguf {
class GgufFile;
}

namespace kvx::model {

// tokenizer.ggml.token_type values (GGUF).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Per-token attribute bits; same values as llama.cpp's llama_token_attr so
// they can be compared with its golden output.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,  // partition: strip whitespace left of this token
  kAttrRstrip = 1u << 8,  // partition: strip whitespace right of this token
  kAttrSingleWord = 1u << 9,
};

enum class VocabKind { kSpm, kBpe };

// Everything a tokenizer is built from: the tokenizer.ggml.* metadata in
// plain form. FromGguf fills one from the file; tests build one in memory.
struct TokenizerVocab {
  std::string model = "llama";  // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;              // tokenizer.ggml.pre; "" = "default"
  std::string model_name;       // general.name (phi-3 needs per-token strip flags)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // empty: all 0
  std::vector<int32_t> token_types;  // TokenType values; empty: all normal
  std::vector<std::string> merges;   // BPE only: "left right", by rank
  // Special ids; absent (or out of range) -> llama.cpp's defaults
  // (SPM: bos 1, eos 2, unk 0; BPE: bos = eos = 11; others none).
  std::optional<int64_t> bos_id, eos_id, unk_id, pad_id, sep_id, eot_id, eom_id;
  std::optional<int64_t> fim_pad_id, fim_rep_id, fim_sep_id;
  // Absent -> defaults: SPM add_bos true; BPE false (llama3-style pre: true);
  // add_eos false; add_space_prefix true for SPM, false for BPE.
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

struct TokenizerImpl;  // tokenizer_internal.h

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from a GGUF file. Unimplemented for vocabulary
  // kinds / pre-tokenizers kvx does not support (the message lists those it
  // does); InvalidArgument/NotFound for inconsistent or missing metadata.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& f);
  static Result<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // llama_tokenize(text, add_special, parse_special). add_special adds BOS
  // (and EOS) when the vocabulary asks for them (add_bos()/add_eos()).
  // parse_special: control-token texts in `text` (e.g. "<s>") become those
  // tokens instead of being spelled out. InvalidArgument if `text` is not
  // valid UTF-8 (the message gives the byte offset).
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                      bool parse_special) const;
  // Byte ranges [first, second) of a text, sorted and disjoint.
  using ByteRanges = std::vector<std::pair<size_t, size_t>>;
  // As Encode, but the bytes in `text_only` are read as text whatever
  // parse_special: no control, user-defined or unknown token is cut out of
  // them, or across their edges (a chat message's content inside its
  // template's turn markers: server/chat_template.h). The text between
  // special tokens is encoded in one piece, so where no token is refused the
  // ids are Encode's.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special, bool parse_special,
                                      const ByteRanges& text_only) const;
  // As Encode(text, /*add_special=*/false, parse_special, text_only), for
  // text that continues a prompt after other text (a chunk after the
  // instructions or another chunk, the question after the chunks): no
  // add_space_prefix space at its start. SPM adds that space only at the
  // start of a text or right after a special token, so these are the ids the
  // text gets inside the running prompt, wherever no merge crosses the seam
  // (one does when the seam is inside a word, e.g. "pass" | "key").
  Result<std::vector<int32_t>> EncodeContinuation(std::string_view text, bool parse_special,
                                                  const ByteRanges& text_only = {}) const;

  // llama_token_to_piece(id, lstrip=0, special): the bytes this token stands
  // for. Control and unknown tokens render as their text when `special`,
  // else as "". A piece may be a partial UTF-8 sequence (byte tokens).
  // Out-of-range ids render as "".
  std::string TokenToPiece(int32_t id, bool special) const;
  // Concatenation of TokenToPiece(id, special) over `ids`.
  std::string Decode(const std::vector<int32_t>& ids, bool special) const;
  // llama_detokenize(ids, remove_special, unparse_special): like Decode, but
  // drops the leading space of the first piece when the vocabulary adds a
  // space prefix, with remove_special drops a leading BOS / trailing EOS
  // that add_special would have added, and for BPE vocabularies applies
  // llama.cpp's clean-up of spaces before punctuation.
  std::string Detokenize(const std::vector<int32_t>& ids, bool remove_special,
                         bool unparse_special) const;

  VocabKind kind() const;
  int32_t n_vocab() const;
  int32_t bos() const;  // -1 if none
  int32_t eos() const;
  int32_t unk() const;
  int32_t pad() const;
  int32_t eot() const;
  bool add_bos() const;
  bool add_eos() const;
  bool add_space_prefix() const;
  // End of generation: EOS, EOT/EOM, and tokens such as <|eot_id|>,
  // <|im_end|>, <|endoftext|>, <|end|>, <end_of_turn> when present.
  bool IsEog(int32_t id) const;
  bool IsControl(int32_t id) const;
  bool IsByte(int32_t id) const;
  uint32_t Attr(int32_t id) const;  // TokenAttr bits; 0 if out of range
  float Score(int32_t id) const;
  // The raw vocabulary text (SPM: "▁" for spaces; BPE: byte-mapped). Empty
  // string for out-of-range ids.
  const std::string& TokenText(int32_t id) const;
  // Exact-text lookup in the vocabulary; -1 if absent.
  int32_t TextToToken(std::string_view text) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  // Encode's body; `continues`: the text follows other text (no space prefix).
  Result<std::vector<int32_t>> EncodeText(std::string_view text, bool add_special, bool parse_special,
                                          const ByteRanges& text_only, bool continues) const;
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace kvx::model
