// Unit tests for Tokenizer on tiny in-memory vocabularies (no shared data).
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/tokenizer_internal.h"

namespace kvx::model {
namespace {

constexpr int32_t kNormal = static_cast<int32_t>(TokenType::kNormal);
constexpr int32_t kUnknown = static_cast<int32_t>(TokenType::kUnknown);
constexpr int32_t kControl = static_cast<int32_t>(TokenType::kControl);
constexpr int32_t kUserDefined = static_cast<int32_t>(TokenType::kUserDefined);
constexpr int32_t kByte = static_cast<int32_t>(TokenType::kByte);

// ---- SPM ----

struct SpmBuilder {
  TokenizerVocab v;
  SpmBuilder() {
    Add("<unk>", 0, kUnknown);
    Add("<s>", 0, kControl);
    Add("</s>", 0, kControl);
  }
  int32_t Add(const std::string& text, float score = 0, int32_t type = kNormal) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.token_types.push_back(type);
    return static_cast<int32_t>(v.tokens.size() - 1);
  }
  void AddBytes() {
    char buf[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      Add(buf, 0, kByte);
    }
  }
  std::unique_ptr<Tokenizer> Build() {
    auto t = Tokenizer::FromVocab(v);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }
};

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view text, bool add_special = false,
                         bool parse_special = false) {
  auto r = t.Encode(text, add_special, parse_special);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<int32_t>{};
}

const char* kSp = "\xE2\x96\x81";  // ▁

TEST(TokenizerSpm, DefaultsAndEmptyInput) {
  SpmBuilder b;
  b.Add(kSp);
  auto t = b.Build();
  EXPECT_EQ(t->kind(), VocabKind::kSpm);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(t->unk(), 0);
  EXPECT_TRUE(t->add_bos());
  EXPECT_FALSE(t->add_eos());
  EXPECT_TRUE(t->add_space_prefix());
  EXPECT_EQ(Enc(*t, "", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(Enc(*t, "", false), (std::vector<int32_t>{}));
  EXPECT_TRUE(t->IsEog(2));
  EXPECT_FALSE(t->IsEog(1));
  EXPECT_TRUE(t->IsControl(1));
  EXPECT_FALSE(t->IsEog(-1));
  EXPECT_FALSE(t->IsEog(1000));
}

TEST(TokenizerSpm, SpacePrefixAndSpacesNeverMerged) {
  SpmBuilder b;
  const int32_t sp = b.Add(kSp);
  const int32_t a = b.Add("a");
  const int32_t sp_a = b.Add(std::string(kSp) + "a", -1);
  auto t = b.Build();
  EXPECT_EQ(Enc(*t, "a"), (std::vector<int32_t>{sp_a}));
  EXPECT_EQ(Enc(*t, "a a"), (std::vector<int32_t>{sp_a, sp_a}));
  EXPECT_EQ(Enc(*t, " a"), (std::vector<int32_t>{sp, sp_a}));
  EXPECT_EQ(Enc(*t, "aa", true), (std::vector<int32_t>{1, sp_a, a}));
}

TEST(TokenizerSpm, HighestScoreMergesFirst) {
  SpmBuilder b;
  b.Add(kSp);
  const int32_t a = b.Add("a");
  b.Add("b");
  const int32_t c = b.Add("c");
  const int32_t ab = b.Add("ab", -2.0f);
  const int32_t bc = b.Add("bc", -1.0f);
  b.v.add_space_prefix = false;
  auto t2 = Tokenizer::FromVocab(b.v);
  ASSERT_TRUE(t2.ok());
  // "bc" scores higher than "ab", so b pairs with c.
  EXPECT_EQ(Enc(**t2, "abc"), (std::vector<int32_t>{a, bc}));
  // Raising "ab" above "bc" flips it.
  b.v.scores[ab] = 0.0f;
  auto t3 = Tokenizer::FromVocab(b.v);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(Enc(**t3, "abc"), (std::vector<int32_t>{ab, c}));
}

TEST(TokenizerSpm, TiesGoToTheLeftmostPair) {
  SpmBuilder b;
  b.v.add_space_prefix = false;
  const int32_t a = b.Add("a");
  const int32_t aa = b.Add("aa", -1.0f);
  auto t = b.Build();
  EXPECT_EQ(Enc(*t, "aaa"), (std::vector<int32_t>{aa, a}));
  EXPECT_EQ(Enc(*t, "aaaaa"), (std::vector<int32_t>{aa, aa, a}));
}

TEST(TokenizerSpm, ByteFallback) {
  SpmBuilder b;
  b.AddBytes();  // ids 3..258
  const int32_t sp = b.Add(kSp);
  auto t = b.Build();
  // "é" = C3 A9 -> <0xC3> <0xA9>.
  EXPECT_EQ(Enc(*t, "\xC3\xA9"), (std::vector<int32_t>{sp, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_TRUE(t->IsByte(3 + 0xC3));
  EXPECT_EQ(t->TokenToPiece(3 + 0x41, true), "A");
  EXPECT_EQ(t->TokenToPiece(3 + 0xC3, false), "\xC3");
  EXPECT_EQ(t->Decode(Enc(*t, "\xC3\xA9 x"), true), " \xC3\xA9 x");
}

TEST(TokenizerSpm, NoByteTokensGivesFusedUnknown) {
  SpmBuilder b;
  const int32_t sp = b.Add(kSp);
  const int32_t x = b.Add("x");
  auto t = b.Build();
  // Each run of unrepresentable characters becomes one <unk> (HF fuse_unk).
  EXPECT_EQ(Enc(*t, "x\t\tx"), (std::vector<int32_t>{sp, x, 0, x}));
  EXPECT_EQ(Enc(*t, "\xE6\x97\xA5\xE6\x9C\xAC x\t"), (std::vector<int32_t>{sp, 0, sp, x, 0}));
}

TEST(TokenizerSpm, SingleByteTextFallback) {
  // No <0xNN> tokens, but the raw one-byte text "\n" is a token (656K style).
  SpmBuilder b;
  const int32_t sp = b.Add(kSp);
  const int32_t nl = b.Add("\n");
  auto t = b.Build();
  EXPECT_EQ(Enc(*t, "\n\n"), (std::vector<int32_t>{sp, nl, nl}));
  EXPECT_EQ(t->TokenToPiece(nl, false), "\n");
}

TEST(TokenizerSpm, ParseSpecial) {
  SpmBuilder b;
  b.AddBytes();
  const int32_t sp = b.Add(kSp);
  const int32_t hi = b.Add(std::string(kSp) + "hi", -1);
  b.Add("hi", -2);  // SPM merges pairwise: "▁hi" needs "hi" (or "▁h")
  auto t = b.Build();
  // Without parse_special "<s>" is plain text (spelled with byte tokens here).
  auto plain = Enc(*t, "<s>hi");
  EXPECT_EQ(plain.front(), sp);
  EXPECT_EQ(plain.size(), 5u);  // ▁ < s > hi
  // With it, <s> is BOS and the fragment after it gets its own ▁ prefix.
  EXPECT_EQ(Enc(*t, "<s>hi", false, true), (std::vector<int32_t>{1, hi}));
  EXPECT_EQ(Enc(*t, "hi</s>hi", true, true), (std::vector<int32_t>{1, hi, 2, hi}));
  EXPECT_EQ(Enc(*t, "<unk>", false, true), (std::vector<int32_t>{0}));
  EXPECT_EQ(Enc(*t, "<s></s>", false, true), (std::vector<int32_t>{1, 2}));
}

TEST(TokenizerSpm, UserDefinedTokensAlwaysSplitLongestFirst) {
  SpmBuilder b;
  b.AddBytes();
  const int32_t sp = b.Add(kSp);
  const int32_t u1 = b.Add("<tag>", 0, kUserDefined);
  const int32_t u2 = b.Add("<tag>x", 0, kUserDefined);
  auto t = b.Build();
  // Only raw-text fragments get the space prefix.
  EXPECT_EQ(Enc(*t, "<tag>"), (std::vector<int32_t>{u1}));
  EXPECT_EQ(Enc(*t, "<tag>x<tag>"), (std::vector<int32_t>{u2, u1}));
  EXPECT_EQ(Enc(*t, " <tag>"), (std::vector<int32_t>{sp, sp, u1}));
  EXPECT_EQ(t->TokenToPiece(u1, false), "<tag>");  // user-defined pieces always render
}

// Ranges read as text: no control or user-defined token is cut out of
// them or across their edges; outside them, parse_special as asked; with no
// ranges, Encode's ids.
TEST(TokenizerSpm, TextOnlyRangesNeverBecomeSpecialTokens) {
  SpmBuilder b;
  b.AddBytes();
  b.Add(kSp);
  const int32_t tag = b.Add("<tag>", 0, kUserDefined);
  auto t = b.Build();
  auto enc = [&](std::string_view text, const Tokenizer::ByteRanges& text_only) {
    auto r = t->Encode(text, false, true, text_only);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<int32_t>{};
  };
  auto count = [](const std::vector<int32_t>& ids, int32_t id) { return std::count(ids.begin(), ids.end(), id); };
  // <s> at 0, a at 3, <tag> at 4, </s> at 9, b at 13, <tag> at 14.
  const std::string text = "<s>a<tag></s>b<tag>";
  EXPECT_EQ(enc(text, {}), Enc(*t, text, false, true));
  const auto all = enc(text, {{0, text.size()}});
  EXPECT_EQ(count(all, 1) + count(all, 2) + count(all, tag), 0);
  // Only the middle is text: the first <s> and the last <tag> stay tokens.
  const auto middle = enc(text, {{3, 14}});
  EXPECT_EQ(middle.front(), 1);
  EXPECT_EQ(middle.back(), tag);
  EXPECT_EQ(count(middle, 1), 1);
  EXPECT_EQ(count(middle, 2), 0);
  EXPECT_EQ(count(middle, tag), 1);
  // A range that only touches a token's first or last byte keeps it text.
  EXPECT_EQ(count(enc(text, {{4, 5}}), tag), 1);  // the first <tag>'s '<'
  EXPECT_EQ(count(enc(text, {{8, 9}}), tag), 1);  // its '>'
  EXPECT_EQ(count(enc(text, {{9, 10}}), 2), 0);   // </s>'s '<'
}

TEST(TokenizerSpm, PiecesDecodeAndDetokenize) {
  SpmBuilder b;
  const int32_t sp = b.Add(kSp);
  const int32_t hi = b.Add(std::string(kSp) + "hi", -1);
  const int32_t h = b.Add("h"), i = b.Add("i");
  auto t = b.Build();
  EXPECT_EQ(t->TokenToPiece(hi, true), " hi");
  EXPECT_EQ(t->TokenToPiece(1, true), "<s>");
  EXPECT_EQ(t->TokenToPiece(1, false), "");
  EXPECT_EQ(t->TokenToPiece(0, true), "<unk>");
  EXPECT_EQ(t->TokenToPiece(0, false), "");
  EXPECT_EQ(t->TokenToPiece(-5, true), "");
  EXPECT_EQ(t->TokenToPiece(9999, true), "");
  EXPECT_EQ(t->TokenText(hi), std::string(kSp) + "hi");
  EXPECT_EQ(t->TokenText(9999), "");
  EXPECT_EQ(t->TextToToken("h"), h);
  EXPECT_EQ(t->TextToToken("zz"), -1);
  const std::vector<int32_t> ids = {1, hi, sp, h, i, 2};
  EXPECT_EQ(t->Decode(ids, true), "<s> hi hi</s>");
  EXPECT_EQ(t->Decode(ids, false), " hi hi");
  // llama_detokenize drops the first piece's leading space only when no BOS
  // precedes it (or BOS was removed as special).
  EXPECT_EQ(t->Detokenize({hi, sp, h, i}, false, false), "hi hi");
  EXPECT_EQ(t->Detokenize(ids, true, false), " hi hi");
  EXPECT_EQ(t->Detokenize(ids, false, true), "<s> hi hi</s>");
}

TEST(TokenizerSpm, AddEosAndExplicitIds) {
  SpmBuilder b;
  b.Add(kSp);
  const int32_t end = b.Add("<end>", 0, kControl);
  b.v.add_eos = true;
  b.v.eos_id = end;
  b.v.bos_id = int64_t{4294967295};  // out of range: keeps the default (llama.cpp)
  auto t = b.Build();
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), end);
  EXPECT_TRUE(t->IsEog(end));
  EXPECT_EQ(Enc(*t, "", true), (std::vector<int32_t>{1, end}));
}

TEST(TokenizerSpm, EogTokensDetectedByText) {
  SpmBuilder b;
  b.Add(kSp);
  const int32_t im_end = b.Add("<|im_end|>", 0, kNormal);  // forced to control
  const int32_t eot = b.Add("<|eot_id|>", 0, kControl);
  auto t = b.Build();
  EXPECT_TRUE(t->IsEog(im_end));
  EXPECT_TRUE(t->IsControl(im_end));
  EXPECT_TRUE(t->IsEog(eot));
  EXPECT_EQ(t->eot(), eot);
  EXPECT_TRUE(t->IsEog(2));
}

TEST(TokenizerSpm, InvalidUtf8IsAnError) {
  SpmBuilder b;
  b.AddBytes();
  b.Add(kSp);
  auto t = b.Build();
  struct Case {
    std::string text;
    size_t offset;
  };
  for (const Case& c : {Case{"ab\xFF", 2}, Case{"\xC3", 0}, Case{"ok \xE2\x82", 3},
                        Case{"\xC0\x80", 0}, Case{"x\xED\xA0\x80", 1}, Case{"\xF4\x90\x80\x80", 0},
                        Case{"a\x80", 1}, Case{"\xE0\x80\xAF", 0}}) {
    auto r = t->Encode(c.text, true, false);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("byte offset " + std::to_string(c.offset)),
              std::string::npos)
        << r.status().message();
  }
  // Valid edge cases: NUL, 4-byte characters, U+FFFF.
  EXPECT_TRUE(t->Encode(std::string("a\0b", 3), false, false).ok());
  EXPECT_TRUE(t->Encode("\xF0\x9F\x98\x80\xEF\xBF\xBF", false, false).ok());
}

TEST(TokenizerSpm, LongInputIsNotQuadratic) {
  SpmBuilder b;
  b.AddBytes();
  b.Add(kSp);
  b.Add("a");
  b.Add("b");
  b.Add("ab", -1);
  b.Add(std::string(kSp) + "ab", -2);
  auto t = b.Build();
  // No newline: the whole text is one merge region (one heap).
  auto best_seconds = [&](size_t bytes) {
    std::string text;
    while (text.size() < bytes) text += "ab ab aab ";
    double best = 1e9;
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      auto ids = t->Encode(text, true, false);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_TRUE(ids.ok());
      EXPECT_GT(ids->size(), bytes / 4);
    }
    return best;
  };
  const double small = best_seconds(100'000);
  const double large = best_seconds(400'000);
  // 4x the input: ~4.5x the time for n log n, 16x if quadratic.
  EXPECT_LT(large, 10 * small + 0.01) << "100 KB: " << small << " s, 400 KB: " << large << " s";
}

TEST(TokenizerSpm, ConcurrentEncodeIsSafe) {
  SpmBuilder b;
  b.AddBytes();
  b.Add(kSp);
  b.Add("ab", -1);
  auto t = b.Build();
  const std::string text = "ab <s> ab \xC3\xA9 ab";
  const auto want = Enc(*t, text, true, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      bool all = true;
      for (int r = 0; r < 200; ++r) all &= (*t->Encode(text, true, true) == want);
      ok[k] = all;
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(ok[k]);
}

TEST(TokenizerVocabErrors, UnsupportedAndInconsistent) {
  TokenizerVocab v;
  v.tokens = {"a"};
  v.model = "bert";
  auto r = Tokenizer::FromVocab(v);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos) << r.status().message();

  v.model = "gpt2";
  v.pre = "chameleon";
  v.merges = {"a a"};
  r = Tokenizer::FromVocab(v);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("llama-bpe"), std::string::npos) << r.status().message();

  v.pre = "gpt-2";
  v.merges.clear();
  r = Tokenizer::FromVocab(v);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);

  v.model = "llama";
  v.scores = {0.0f, 1.0f};
  r = Tokenizer::FromVocab(v);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  v.scores.clear();
  v.tokens.clear();
  r = Tokenizer::FromVocab(v);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// ---- byte-level BPE ----

// GPT-2's byte -> printable code point table, spelled out independently.
std::string ByteChar(int b) {
  auto printable = [](int c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int k = 0; k < b; ++k) cp += !printable(k);
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct BpeBuilder {
  TokenizerVocab v;
  BpeBuilder() {
    v.model = "gpt2";
    v.pre = "gpt-2";
    for (int b = 0; b < 256; ++b) Add(ByteChar(b));
  }
  int32_t Add(const std::string& text, int32_t type = kNormal) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
    return static_cast<int32_t>(v.tokens.size() - 1);
  }
  int32_t Id(const std::string& text) const {
    for (size_t i = v.tokens.size(); i-- > 0;) {
      if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  }
  std::unique_ptr<Tokenizer> Build() {
    auto t = Tokenizer::FromVocab(v);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
};

const std::string kG = "\xC4\xA0";  // Ġ = the image of ' '

TEST(TokenizerBpe, ByteTableSpotChecks) {
  EXPECT_EQ(ByteChar(' '), kG);
  EXPECT_EQ(ByteChar('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(ByteChar('a'), "a");
}

TEST(TokenizerBpe, MergesByRank) {
  BpeBuilder b;
  b.v.merges = {kG + " t", "h e", kG + "t he", "l l"};
  for (const char* t : {"he", "ll"}) b.Add(t);
  b.Add(kG + "t");
  const int32_t the = b.Add(kG + "the");
  auto t = b.Build();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), VocabKind::kBpe);
  EXPECT_FALSE(t->add_bos());
  EXPECT_FALSE(t->add_space_prefix());
  EXPECT_EQ(Enc(*t, "hello the"),
            (std::vector<int32_t>{b.Id("he"), b.Id("ll"), b.Id("o"), the}));
  EXPECT_EQ(t->TokenToPiece(the, false), " the");
  EXPECT_EQ(t->Decode(Enc(*t, "hello the\n\t\xC3\xA9!"), false), "hello the\n\t\xC3\xA9!");
  EXPECT_EQ(Enc(*t, ""), std::vector<int32_t>{});
}

TEST(TokenizerBpe, PreTokenizerSplitsWhitespaceRuns) {
  BpeBuilder b;
  b.v.merges = {kG + " " + kG, kG + " b"};
  const int32_t gg = b.Add(kG + kG);
  const int32_t gb = b.Add(kG + "b");
  auto t = b.Build();
  ASSERT_NE(t, nullptr);
  // gpt2: "a", " ", " b" -- the two spaces never meet in one word.
  EXPECT_EQ(Enc(*t, "a  b"), (std::vector<int32_t>{b.Id("a"), b.Id(kG), gb}));
  // Trailing whitespace is one word: "a", "  ".
  EXPECT_EQ(Enc(*t, "a  "), (std::vector<int32_t>{b.Id("a"), gg}));
}

TEST(TokenizerBpe, Llama3DigitsAndIgnoreMerges) {
  BpeBuilder b;
  b.v.merges = {"3 4", "1 2", "12 3", "4 5", "h e", "l l"};
  for (const char* s : {"34", "12", "123", "45", "he", "ll"}) b.Add(s);
  const int32_t hello = b.Add("hello");  // no merge path builds it
  b.v.pre = "gpt-2";
  auto gpt2 = b.Build();
  b.v.pre = "llama-bpe";
  auto llama3 = b.Build();
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(Enc(*gpt2, "12345"), (std::vector<int32_t>{b.Id("12"), b.Id("34"), b.Id("5")}));
  EXPECT_EQ(Enc(*llama3, "12345"), (std::vector<int32_t>{b.Id("123"), b.Id("45")}));
  EXPECT_EQ(Enc(*gpt2, "hello"), (std::vector<int32_t>{b.Id("he"), b.Id("ll"), b.Id("o")}));
  EXPECT_EQ(Enc(*llama3, "hello"), (std::vector<int32_t>{hello}));
  EXPECT_TRUE(llama3->add_bos());  // llama3-style pre defaults to BOS
}

TEST(TokenizerBpe, SpecialTokensAndCleanSpaces) {
  BpeBuilder b;
  b.v.merges = {"a b"};
  const int32_t eot = b.Add("<|endoftext|>", kControl);
  b.v.eos_id = eot;
  b.v.bos_id = eot;
  auto t = b.Build();
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->IsEog(eot));
  EXPECT_EQ(Enc(*t, "x<|endoftext|>", true, true), (std::vector<int32_t>{b.Id("x"), eot}));
  EXPECT_EQ(Enc(*t, "<|endoftext|>", false, false).size(), 13u);
  // llama_detokenize's clean-up for BPE: " ," and " 's" lose the space.
  EXPECT_EQ(t->Detokenize(Enc(*t, "a , it 's"), false, false), "a, it's");
  EXPECT_EQ(t->Decode(Enc(*t, "a , it 's"), false), "a , it 's");
}

std::vector<std::string> Split(const std::string& pre, const std::string& text) {
  auto info = NormalizeBpePre(pre);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  auto p = BpePreTokenizer::Create(info->regex_set);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::vector<std::string> out;
  for (std::string_view w : (*p)->Split(text)) out.emplace_back(w);
  return out;
}

using Words = std::vector<std::string>;

TEST(TokenizerBpe, PreTokenizerRegexes) {
  // GPT-2.
  EXPECT_EQ(Split("gpt-2", "  Hello world's 123!!\n"),
            (Words{" ", " Hello", " world", "'s", " 123", "!!", "\n"}));
  EXPECT_EQ(Split("gpt-2", "a \n\n b"), (Words{"a", " \n\n", " b"}));
  // Llama 3: letters may take one leading non-letter, digits go in threes,
  // newline runs are their own words.
  EXPECT_EQ(Split("llama-bpe", "Hello, y'all! How are you \xF0\x9F\x98\x81 ?"),
            (Words{"Hello", ",", " y", "'all", "!", " How", " are", " you", " \xF0\x9F\x98\x81",
                   " ?"}));
  EXPECT_EQ(Split("llama-bpe", "1314151 I'M"), (Words{"131", "415", "1", " I", "'M"}));
  EXPECT_EQ(Split("llama-bpe", "a\n\n b  c"), (Words{"a", "\n\n", " b", " ", " c"}));
  EXPECT_EQ(Split("llama-bpe", "\xE6\x88\x91\xE6\x83\xB3" "apple"),
            (Words{"\xE6\x88\x91\xE6\x83\xB3" "apple"}));
  // Qwen2: single digits.
  EXPECT_EQ(Split("qwen2", "x1314"), (Words{"x", "1", "3", "1", "4"}));
  // SmolLM / StarCoder: single digits, then GPT-2.
  EXPECT_EQ(Split("smollm", "ab 12"), (Words{"ab", " ", "1", "2"}));
  // llama.cpp's default list: punctuation runs first, then GPT-2, then
  // digit runs cut in threes.
  EXPECT_EQ(Split("default", "Hi, you!! 12345"), (Words{"Hi", ",", " you", "!!", " ", "123", "45"}));
  EXPECT_EQ(Split("default", ""), Words{});
}

// ---- GGUF round trip ----

TEST(TokenizerGguf, FromGgufReadsMetadata) {
  gguf::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", kSp, std::string(kSp) + "hi", "h", "i", "hi"});
  w.SetFloat32Array("tokenizer.ggml.scores", {0, 0, 0, 0, -1, 0, 0, -2});
  w.SetInt32Array("tokenizer.ggml.token_type",
                  {kUnknown, kControl, kControl, kNormal, kNormal, kNormal, kNormal, kNormal});
  w.SetUint32("tokenizer.ggml.bos_token_id", 1);
  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetUint32("tokenizer.ggml.padding_token_id", 4294967295u);
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  const auto buf = w.WriteToBuffer();
  auto f = gguf::GgufFile::Parse(buf.data(), buf.size(), "tok.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto t = Tokenizer::FromGguf(**f);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->n_vocab(), 8);
  EXPECT_FALSE((*t)->add_bos());
  EXPECT_EQ((*t)->pad(), -1);
  EXPECT_EQ(Enc(**t, "hi", true), (std::vector<int32_t>{4}));

  w.SetString("tokenizer.ggml.model", "t5");
  const auto buf2 = w.WriteToBuffer();
  auto f2 = gguf::GgufFile::Parse(buf2.data(), buf2.size(), "t5.gguf");
  ASSERT_TRUE(f2.ok());
  auto t2 = Tokenizer::FromGguf(**f2);
  ASSERT_FALSE(t2.ok());
  EXPECT_EQ(t2.status().code(), StatusCode::kUnimplemented);

  gguf::GgufWriter empty;
  empty.SetString("general.architecture", "llama");
  const auto buf3 = empty.WriteToBuffer();
  auto f3 = gguf::GgufFile::Parse(buf3.data(), buf3.size(), "none.gguf");
  ASSERT_TRUE(f3.ok());
  EXPECT_EQ(Tokenizer::FromGguf(**f3).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvx::model
