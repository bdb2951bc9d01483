// libFuzzer target for the tokenizer on random bytes: a prompt file, a chat
// message or an evaluation text can hold anything, and a model file's
// vocabulary can be anything the GGUF reader accepts.
//
// The first input byte picks what to tokenize with:
//   * bit 7 clear: one of a fixed set of vocabularies: the synthetic
//     byte-level BPE vocabulary kvx gen-model writes, under each supported
//     pre-tokenizer, a generated SentencePiece vocabulary with byte fallback,
//     and (when ../shared is present, or $KVX_SHARED) llama.cpp's vocabulary
//     fixtures and the real models' vocabularies;
//   * bit 7 set: a vocabulary built from the input itself (tokens, merges,
//     scores, token types, special ids, flags), then the rest is encoded with it.
// The second byte sets add_special / parse_special; the rest is the text.
//
// Properties checked (abort on violation):
//   * Encode succeeds on valid UTF-8 and fails with InvalidArgument exactly
//     on invalid UTF-8; a vocabulary is either built or rejected with a
//     status (never a crash);
//   * every id is in [0, n_vocab); decoding (TokenToPiece, Decode,
//     Detokenize) any ids, including out-of-range ones, never crashes;
//   * on the generated vocabularies, where every byte has a token and no
//     user-defined token cuts the text, decoding gives the text back:
//     BPE: Decode(Encode(text)) == text; SPM: the same after the leading
//     space prefix (texts holding U+2581, SPM's escaped space, excepted).
//
// Seed corpus: fuzz/corpus/model_tokenizer/.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/synthetic_model.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

namespace {

using kvx::model::Tokenizer;
using kvx::model::TokenizerVocab;

struct Entry {
  std::string name;
  std::unique_ptr<Tokenizer> tok;
  bool round_trips = false;  // generated: every byte has a token, no user-defined tokens
};

[[noreturn]] void Fail(const std::string& vocab, std::string_view text, const std::string& what) {
  std::fprintf(stderr, "model_tokenizer_fuzz: vocabulary %s, text of %zu bytes: %s\n", vocab.c_str(), text.size(),
               what.c_str());
  std::abort();
}

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then
// pieces of English words with scores favouring longer pieces.
TokenizerVocab MakeSpmVocab() {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    v.tokens.push_back(hex);
    v.token_types.push_back(6);
  }
  const char* kWords[] = {"the", "a", "once", "upon", "time", "there", "was", "little", "girl", "named",
                          "lily", "she", "liked", "to", "play", "in", "park", "with", "her", "friend",
                          "日本", "語", "é", "🙂", "ing", "ed", "er", "on", "an", "th"};
  const std::string space = "\xE2\x96\x81";
  for (const char* w : kWords) {
    const std::string word = w;
    for (const std::string& t : {word, space + word}) {
      if (std::find(v.tokens.begin(), v.tokens.end(), t) != v.tokens.end()) continue;
      v.tokens.push_back(t);
      v.token_types.push_back(1);
    }
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    v.tokens.push_back(std::string(1, c));
    v.token_types.push_back(1);
  }
  v.tokens.push_back(space);
  v.token_types.push_back(1);
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    v.scores.push_back(v.token_types[i] == 1 ? -1000.0f + static_cast<float>(v.tokens[i].size() * 10 + i % 7) : 0.0f);
  }
  return v;
}

std::vector<Entry> MakeFixedVocabs() {
  std::vector<Entry> out;
  for (const char* pre : {"gpt2", "llama-bpe", "qwen2", "smollm", "default"}) {
    const kvx::model::SyntheticVocab sv = kvx::model::MakeSyntheticVocab(1024);
    TokenizerVocab v;
    v.model = "gpt2";
    v.pre = pre;
    v.tokens = sv.tokens;
    v.token_types = sv.token_types;
    v.merges = sv.merges;
    v.eos_id = sv.eos_id;
    v.bos_id = sv.eos_id;  // as kvx gen-model writes (the default 11 is a byte token)
    auto tok = Tokenizer::FromVocab(std::move(v));
    if (!tok.ok()) Fail(pre, "", "the synthetic BPE vocabulary does not load: " + tok.status().ToString());
    out.push_back({std::string("synthetic-bpe-") + pre, std::move(tok).value(), true});
  }
  auto spm = Tokenizer::FromVocab(MakeSpmVocab());
  if (!spm.ok()) Fail("spm", "", "the generated SPM vocabulary does not load: " + spm.status().ToString());
  out.push_back({"generated-spm", std::move(spm).value(), true});

  const char* env = std::getenv("KVX_SHARED");
  const std::string shared = env != nullptr ? env : "../shared";
  for (const char* rel : {"models/vocab/ggml-vocab-gpt-2.gguf", "models/vocab/ggml-vocab-llama-spm.gguf",
                          "models/vocab/ggml-vocab-phi-3.gguf", "models/stories260K/stories260K-F32.gguf",
                          "models/tinystories656K/TinyStories-656K-F32.gguf"}) {
    auto file = kvx::gguf::GgufFile::Open(shared + "/" + rel);
    if (!file.ok()) continue;
    auto tok = Tokenizer::FromGguf(**file);
    if (tok.ok()) out.push_back({rel, std::move(tok).value(), false});
  }
  return out;
}

// A vocabulary from the input: '\n'-separated tokens (a '\t' after a token
// marks a merge "left right" instead), plus ids and flags from a header.
std::unique_ptr<Tokenizer> VocabFromInput(std::string_view* data) {
  if (data->size() < 8) return nullptr;
  const auto* h = reinterpret_cast<const uint8_t*>(data->data());
  TokenizerVocab v;
  static const char* kModels[] = {"llama", "gpt2", "bert", ""};
  static const char* kPres[] = {"", "gpt2", "llama3", "qwen2", "smollm", "starcoder", "dbrx", "unknown-pre"};
  v.model = kModels[h[0] & 3];
  v.pre = kPres[(h[0] >> 2) & 7];
  if (h[1] & 1) v.bos_id = static_cast<int8_t>(h[2]);
  if (h[1] & 2) v.eos_id = static_cast<int8_t>(h[3]);
  if (h[1] & 4) v.unk_id = static_cast<int8_t>(h[4]);
  if (h[1] & 8) v.eot_id = static_cast<int8_t>(h[5]);
  if (h[1] & 16) v.add_bos = (h[6] & 1) != 0;
  if (h[1] & 32) v.add_eos = (h[6] & 2) != 0;
  if (h[1] & 64) v.add_space_prefix = (h[6] & 4) != 0;
  if (h[1] & 128) v.model_name = "phi-3";
  const bool with_scores = (h[7] & 1) != 0, with_types = (h[7] & 2) != 0;
  std::string_view rest = data->substr(8);
  // The vocabulary ends at the first "\n\n"; what follows is the text.
  const size_t end = rest.find("\n\n");
  std::string_view list = rest.substr(0, end);
  *data = end == std::string_view::npos ? std::string_view() : rest.substr(end + 2);
  uint32_t i = 0;
  while (!list.empty()) {
    const size_t nl = list.find('\n');
    std::string_view item = list.substr(0, nl);
    list = nl == std::string_view::npos ? std::string_view() : list.substr(nl + 1);
    if (!item.empty() && item.back() == '\t') {
      item.remove_suffix(1);
      v.merges.emplace_back(item);
      continue;
    }
    v.tokens.emplace_back(item);
    if (with_scores) v.scores.push_back(static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000));
    if (with_types) v.token_types.push_back(static_cast<int32_t>(i * 7 % 8));  // includes invalid 7
    ++i;
  }
  auto tok = Tokenizer::FromVocab(std::move(v));
  if (!tok.ok()) {
    if (tok.status().message().empty()) Fail("from input", "", "a rejected vocabulary has an empty message");
    return nullptr;
  }
  return std::move(tok).value();
}

void Check(const std::string& name, const Tokenizer& tok, std::string_view text, bool add_special, bool parse_special,
           bool round_trips) {
  const bool valid = kvx::model::FindInvalidUtf8(text) == std::string_view::npos;
  auto ids = tok.Encode(text, add_special, parse_special);
  if (!ids.ok()) {
    if (valid || ids.status().code() != kvx::StatusCode::kInvalidArgument) {
      Fail(name, text, "Encode failed: " + ids.status().ToString());
    }
    return;
  }
  if (!valid) Fail(name, text, "Encode accepted invalid UTF-8");
  const int32_t n_vocab = tok.n_vocab();
  for (int32_t id : *ids) {
    if (id < 0 || id >= n_vocab) Fail(name, text, "id " + std::to_string(id) + " out of range");
  }
  const std::string decoded = tok.Decode(*ids, /*special=*/false);
  (void)tok.Decode(*ids, /*special=*/true);
  (void)tok.Detokenize(*ids, true, false);
  (void)tok.Detokenize(*ids, false, true);
  // Ids from the text itself, in and out of range, must decode without crashing.
  std::vector<int32_t> junk;
  for (size_t i = 0; i + 4 <= text.size() && junk.size() < 64; i += 4) {
    int32_t id;
    std::memcpy(&id, text.data() + i, 4);
    junk.push_back(i % 8 == 0 ? id : static_cast<int32_t>(static_cast<uint32_t>(id) % (n_vocab + 8)));
  }
  (void)tok.Decode(junk, true);
  (void)tok.Detokenize(junk, true, true);
  for (int32_t id : junk) (void)tok.IsEog(id), (void)tok.TokenText(id), (void)tok.Score(id);

  if (!round_trips || parse_special) return;
  std::string expected(text);
  if (tok.kind() == kvx::model::VocabKind::kSpm) {
    if (text.find("\xE2\x96\x81") != std::string_view::npos) return;  // decodes as a space
    if (tok.add_space_prefix() && !text.empty()) expected = " " + expected;
  }
  if (decoded != expected) Fail(name, text, "decoding does not give the text back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Entry> vocabs = MakeFixedVocabs();
  if (size < 2 || size > 8192) return 0;
  const uint8_t which = data[0], flags = data[1];
  std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const bool add_special = (flags & 1) != 0, parse_special = (flags & 2) != 0;
  if (which & 0x80) {
    std::unique_ptr<Tokenizer> tok = VocabFromInput(&text);
    if (tok != nullptr) Check("from input", *tok, text, add_special, parse_special, false);
    return 0;
  }
  const Entry& e = vocabs[which % vocabs.size()];
  Check(e.name, *e.tok, text, add_special, parse_special, e.round_trips);
  return 0;
}
