// A character-level SentencePiece-style vocabulary for tests of prompt
// builders: <unk> <s> </s>, "▁", "\n" and every printable ASCII character,
// so token counts are easy to reason about (one token per character, spaces
// included, plus BOS). Header-only: the tests that use it link the model
// layer, the test-support library does not.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/synthetic_model.h"
#include "model/tokenizer.h"

namespace kvx::testing {

inline std::unique_ptr<model::Tokenizer> CharTokenizer() {
  model::TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "\n"};
  v.token_types = {2, 3, 3, 1, 1};
  for (char c = '!'; c <= '~'; ++c) {
    v.tokens.push_back(std::string(1, c));
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  auto tok = model::Tokenizer::FromVocab(v);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(*tok);
}

// The byte-level BPE vocabulary of kvx's synthetic models (gen-model's),
// with `n_vocab` tokens: ChatML's control tokens included.
inline std::unique_ptr<model::Tokenizer> SyntheticBpeTokenizer(int n_vocab) {
  const model::SyntheticVocab sv = model::MakeSyntheticVocab(n_vocab);
  model::TokenizerVocab v;
  v.model = "gpt2";
  v.pre = "smollm";
  v.tokens = sv.tokens;
  v.token_types = sv.token_types;
  v.merges = sv.merges;
  v.eos_id = sv.eos_id;
  auto tok = model::Tokenizer::FromVocab(v);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// The text of `ids` without BOS and without the space the vocabulary puts in
// front.
inline std::string CharText(const model::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string t = tok.Detokenize(ids, /*remove_special=*/true, /*unparse_special=*/false);
  while (!t.empty() && t.front() == ' ') t.erase(t.begin());
  return t;
}

}  // namespace kvx::testing
