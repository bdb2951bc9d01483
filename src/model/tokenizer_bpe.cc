// Byte-level BPE (GPT-2 style): pre-tokenizer regexes (PCRE2) and the merge
// loop.
//
// Pre-tokenization follows llama.cpp: a vocabulary names a list of regexes
// (tokenizer.ggml.pre); each regex in turn splits every current piece into
// its matches and the unmatched gaps between them (gaps are kept as pieces).
// Every regex sees one piece as its whole subject, so look-aheads such as
// \s+(?!\S) stop at piece boundaries.
//
// Each word's bytes are then mapped to GPT-2's printable code points and
// merged: among adjacent symbol pairs listed in tokenizer.ggml.merges, the
// one with the lowest rank (ties: leftmost) is merged first, repeatedly.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer_internal.h"
#include "util/check.h"
#include "util/printable.h"

namespace kvx::model {
namespace {

// The GPT-2 pattern ('s|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+).
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Llama 3 (case-insensitive contractions spelled out, as llama.cpp does).
constexpr const char* kLlama3Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen2: as Llama 3 but digits one at a time.
constexpr const char* kQwen2Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<const char*> RegexesFor(const std::string& set) {
  if (set == "gpt2") return {kGpt2Regex};
  if (set == "llama3") return {kLlama3Regex};
  if (set == "qwen2") return {kQwen2Regex};
  if (set == "starcoder") return {"\\p{N}", kGpt2Regex};
  // llama.cpp's fallback list for BPE vocabularies without a known pre.
  return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Regex, "\\p{N}+", "[0-9][0-9][0-9]"};
}

struct PreEntry {
  const char* names;  // space-separated tokenizer.ggml.pre values
  BpePreInfo info;
};

const std::vector<PreEntry>& PreTable() {
  static const std::vector<PreEntry> t = {
      {"default", {"default", false, true, false}},
      {"gpt-2 gpt2 phi-2 roberta-bpe mpt olmo jais", {"gpt2", false, true, false}},
      {"llama3 llama-v3 llama-bpe falcon3", {"llama3", true, true, true}},
      {"dbrx smaug-bpe", {"llama3", false, true, false}},
      {"qwen2 deepseek-r1-qwen", {"qwen2", false, false, false}},
      {"stablelm2 megrez", {"qwen2", false, true, false}},
      {"smollm command-r", {"starcoder", false, false, false}},
      {"starcoder refact codeshell exaone minerva-7b", {"starcoder", false, true, false}},
  };
  return t;
}

}  // namespace

Result<BpePreInfo> NormalizeBpePre(const std::string& pre) {
  const std::string key = pre.empty() ? "default" : pre;
  std::string all;
  for (const auto& e : PreTable()) {
    std::string_view names = e.names;
    while (!names.empty()) {
      const size_t sp = names.find(' ');
      const std::string_view name = names.substr(0, sp);
      if (name == key) return e.info;
      if (!all.empty()) all += ", ";
      all += name;
      names = sp == std::string_view::npos ? std::string_view() : names.substr(sp + 1);
    }
  }
  return Unimplemented("BPE pre-tokenizer " + QuotePrintable(pre) +
                       " (tokenizer.ggml.pre) is not supported; supported: " + all);
}

Result<std::unique_ptr<BpePreTokenizer>> BpePreTokenizer::Create(const std::string& regex_set) {
  std::unique_ptr<BpePreTokenizer> p(new BpePreTokenizer());
  for (const char* pattern : RegexesFor(regex_set)) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Internal("cannot compile pre-tokenizer regex '" + std::string(pattern) + "' at " +
                      std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpreter otherwise
    p->codes_.push_back(code);
  }
  return p;
}

BpePreTokenizer::~BpePreTokenizer() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

std::vector<std::string_view> BpePreTokenizer::Split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> pieces;  // (offset, length)
  if (!text.empty()) pieces.emplace_back(0, text.size());
  std::vector<std::pair<size_t, size_t>> next;
  for (void* c : codes_) {
    auto* code = static_cast<pcre2_code*>(c);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    KVX_CHECK(md != nullptr);
    next.clear();
    for (const auto& [start, len] : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + start);
      size_t prev = 0;
      size_t off = 0;
      while (off < len) {
        int rc = pcre2_match(code, subject, len, off, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // JIT resource limits: retry with the interpreter.
          rc = pcre2_match(code, subject, len, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
        }
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  // empty match: step over one character
          off = ms + Utf8SeqLen(static_cast<uint8_t>(text[start + ms]));
          continue;
        }
        if (ms > prev) next.emplace_back(start + prev, ms - prev);
        next.emplace_back(start + ms, me - ms);
        prev = off = me;
      }
      if (prev < len) next.emplace_back(start + prev, len - prev);
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const auto& [start, len] : pieces) words.push_back(text.substr(start, len));
  return words;
}

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  size_t start;
  size_t n;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  size_t size;
};

struct BigramGreater {
  // The queue pops the lowest rank, then the leftmost pair.
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class BpeWordMerger {
 public:
  explicit BpeWordMerger(const TokenizerImpl& v) : v_(v) {}

  // `word` is byte-mapped (GPT-2 code points).
  void Encode(std::string_view word, std::vector<int32_t>* out) {
    if (v_.ignore_merges) {
      const int32_t id = v_.Find(word);
      if (id >= 0) {
        out->push_back(id);
        return;
      }
    }
    word_ = word;
    symbols_.clear();
    queue_ = {};
    for (size_t offs = 0; offs < word.size();) {
      const size_t len = std::min(Utf8SeqLen(static_cast<uint8_t>(word[offs])), word.size() - offs);
      const auto idx = static_cast<int32_t>(symbols_.size());
      symbols_.push_back(Symbol{idx - 1, offs + len == word.size() ? -1 : idx + 1, offs, len});
      offs += len;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) TryAddBigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[b.left];
      Symbol& r = symbols_[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = b.left;
      TryAddBigram(l.prev, b.left);
      TryAddBigram(b.left, l.next);
    }
    for (int32_t i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      const std::string_view piece = word_.substr(symbols_[i].start, symbols_[i].n);
      const int32_t id = v_.Find(piece);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
      // As llama.cpp: try each raw byte of the piece as a token, drop misses.
      for (size_t k = 0; k < piece.size(); ++k) {
        const int32_t b = v_.Find(piece.substr(k, 1));
        if (b >= 0) out->push_back(b);
      }
    }
  }

 private:
  void TryAddBigram(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    key_.assign(word_.substr(l.start, l.n));
    key_.push_back(' ');
    key_.append(word_.substr(r.start, r.n));
    const auto it = v_.merge_rank.find(key_);
    if (it == v_.merge_rank.end()) return;
    queue_.push(Bigram{it->second, left, right, l.n + r.n});
  }

  const TokenizerImpl& v_;
  std::string_view word_;
  std::string key_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue_;
};

}  // namespace

void BpeEncodeFragment(const TokenizerImpl& v, std::string_view text, std::vector<int32_t>* out) {
  KVX_CHECK(v.pre != nullptr);
  BpeWordMerger merger(v);
  std::string mapped;
  for (std::string_view word : v.pre->Split(text)) {
    mapped.clear();
    for (char c : word) mapped += ByteToBpeChar(static_cast<uint8_t>(c));
    merger.Encode(mapped, out);
  }
}

}  // namespace kvx::model
