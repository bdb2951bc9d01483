// SentencePiece-style (SPM) encoding of one raw-text fragment.
//
// The fragment (spaces already escaped to "▁") starts as one symbol per
// UTF-8 character. A max-heap holds every adjacent pair whose concatenation
// is a vocabulary token, keyed by that token's score (ties: leftmost pair).
// Popping the best pair merges it and offers the two new neighbour pairs;
// pairs made stale by an earlier merge are recognised by their length and
// skipped. This is O(n log n) in the fragment length and reproduces
// llama.cpp's llm_tokenizer_spm exactly.
//
// A final symbol is always either a vocabulary token (every merge produced
// one) or a single character; a character that is not a token is spelled as
// byte tokens, or, when the vocabulary lacks them, as the unknown token.
#include <algorithm>
#include <vector>

#include "model/tokenizer_internal.h"

namespace kvx::model {
namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;  // byte offset in the fragment
  uint32_t n;      // bytes; 0 once merged into the left neighbour
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // byte length of the merged text when the pair was offered
};

struct BigramLess {
  // The heap pops the greatest: highest score, then lowest left.
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  SpmSession(const TokenizerImpl& v, std::string_view text) : v_(v), text_(text) {}

  void Run(std::vector<int32_t>* out) {
    // An ASCII character that occurs in no multi-character token never takes
    // part in a merge (a merge's result is a token of two or more
    // characters), so no candidate pair ever spans it and the merges on
    // either side of it never see each other: each side can be merged on
    // its own, with the same result and much smaller heaps on long inputs
    // (wiki_head.txt, 200 KB: 55 -> 16 ms with stories260K's vocabulary,
    // 59 -> 32 ms with the probe's; llama.cpp's SPM and phi-3 fixtures and
    // the golden token counts still match).
    size_t seg = 0;
    for (size_t i = 0; i < text_.size(); ++i) {
      const auto c = static_cast<uint8_t>(text_[i]);
      if (c < 0x80 && v_.spm_isolated[c]) {
        RunSegment(seg, i, out);
        RunSegment(i, i + 1, out);
        seg = i + 1;
      }
    }
    RunSegment(seg, text_.size(), out);
  }

 private:
  // Merges and emits text_[begin, end).
  void RunSegment(size_t begin, size_t end, std::vector<int32_t>* out) {
    if (begin >= end) return;
    symbols_.clear();
    for (size_t offs = begin; offs < end;) {
      const size_t len = std::min(Utf8SeqLen(static_cast<uint8_t>(text_[offs])), end - offs);
      const auto idx = static_cast<int32_t>(symbols_.size());
      symbols_.push_back(Symbol{idx - 1, offs + len == end ? -1 : idx + 1,
                                static_cast<uint32_t>(offs), static_cast<uint32_t>(len)});
      offs += len;
    }
    heap_.clear();
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) TryAddBigram(i - 1, i);

    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), BigramLess());
      const Bigram b = heap_.back();
      heap_.pop_back();
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

    for (int32_t i = 0; i != -1; i = symbols_[i].next) {
      const Symbol& s = symbols_[i];
      const std::string_view piece = text_.substr(s.start, s.n);
      const int32_t id = v_.Find(piece);
      if (id >= 0) {
        out->push_back(id);
        prev_was_fallback_unk_ = false;
        continue;
      }
      // Byte fallback: all bytes of the character, or the unknown token.
      bool all_bytes = true;
      for (char c : piece) all_bytes &= v_.byte_token[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : piece) out->push_back(v_.byte_token[static_cast<uint8_t>(c)]);
        prev_was_fallback_unk_ = false;
      } else if (v_.unk >= 0 && !prev_was_fallback_unk_) {
        out->push_back(v_.unk);  // runs of unknown characters fuse into one
        prev_was_fallback_unk_ = true;
      }
    }
  }

  void TryAddBigram(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols_[left].n + symbols_[right].n;
    if (size > v_.max_token_len) return;
    const int32_t id = v_.Find(text_.substr(symbols_[left].start, size));
    if (id < 0) return;
    heap_.push_back(Bigram{v_.tokens[id].score, left, right, size});
    std::push_heap(heap_.begin(), heap_.end(), BigramLess());
  }

  const TokenizerImpl& v_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::vector<Bigram> heap_;  // max-heap under BigramLess
  bool prev_was_fallback_unk_ = false;
};

}  // namespace

void SpmEncodeFragment(const TokenizerImpl& v, std::string_view text, std::vector<int32_t>* out) {
  SpmSession(v, text).Run(out);
}

}  // namespace kvx::model
