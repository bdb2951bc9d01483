// Tokenizer: loading from GGUF, vocabulary set-up (attributes, special ids,
// end-of-generation set), the special-token partition, and decoding.
// The encoders themselves live in tokenizer_spm.cc and tokenizer_bpe.cc.
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <utility>

#include "gguf/gguf_file.h"
#include "model/tokenizer_internal.h"
#include "util/printable.h"

namespace kvx::model {
namespace {

constexpr uint32_t kAttrSpecial = kAttrUnknown | kAttrControl;

uint32_t AttrFromType(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kByte: return kAttrByte;
    default: return kAttrUndefined;
  }
}

bool IsAsciiSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// "<0xNN>" -> NN; -1 if `text` is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = text[k];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

// Byte-level BPE token text -> bytes. Code points that are not byte images
// are kept as llama.cpp does ("[UNK_BYTE_0x..]" marker).
std::string DecodeBpeText(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const auto c0 = static_cast<uint8_t>(text[i]);
    const size_t len = std::min(Utf8SeqLen(c0), text.size() - i);
    uint32_t cp = len == 1 ? c0 : (c0 & (0x7F >> len));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    const int b = BpeCodepointToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out += "[UNK_BYTE_0x";
      char hex[3];
      for (size_t k = 0; k < len; ++k) {
        std::snprintf(hex, sizeof(hex), "%02x", static_cast<uint8_t>(text[i + k]));
        out += hex;
      }
      out += text + "]";
    }
    i += len;
  }
  return out;
}

std::string ComputePiece(const TokenizerImpl& v, int32_t id) {
  const auto& t = v.tokens[id];
  if (t.attr & (kAttrSpecial | kAttrUserDefined)) return t.text;
  if (v.kind == VocabKind::kSpm) {
    if (t.attr & kAttrNormal) return UnescapeSpmSpaces(t.text);
    if (t.attr & kAttrByte) {
      const int b = ParseByteToken(t.text);
      return b >= 0 ? std::string(1, static_cast<char>(b)) : std::string();
    }
    return "";
  }
  if (t.attr & kAttrNormal) return DecodeBpeText(t.text);
  return "";
}

// Texts llama.cpp treats as end-of-generation tokens when present.
constexpr const char* kEogTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                     "<|endoftext|>", "<|eom_id|>", "<EOT>"};
constexpr const char* kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                     "<|endoftext|>", "<EOT>",
                                     // Split so the hex escape ends before "end".
                                     ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>")};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<PAD>"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>"};

}  // namespace

Result<std::unique_ptr<TokenizerImpl>> BuildTokenizerImpl(TokenizerVocab vocab) {
  auto v = std::make_unique<TokenizerImpl>();
  BpePreInfo pre_info;
  if (vocab.model == "llama") {
    v->kind = VocabKind::kSpm;
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
    v->add_space_prefix = true;
    v->add_bos = true;
  } else if (vocab.model == "gpt2") {
    v->kind = VocabKind::kBpe;
    KVX_ASSIGN_OR_RETURN(pre_info, NormalizeBpePre(vocab.pre));
    v->bos = v->eos = 11;  // llama.cpp's (odd) BPE defaults
    v->clean_spaces = pre_info.clean_spaces;
    v->ignore_merges = pre_info.ignore_merges;
    v->add_bos = pre_info.default_add_bos;
  } else {
    return Unimplemented("tokenizer model " + QuotePrintable(vocab.model) +
                         " (tokenizer.ggml.model) is not supported; supported: llama (SentencePiece), "
                         "gpt2 (byte-level BPE)");
  }
  if (vocab.add_space_prefix) v->add_space_prefix = *vocab.add_space_prefix;

  const size_t n = vocab.tokens.size();
  if (n == 0) return InvalidArgument("tokenizer vocabulary (tokenizer.ggml.tokens) is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("tokenizer vocabulary has too many tokens: " + std::to_string(n));
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return InvalidArgument("tokenizer.ggml.scores has " + std::to_string(vocab.scores.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return InvalidArgument("tokenizer.ggml.token_type has " + std::to_string(vocab.token_types.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  const auto n32 = static_cast<int32_t>(n);
  for (int32_t* id : {&v->bos, &v->eos, &v->unk}) {
    if (*id >= n32) *id = -1;
  }

  v->tokens.resize(n);
  v->token_to_id.reserve(n);
  for (int32_t i = 0; i < n32; ++i) {
    auto& t = v->tokens[i];
    t.text = std::move(vocab.tokens[i]);
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    t.score = vocab.scores.empty() ? 0.0f : vocab.scores[i];
    t.attr = vocab.token_types.empty() ? kAttrNormal : AttrFromType(vocab.token_types[i]);
    v->token_to_id[t.text] = i;  // duplicates: the last id wins, as in llama.cpp
    v->max_token_len = std::max(v->max_token_len, t.text.size());
  }

  if (v->kind == VocabKind::kBpe) {
    if (vocab.merges.empty()) {
      return NotFound("byte-level BPE vocabulary has no merges (tokenizer.ggml.merges)");
    }
    v->merge_rank.reserve(vocab.merges.size());
    for (size_t r = 0; r < vocab.merges.size(); ++r) {
      const std::string& m = vocab.merges[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;
      v->merge_rank.emplace(m, static_cast<int32_t>(r));  // first rank wins
    }
    KVX_ASSIGN_OR_RETURN(v->pre, BpePreTokenizer::Create(pre_info.regex_set));
  }

  // Explicit special ids (out-of-range ones keep the default, as llama.cpp).
  auto set_id = [&](const std::optional<int64_t>& src, int32_t* dst) {
    if (src && *src >= 0 && *src < n32) *dst = static_cast<int32_t>(*src);
  };
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  set_id(vocab.bos_id, &v->bos);
  set_id(vocab.eos_id, &v->eos);
  set_id(vocab.unk_id, &v->unk);
  set_id(vocab.pad_id, &v->pad);
  set_id(vocab.sep_id, &v->sep);
  set_id(vocab.eot_id, &v->eot);
  set_id(vocab.eom_id, &v->eom);
  set_id(vocab.fim_pad_id, &fim_pad);
  set_id(vocab.fim_rep_id, &fim_rep);
  set_id(vocab.fim_sep_id, &fim_sep);
  if (vocab.add_bos) v->add_bos = *vocab.add_bos;
  if (vocab.add_eos) v->add_eos = *vocab.add_eos;

  // Recognise EOT/EOM/FIM tokens by their text when the metadata does not
  // name them; such tokens are forced to control type (llama.cpp does too).
  auto detect = [&](int32_t* dst, auto&& texts) {
    if (*dst >= 0) return;
    for (const char* text : texts) {
      const int32_t id = v->Find(text);
      if (id >= 0) {
        *dst = id;
        if (!(v->tokens[id].attr & kAttrControl)) v->tokens[id].attr = kAttrControl;
        return;
      }
    }
  };
  detect(&v->eot, kEotTexts);
  detect(&v->eom, std::initializer_list<const char*>{"<|eom_id|>"});
  detect(&fim_pad, kFimPadTexts);
  detect(&fim_rep, kFimRepTexts);
  detect(&fim_sep, kFimSepTexts);

  v->is_eog.assign(n, 0);
  for (int32_t id : {fim_pad, fim_rep, fim_sep, v->eos, v->eot, v->eom}) {
    if (id >= 0) v->is_eog[id] = 1;
  }
  for (const char* text : kEogTexts) {
    const int32_t id = v->Find(text);
    if (id < 0) continue;
    v->is_eog[id] = 1;
    if (!(v->tokens[id].attr & kAttrControl)) v->tokens[id].attr = kAttrControl;
  }

  for (int32_t id = 0; id < n32; ++id) {
    if (v->tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      v->special_tokens.push_back(id);
    }
  }
  std::stable_sort(v->special_tokens.begin(), v->special_tokens.end(), [&](int32_t a, int32_t b) {
    return v->tokens[a].text.size() > v->tokens[b].text.size();
  });

  std::fill(std::begin(v->spm_isolated), std::end(v->spm_isolated), true);
  for (const auto& t : v->tokens) {
    size_t n_chars = 0;
    for (size_t i = 0; i < t.text.size(); i += Utf8SeqLen(static_cast<uint8_t>(t.text[i]))) ++n_chars;
    if (n_chars < 2) continue;
    for (char c : t.text) {
      if (static_cast<uint8_t>(c) < 0x80) v->spm_isolated[static_cast<uint8_t>(c)] = false;
    }
  }
  for (int b = 0; b < 256; ++b) v->byte_token[b] = -1;
  if (v->kind == VocabKind::kSpm) {
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      int32_t id = v->Find(hex);
      if (id < 0) id = v->Find(std::string(1, static_cast<char>(b)));
      v->byte_token[b] = id;
    }
  }

  v->pieces.resize(n);
  for (int32_t id = 0; id < n32; ++id) v->pieces[id] = ComputePiece(*v, id);

  // Phi-3: its special tokens swallow the whitespace to their right
  // (llama.cpp sets these flags by model name).
  std::string name = vocab.model_name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : v->special_tokens) v->tokens[id].attr |= kAttrRstrip;
    if (int32_t id = v->Find("</s>"); id >= 0) v->tokens[id].attr |= kAttrRstrip;
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = v->Find(text); id >= 0) v->tokens[id].attr &= ~kAttrRstrip;
    }
  }
  return v;
}

// ---- Tokenizer ----

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  KVX_ASSIGN_OR_RETURN(auto impl, BuildTokenizerImpl(std::move(vocab)));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& f) {
  TokenizerVocab vocab;
  if (!f.Has("tokenizer.ggml.model")) {
    return NotFound(QuotePrintable(f.name(), 4096) + " has no tokenizer (tokenizer.ggml.model is missing)");
  }
  KVX_ASSIGN_OR_RETURN(vocab.model, f.GetString("tokenizer.ggml.model"));
  KVX_ASSIGN_OR_RETURN(vocab.pre, f.GetStringOr("tokenizer.ggml.pre", ""));
  KVX_ASSIGN_OR_RETURN(vocab.model_name, f.GetStringOr("general.name", ""));
  KVX_ASSIGN_OR_RETURN(vocab.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (f.Has("tokenizer.ggml.scores")) {
    KVX_ASSIGN_OR_RETURN(auto scores, f.GetFloatArray("tokenizer.ggml.scores"));
    vocab.scores.assign(scores.begin(), scores.end());  // stored as f32: exact
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    KVX_ASSIGN_OR_RETURN(auto types, f.GetIntArray("tokenizer.ggml.token_type"));
    vocab.token_types.reserve(types.size());
    for (int64_t t : types) {
      vocab.token_types.push_back(t < 0 || t > 6 ? 0 : static_cast<int32_t>(t));
    }
  }
  if (f.Has("tokenizer.ggml.merges")) {
    KVX_ASSIGN_OR_RETURN(vocab.merges, f.GetStringArray("tokenizer.ggml.merges"));
  }
  const std::pair<const char*, std::optional<int64_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &vocab.bos_id},
      {"tokenizer.ggml.eos_token_id", &vocab.eos_id},
      {"tokenizer.ggml.unknown_token_id", &vocab.unk_id},
      {"tokenizer.ggml.padding_token_id", &vocab.pad_id},
      {"tokenizer.ggml.seperator_token_id", &vocab.sep_id},
      {"tokenizer.ggml.eot_token_id", &vocab.eot_id},
      {"tokenizer.ggml.eom_token_id", &vocab.eom_id},
      {"tokenizer.ggml.fim_pad_token_id", &vocab.fim_pad_id},
      {"tokenizer.ggml.fim_rep_token_id", &vocab.fim_rep_id},
      {"tokenizer.ggml.fim_sep_token_id", &vocab.fim_sep_id},
  };
  for (const auto& [key, dst] : ids) {
    if (!f.Has(key)) continue;
    KVX_ASSIGN_OR_RETURN(int64_t id, f.GetInt(key));
    *dst = id;
  }
  const std::pair<const char*, std::optional<bool>*> flags[] = {
      {"tokenizer.ggml.add_bos_token", &vocab.add_bos},
      {"tokenizer.ggml.add_eos_token", &vocab.add_eos},
      {"tokenizer.ggml.add_space_prefix", &vocab.add_space_prefix},
  };
  for (const auto& [key, dst] : flags) {
    if (!f.Has(key)) continue;
    KVX_ASSIGN_OR_RETURN(bool b, f.GetBool(key));
    *dst = b;
  }
  auto tok = FromVocab(std::move(vocab));
  if (!tok.ok()) return tok.status().WithContext(QuotePrintable(f.name(), 4096));
  return tok;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special,
                                               bool parse_special) const {
  return Encode(text, add_special, parse_special, ByteRanges());
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special, bool parse_special,
                                               const ByteRanges& text_only) const {
  return EncodeText(text, add_special, parse_special, text_only, /*continues=*/false);
}

Result<std::vector<int32_t>> Tokenizer::EncodeContinuation(std::string_view text, bool parse_special,
                                                           const ByteRanges& text_only) const {
  return EncodeText(text, /*add_special=*/false, parse_special, text_only, /*continues=*/true);
}

Result<std::vector<int32_t>> Tokenizer::EncodeText(std::string_view text, bool add_special, bool parse_special,
                                                   const ByteRanges& text_only, bool continues) const {
  const TokenizerImpl& v = *impl_;
  // Whether [at, at + n) touches a byte of text_only.
  auto in_text_only = [&](size_t at, size_t n) {
    auto it = std::upper_bound(text_only.begin(), text_only.end(), at,
                               [](size_t a, const std::pair<size_t, size_t>& r) { return a < r.second; });
    return it != text_only.end() && it->first < at + n;
  };
  // Symbol offsets are 32-bit and spaces may triple in size when escaped.
  constexpr size_t kMaxText = size_t{1} << 30;
  if (text.size() > kMaxText) {
    return InvalidArgument("input text is too long to tokenize at once (" +
                           std::to_string(text.size()) + " bytes; the limit is 1 GiB); split it");
  }
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<uint8_t>(text[bad]));
    return InvalidArgument("input text is not valid UTF-8: byte " + std::string(byte) +
                           " at byte offset " + std::to_string(bad) +
                           " does not start a valid UTF-8 sequence; convert the text to UTF-8");
  }

  // Special-token partition: each special text (longest first) cuts every
  // raw fragment at its occurrences.
  struct Fragment {
    int32_t token;  // -1: raw text [off, off + len)
    size_t off, len;
  };
  std::vector<Fragment> frags, next;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (int32_t id : v.special_tokens) {
    const auto& tok = v.tokens[id];
    if (!parse_special && (tok.attr & kAttrSpecial)) continue;
    const std::string_view st = tok.text;
    bool any = false;
    next.clear();
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t base = fr.off, len = fr.len, from = 0;
      while (from < len) {
        const size_t rel = text.substr(base, len).find(st, from);
        if (rel == std::string_view::npos) break;
        if (in_text_only(base + rel, st.size())) {
          from = rel + 1;  // text: look further on
          continue;
        }
        any = true;
        size_t left_len = rel;
        if (tok.attr & kAttrLstrip) {
          while (left_len > 0 && IsAsciiSpace(text[base + left_len - 1])) --left_len;
        }
        if (left_len > 0) next.push_back({-1, base, left_len});
        next.push_back({id, 0, 0});
        size_t rbase = base + rel + st.size();
        size_t rlen = len - rel - st.size();
        if (tok.attr & kAttrRstrip) {
          while (rlen > 0 && IsAsciiSpace(text[rbase])) ++rbase, --rlen;
        }
        base = rbase;
        len = rlen;
        from = 0;
      }
      if (len > 0) next.push_back({-1, base, len});
    }
    if (any) frags.swap(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
  if (v.kind == VocabKind::kSpm) {
    bool prev_special = !continues;  // the text's first fragment gets the space prefix
    std::string escaped;
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (v.add_space_prefix && prev_special) escaped += "\xE2\x96\x81";
      for (char c : text.substr(fr.off, fr.len)) {
        if (c == ' ') escaped += "\xE2\x96\x81";
        else escaped.push_back(c);
      }
      SpmEncodeFragment(v, escaped, &out);
      prev_special = false;
    }
  } else {
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) out.push_back(fr.token);
      else BpeEncodeFragment(v, text.substr(fr.off, fr.len), &out);
    }
  }
  if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id, bool special) const {
  if (id < 0 || id >= impl_->n()) return "";
  if (!special && (impl_->tokens[id].attr & kAttrSpecial)) return "";
  return impl_->pieces[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += TokenToPiece(id, special);
  return out;
}

namespace {

// llama.cpp's clean_spaces passes for BPE detokenization.
std::string CleanSpaces(std::string s) {
  if (s.empty()) return s;
  // 1: " ?", " !", " .", " ," lose the space.
  std::string a(1, s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  // 2: " ' " -> "'".
  std::string b(1, a[0]);
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      a[++i] = '\0';  // the space after is skipped (and no longer counts as a space)
    }
    b.push_back(x);
  }
  // 3: " 's", " 'm", " 're", " 've" lose the space.
  std::string c(1, b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (x1 != 't' && x1 != 'd' && i + 2 < b.size()) {
        const char x2 = b[i + 2];
        if ((x1 == 'r' || x1 == 'v') && x2 == 'e') c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

}  // namespace

std::string Tokenizer::Detokenize(const std::vector<int32_t>& ids, bool remove_special,
                                  bool unparse_special) const {
  const TokenizerImpl& v = *impl_;
  size_t begin = 0, end = ids.size();
  bool remove_space = v.add_space_prefix;
  if (remove_special && v.add_bos && end > begin && ids[begin] == v.bos) {
    remove_space = false;
    ++begin;
  }
  if (remove_special && v.add_eos && end > begin && ids[end - 1] == v.eos) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    std::string piece = TokenToPiece(ids[i], unparse_special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  return v.clean_spaces ? CleanSpaces(std::move(out)) : out;
}

VocabKind Tokenizer::kind() const { return impl_->kind; }
int32_t Tokenizer::n_vocab() const { return impl_->n(); }
int32_t Tokenizer::bos() const { return impl_->bos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
int32_t Tokenizer::unk() const { return impl_->unk; }
int32_t Tokenizer::pad() const { return impl_->pad; }
int32_t Tokenizer::eot() const { return impl_->eot; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
bool Tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }

bool Tokenizer::IsEog(int32_t id) const {
  return id >= 0 && id < impl_->n() && impl_->is_eog[id] != 0;
}
bool Tokenizer::IsControl(int32_t id) const { return (Attr(id) & kAttrControl) != 0; }
bool Tokenizer::IsByte(int32_t id) const { return (Attr(id) & kAttrByte) != 0; }
uint32_t Tokenizer::Attr(int32_t id) const {
  return id >= 0 && id < impl_->n() ? impl_->tokens[id].attr : 0;
}
float Tokenizer::Score(int32_t id) const {
  return id >= 0 && id < impl_->n() ? impl_->tokens[id].score : 0.0f;
}
const std::string& Tokenizer::TokenText(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < impl_->n() ? impl_->tokens[id].text : kEmpty;
}
int32_t Tokenizer::TextToToken(std::string_view text) const { return impl_->Find(text); }

}  // namespace kvx::model
