// The `kvx` binary against a table of bad inputs, the way a hostile or
// careless user would try it: model files (missing, a directory, not a GGUF,
// truncated, hostile counts, wrong architecture or tokenizer, missing or
// misshapen tensors, strings with terminal escapes and NULs), prompts
// (invalid UTF-8, longer than the context, a directory, a device), --kv
// specs, numeric flags out of range, and every command.
//
// Every row must end with exit code 1 and a one-line "kvx: error: ..." that
// names the problem (the row's needle), with no signal, no timeout, no raw
// control character in the message, and not through main's last-resort
// exception guard ("please report": that means a cause was missed).
//
// Each row is its own test (BadInput/CliBadInputTest.Rejects/<row>) and
// builds only the files it needs, in this process's temp dir. The files are
// synthetic (kvx's tiny model shape, rewritten with GgufWriter), so the
// table runs without ../shared.
//
// The --kv rows on the run paths (run, perplexity, eval, bench, plan
// --measure) are rejected by the KV manager's ResolveKVSpec, the one
// validation every path goes through.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using gguf::GgufWriter;
using testing::BinaryDir;
using testing::CommandOutcome;
using testing::RunCommand;
using testing::TempDir;


// ---- fixtures: files made on first use ----

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// kvx gen-model's tiny shape: llama, 2 layers, 4 heads / 2 KV heads of 16
// dims, vocabulary 512 (byte-level BPE), context 512.
std::string TinyModel() {
  static const std::string path = [] {
    const std::string p = TempDir() + "/tiny.gguf";
    model::SyntheticModelOptions o;
    o.shape = "tiny";
    o.type = gguf::TensorType::kF32;
    const Status s = model::WriteSyntheticModel(o, p);
    if (!s.ok()) ADD_FAILURE() << s.ToString();
    return p;
  }();
  return path;
}

// The tiny model with q8_0 weights (per-block f16 scales).
std::string TinyQ8Model() {
  static const std::string path = [] {
    const std::string p = TempDir() + "/tiny_q8.gguf";
    model::SyntheticModelOptions o;
    o.shape = "tiny";
    o.type = gguf::TensorType::kQ8_0;
    const Status s = model::WriteSyntheticModel(o, p);
    if (!s.ok()) ADD_FAILURE() << s.ToString();
    return p;
  }();
  return path;
}

// A copy of the tiny model (or `source`) with its metadata and tensors
// edited: `edit` runs on a writer holding every key and every tensor not in
// `drop`.
std::string EditedModel(const std::string& name, const std::function<void(GgufWriter&)>& edit,
                        const std::set<std::string>& drop = {}, const std::string& source = TinyModel()) {
  const std::string path = TempDir() + "/" + name + ".gguf";
  auto src = gguf::GgufFile::Open(source);
  if (!src.ok()) {
    ADD_FAILURE() << src.status().ToString();
    return path;
  }
  GgufWriter w;
  for (const auto& [key, value] : (*src)->metadata()) EXPECT_TRUE(w.SetValue(key, value).ok()) << key;
  for (const gguf::TensorInfo& t : (*src)->tensors()) {
    if (drop.count(t.name) == 0) {
      EXPECT_TRUE(w.AddTensorRef(t.name, t.type, t.dims, t.data, t.n_bytes).ok()) << t.name;
    }
  }
  edit(w);
  const Status s = w.WriteToFile(path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

// A copy of `source` whose tensor `tensor` has the bytes `patch` at byte
// `at`: a NaN or an infinity where a weight or a block scale was.
std::string PoisonedModel(const std::string& name, const std::string& source, const std::string& tensor, size_t at,
                          const std::string& patch) {
  auto src = gguf::GgufFile::Open(source);
  const gguf::TensorInfo* t = src.ok() ? (*src)->FindTensor(tensor) : nullptr;
  if (t == nullptr || at + patch.size() > t->n_bytes) {
    ADD_FAILURE() << "cannot poison " << tensor << " of " << source;
    return "";
  }
  std::vector<uint8_t> bytes(t->data, t->data + t->n_bytes);
  std::memcpy(bytes.data() + at, patch.data(), patch.size());
  return EditedModel(
      name, [&](GgufWriter& w) { EXPECT_TRUE(w.AddTensor(tensor, t->type, t->dims, bytes).ok()) << tensor; },
      {tensor}, source);
}
// A policy that compresses once (at Session::Compress).
const std::string kSnapKv = "codec=f16;policy=snapkv,ratio=0.5,window=4,sinks=2";
const std::string kF16Nan("\x00\x7E", 2);                   // little-endian 0x7E00
const std::string kF32Nan("\x00\x00\xC0\x7F", 4);         // 0x7FC00000
const std::string kF32Inf("\x00\x00\x80\x7F", 4);         // 0x7F800000

// A llama model of 2 layers with head size 12 (embedding 48, 4 heads, 2 KV
// heads): runnable, but too narrow for the quantized KV codecs (they need a
// head size that is a multiple of 8).
std::string HeadDim12Model() {
  const std::string path = TempDir() + "/hd12.gguf";
  const int embd = 48, heads = 4, kv_heads = 2, head_dim = 12, ff = 64, layers = 2, vocab = 300;
  const model::SyntheticVocab v = model::MakeSyntheticVocab(vocab);
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.context_length", 256);
  w.SetUint32("llama.embedding_length", embd);
  w.SetUint32("llama.block_count", layers);
  w.SetUint32("llama.feed_forward_length", ff);
  w.SetUint32("llama.attention.head_count", heads);
  w.SetUint32("llama.attention.head_count_kv", kv_heads);
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "smollm");
  w.SetStringArray("tokenizer.ggml.tokens", v.tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", v.token_types);
  w.SetStringArray("tokenizer.ggml.merges", v.merges);
  w.SetUint32("tokenizer.ggml.bos_token_id", v.eos_id);
  w.SetUint32("tokenizer.ggml.eos_token_id", v.eos_id);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> data(n);
    for (uint64_t i = 0; i < n; ++i) data[i] = 0.02f * static_cast<float>((i * 2654435761u) % 201) / 100.0f - 0.02f;
    EXPECT_TRUE(w.AddTensor(name, gguf::TensorType::kF32, dims, data.data(), n * sizeof(float)).ok()) << name;
  };
  add("token_embd.weight", {embd, vocab});
  add("output_norm.weight", {embd});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {embd});
    add(p + "ffn_norm.weight", {embd});
    add(p + "attn_q.weight", {embd, heads * head_dim});
    add(p + "attn_k.weight", {embd, kv_heads * head_dim});
    add(p + "attn_v.weight", {embd, kv_heads * head_dim});
    add(p + "attn_output.weight", {heads * head_dim, embd});
    add(p + "ffn_gate.weight", {embd, ff});
    add(p + "ffn_up.weight", {embd, ff});
    add(p + "ffn_down.weight", {ff, embd});
  }
  EXPECT_TRUE(w.WriteToFile(path).ok());
  return path;
}

// Text of ordinary words: `words` of them.
std::string Words(int words) {
  static const char* kWords[] = {"the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "dog"};
  std::string s;
  for (int i = 0; i < words; ++i) s += std::string(i ? " " : "") + kWords[(i * 7) % 10];
  return s;
}

// A string holding a terminal escape sequence, a bell and a NUL: printed
// raw it would clear the screen, ring, and cut the message short.
constexpr char kHostileBytes[] = "ll\x1B[2J\x1B]0;pwned\x07" "ama\0tail";
const std::string kHostile(kHostileBytes, sizeof(kHostileBytes) - 1);

// A fixture maker: the file dir/name holding `bytes`.
std::function<std::string()> FileWith(const std::string& dir, const std::string& name, const std::string& bytes) {
  return [=] {
    WriteFile(dir + "/" + name, bytes);
    return dir + "/" + name;
  };
}

// Every fixture by name; made once per process, on first use.
std::string Fixture(const std::string& name) {
  static std::map<std::string, std::string> made;
  if (auto it = made.find(name); it != made.end()) return it->second;
  const std::string dir = TempDir();
  static const std::map<std::string, std::function<std::string()>> kMakers = {
      {"tiny", [] { return TinyModel(); }},
      {"hd12", [] { return HeadDim12Model(); }},
      {"missing", [dir] { return dir + "/no/such/model.gguf"; }},
      {"dir", [dir] {
         ::mkdir((dir + "/a_directory").c_str(), 0755);
         return dir + "/a_directory";
       }},
      {"devnull", [] { return std::string("/dev/null"); }},
      {"empty", FileWith(dir, "empty.gguf", "")},
      {"text_not_gguf", FileWith(dir, "notes.gguf", "these are notes, not a model\n")},
      {"magic_only", FileWith(dir, "magic.gguf", "GGUF")},
      {"half", [dir] {
         const std::string bytes = ReadFile(TinyModel());
         WriteFile(dir + "/half.gguf", bytes.substr(0, bytes.size() / 2));
         return dir + "/half.gguf";
       }},
      {"cut_data", [dir] {
         const std::string bytes = ReadFile(TinyModel());
         WriteFile(dir + "/cut.gguf", bytes.substr(0, bytes.size() - 1));
         return dir + "/cut.gguf";
       }},
      {"arch_gptneox", [] { return EditedModel("arch_gptneox", [](GgufWriter& w) {
         w.SetString("general.architecture", "gptneox"); }); }},
      {"arch_missing", [] { return EditedModel("arch_missing", [](GgufWriter& w) {
         w.Remove("general.architecture"); }); }},
      {"arch_hostile", [] { return EditedModel("arch_hostile", [](GgufWriter& w) {
         w.SetString("general.architecture", kHostile); }); }},
      {"layers_2p30", [] { return EditedModel("layers_2p30", [](GgufWriter& w) {
         w.SetUint32("llama.block_count", 1u << 30); }); }},
      {"layers_2p32", [] { return EditedModel("layers_2p32", [](GgufWriter& w) {
         w.SetUint64("llama.block_count", uint64_t{1} << 32); }); }},
      {"layers_0", [] { return EditedModel("layers_0", [](GgufWriter& w) {
         w.SetUint32("llama.block_count", 0); }); }},
      {"layers_negative", [] { return EditedModel("layers_negative", [](GgufWriter& w) {
         w.SetInt32("llama.block_count", -2); }); }},
      {"layers_string", [] { return EditedModel("layers_string", [](GgufWriter& w) {
         w.SetString("llama.block_count", "2"); }); }},
      {"embd_2p30", [] { return EditedModel("embd_2p30", [](GgufWriter& w) {
         w.SetUint32("llama.embedding_length", 1u << 30); }); }},
      {"ffn_2p30", [] { return EditedModel("ffn_2p30", [](GgufWriter& w) {
         w.SetUint32("llama.feed_forward_length", 1u << 30); }); }},
      {"heads_2p30", [] { return EditedModel("heads_2p30", [](GgufWriter& w) {
         w.SetUint32("llama.attention.head_count", 1u << 30);
         w.SetUint32("llama.attention.head_count_kv", 1u << 30); }); }},
      {"key_length_2p30", [] { return EditedModel("key_length_2p30", [](GgufWriter& w) {
         w.SetUint32("llama.attention.key_length", 1u << 30);
         w.SetUint32("llama.attention.value_length", 1u << 30); }); }},
      {"kv_heads_3", [] { return EditedModel("kv_heads_3", [](GgufWriter& w) {
         w.SetUint32("llama.attention.head_count_kv", 3); }); }},
      {"rope_dims_odd", [] { return EditedModel("rope_dims_odd", [](GgufWriter& w) {
         w.SetUint32("llama.rope.dimension_count", 7); }); }},
      {"eps_zero", [] { return EditedModel("eps_zero", [](GgufWriter& w) {
         w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 0.0f); }); }},
      {"rope_yarn", [] { return EditedModel("rope_yarn", [](GgufWriter& w) {
         w.SetString("llama.rope.scaling.type", "yarn"); }); }},
      {"sliding_window", [] { return EditedModel("sliding_window", [](GgufWriter& w) {
         w.SetUint32("llama.attention.sliding_window", 64); }); }},
      {"tokens_missing", [] { return EditedModel("tokens_missing", [](GgufWriter& w) {
         w.Remove("tokenizer.ggml.tokens"); }); }},
      {"tokens_not_array", [] { return EditedModel("tokens_not_array", [](GgufWriter& w) {
         w.SetString("tokenizer.ggml.tokens", "abc"); }); }},
      {"tokens_empty", [] { return EditedModel("tokens_empty", [](GgufWriter& w) {
         w.SetStringArray("tokenizer.ggml.tokens", {}); }); }},
      {"tokenizer_bert", [] { return EditedModel("tokenizer_bert", [](GgufWriter& w) {
         w.SetString("tokenizer.ggml.model", "bert"); }); }},
      {"tokenizer_hostile", [] { return EditedModel("tokenizer_hostile", [](GgufWriter& w) {
         w.SetString("tokenizer.ggml.model", kHostile); }); }},
      {"tokenizer_missing", [] { return EditedModel("tokenizer_missing", [](GgufWriter& w) {
         w.Remove("tokenizer.ggml.model"); }); }},
      {"pre_unknown", [] { return EditedModel("pre_unknown", [](GgufWriter& w) {
         w.SetString("tokenizer.ggml.pre", "klingon"); }); }},
      {"merges_missing", [] { return EditedModel("merges_missing", [](GgufWriter& w) {
         w.Remove("tokenizer.ggml.merges"); }); }},
      {"types_short", [] { return EditedModel("types_short", [](GgufWriter& w) {
         w.SetInt32Array("tokenizer.ggml.token_type", {1, 1, 1}); }); }},
      {"scores_short", [] { return EditedModel("scores_short", [](GgufWriter& w) {
         w.SetFloat32Array("tokenizer.ggml.scores", {0.5f}); }); }},
      {"vocab_only", [] { return EditedModel("vocab_only", [](GgufWriter&) {}, [] {
         std::set<std::string> all;
         auto f = gguf::GgufFile::Open(TinyModel());
         for (const auto& t : (*f)->tensors()) all.insert(t.name);
         return all;
       }()); }},
      {"tensor_missing", [] { return EditedModel("tensor_missing", [](GgufWriter&) {},
                                                 {"blk.1.attn_q.weight"}); }},
      {"tensor_shape", [] { return EditedModel("tensor_shape", [](GgufWriter& w) {
         // More elements than the metadata needs (so only the shape is wrong).
         std::vector<float> d(64 * 600);
         EXPECT_TRUE(w.AddTensor("token_embd.weight", gguf::TensorType::kF32, {64, 600}, d.data(),
                                 d.size() * 4).ok());
       }, {"token_embd.weight"}); }},
      {"tensor_type_i32", [] { return EditedModel("tensor_type_i32", [](GgufWriter& w) {
         std::vector<int32_t> d(64);
         EXPECT_TRUE(w.AddTensor("output_norm.weight", gguf::TensorType::kI32, {64}, d.data(), d.size() * 4).ok());
       }, {"output_norm.weight"}); }},
      {"bad_utf8.txt", FileWith(dir, "bad_utf8.txt", "hello \xFF\xFE world")},
      {"long.txt", FileWith(dir, "long.txt", Words(2000))},
      {"short.txt", FileWith(dir, "short.txt", "too short")},
      // Weights that cannot be right (tiny: embedding 64, so a q8_0 row of
      // attn_q is 2 blocks of 34 bytes, an f32 row 256 bytes).
      {"nan_q8_scale", [] { return PoisonedModel("nan_q8_scale", TinyQ8Model(), "blk.1.attn_q.weight", 3 * 34,
                                                 kF16Nan); }},
      {"nan_norm", [] { return PoisonedModel("nan_norm", TinyModel(), "output_norm.weight", 7 * 4, kF32Nan); }},
      {"inf_f32_row", [] { return PoisonedModel("inf_f32_row", TinyModel(), "blk.0.ffn_up.weight", 3 * 4,
                                                kF32Inf); }},
      // Row 5 of the (tied) embedding is not among the rows sampled at load:
      // logit 5 is NaN at every step.
      {"nan_logit_row", [] { return PoisonedModel("nan_logit_row", TinyModel(), "token_embd.weight", 5 * 256,
                                                  kF32Nan); }},
      {"empty.txt", FileWith(dir, "empty.txt", "")},
      {"requests.jsonl", FileWith(dir, "requests.jsonl", "{\"prompt\": \"the cat\"}\n")},
      {"three_requests.jsonl", FileWith(dir, "three_requests.jsonl",
                                        "{\"prompt\": \"the cat\"}\n{\"prompt\": \"a dog\"}\n{\"prompt\": \"hi\"}\n")},
      // Output targets kvx must neither write through nor replace.
      {"fifo", [dir] {
         ::mkfifo((dir + "/a_fifo").c_str(), 0644);
         return dir + "/a_fifo";
       }},
      // As root a rename would replace a device: a null device of our own
      // then, never the system's /dev/null.
      {"device", [dir] {
         if (::geteuid() != 0) return std::string("/dev/null");
         if (::mknod((dir + "/a_null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0) ADD_FAILURE() << "mknod";
         return dir + "/a_null";
       }},
      {"plain_file", FileWith(dir, "plain_file", "x")},
      // kvx serve's files: API keys (two tenants with one key), a chat template.
      {"same_keys.txt", FileWith(dir, "same_keys.txt", "alice:k-sekrit\nbob:k-sekrit\n")},
      {"call_block.jinja", FileWith(dir, "call_block.jinja", "{% call x() %}{% endcall %}")},
  };
  auto it = kMakers.find(name);
  if (it == kMakers.end()) {
    ADD_FAILURE() << "no fixture named " << name;
    return "";
  }
  return made[name] = it->second();
}

// ---- the table ----

struct Row {
  std::string name;               // test name: [A-Za-z0-9_]
  std::vector<std::string> args;  // after "kvx"; "{x}" is Fixture("x")
  std::string needle;             // the error message must contain this
  const char* needs = nullptr;    // non-null: skipped, this says why
};

// gtest prints a row (a skipped or failed test's parameter) by its name.
void PrintTo(const Row& row, std::ostream* os) { *os << row.name; }

// "run -m {tiny} -p hi" -> {"run", "-m", "{tiny}", "-p", "hi"}.
std::vector<std::string> A(const std::string& spaced) {
  std::vector<std::string> out;
  std::istringstream in(spaced);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}
std::vector<std::string> A(const std::string& spaced, const std::string& last) {
  std::vector<std::string> out = A(spaced);
  out.push_back(last);
  return out;
}

std::vector<Row> Rows() {
  const std::string run = "run -m {tiny} -p hi -n 4 ";
  const std::string ppl = "perplexity -m {tiny} -f {long.txt} -c 64 ";
  const std::string bench = "bench -m {tiny} --depths 0 -p 8 -n 2 -r 1 ";
  const std::string serve = "serve -m {tiny} --port 0 ";
  const std::string plan = "plan -m {tiny} --ctx 64 --mem 64M ";
  const std::string eval = "eval -m {tiny} --kv codec=f16 --tasks ppl -f {long.txt} -c 64 -q ";
  return {
      // -- the command line itself
      {"NoCommand", {}, "give a command: run, inspect"},
      {"UnknownCommand", A("frobnicate -m {tiny}"), "unknown command 'frobnicate'"},
      {"UnknownCommandHostile", {"r\x1B[2Jun"}, "unknown command 'r\\x1B[2Jun'"},
      {"ServeEmptyApiKey", {"serve", "-m", "{tiny}", "--port", "0", "--api-key", ""}, "an empty key would let every client in"},
      {"ServeApiKeysShared", A(serve + "--api-keys {same_keys.txt}"), "line 2: tenant 'bob' has the same key as"},
      {"ServeApiKeyAlsoInFile", A(serve + "--api-key x --api-keys {same_keys.txt}"), "tenant 'bob' has the same key"},
      {"ServeChatTemplateCall", A(serve + "--chat-template {call_block.jinja}"), "--chat-template file: chat template"},
      {"ServeChatTemplateEmpty", A(serve + "--chat-template {empty.txt}"), "is empty"},
      {"ServeNoConnections", A(serve + "--max-connections 0"), "'0' is not an integer in 1..16384"},
      {"ServeZeroHeaderTimeout", A(serve + "--header-timeout 0"), "'0' is not a number in (0, 3600]"},
      {"ServeMaxBodyNotASize", A(serve + "--max-body 8X"), "'8X' is not a size"},
      {"ServeMaxBodyZero", A(serve + "--max-body 0"), "'0' is not a size in 1..1099511627776 bytes"},
      {"UnknownFlag", A(run + "--bogus 1"), "--bogus"},
      {"MissingModelFlag", A("run -p hi"), "--model is required"},
      {"PromptAndFileTogether", A(run + "-f {long.txt}"), "excludes"},

      // -- model files, through run
      {"ModelMissing", A("run -m {missing} -p hi"), "cannot open"},
      {"ModelIsDirectory", A("run -m {dir} -p hi"), "is a directory"},
      {"ModelIsDevice", A("run -m {devnull} -p hi"), "is a device"},
      {"ModelEmpty", A("run -m {empty} -p hi"), "not a GGUF file"},
      {"ModelNotGguf", A("run -m {text_not_gguf} -p hi"), "GGUF"},
      {"ModelMagicOnly", A("run -m {magic_only} -p hi"), "truncated"},
      {"ModelTruncatedHalf", A("run -m {half} -p hi"), "truncated"},
      {"ModelTruncatedLastByte", A("run -m {cut_data} -p hi"), "tensor"},
      {"ArchUnknown", A("run -m {arch_gptneox} -p hi"), "llama, qwen2"},
      {"ArchMissing", A("run -m {arch_missing} -p hi"), "general.architecture"},
      {"ArchHostileString", A("run -m {arch_hostile} -p hi"), "'ll\\x1B[2J\\x1B]0;pwned\\x07ama\\x00tail'"},
      {"BlockCount2p30", A("run -m {layers_2p30} -p hi"), "block_count = 1073741824"},
      {"BlockCount2p32", A("run -m {layers_2p32} -p hi"), "out of range"},
      {"BlockCountZero", A("run -m {layers_0} -p hi"), "out of range"},
      {"BlockCountNegative", A("run -m {layers_negative} -p hi"), "negative"},
      {"BlockCountString", A("run -m {layers_string} -p hi"), "has type"},
      {"EmbeddingLength2p30", A("run -m {embd_2p30} -p hi"), "embedding_length 1073741824"},
      {"FeedForward2p30", A("run -m {ffn_2p30} -p hi"), "feed_forward_length 1073741824"},
      {"HeadCount2p30", A("run -m {heads_2p30} -p hi"), "exceeds"},
      {"KeyLength2p30", A("run -m {key_length_2p30} -p hi"), "head size 1073741824"},
      {"KvHeadsNotDivisor", A("run -m {kv_heads_3} -p hi"), "not a multiple"},
      {"RopeDimsOdd", A("run -m {rope_dims_odd} -p hi"), "dimension_count"},
      {"RmsEpsilonZero", A("run -m {eps_zero} -p hi"), "layer_norm_rms_epsilon"},
      {"RopeScalingYarn", A("run -m {rope_yarn} -p hi"), "RoPE scaling type 'yarn'"},
      {"SlidingWindow", A("run -m {sliding_window} -p hi"), "sliding-window"},
      {"TokensMissing", A("run -m {tokens_missing} -p hi"), "tokenizer.ggml.tokens"},
      {"TokensNotArray", A("run -m {tokens_not_array} -p hi"), "array of strings"},
      {"TokensEmpty", A("run -m {tokens_empty} -p hi"), "empty vocabulary"},
      {"TokenizerUnknown", A("run -m {tokenizer_bert} -p hi"), "tokenizer model 'bert'"},
      {"TokenizerHostileString", A("run -m {tokenizer_hostile} -p hi"), "'ll\\x1B[2J"},
      {"TokenizerMissing", A("run -m {tokenizer_missing} -p hi"), "has no tokenizer"},
      {"PreTokenizerUnknown", A("run -m {pre_unknown} -p hi"), "pre-tokenizer 'klingon'"},
      {"MergesMissing", A("run -m {merges_missing} -p hi"), "merges"},
      {"TokenTypesShort", A("run -m {types_short} -p hi"), "tokenizer.ggml.token_type has 3 entries"},
      {"ScoresShort", A("run -m {scores_short} -p hi"), "tokenizer.ggml.scores has 1 entries"},
      {"VocabOnlyFile", A("run -m {vocab_only} -p hi"), "holds only 0 tensors"},
      {"TensorMissing", A("run -m {tensor_missing} -p hi"), "missing tensor 'blk.1.attn_q.weight'"},
      {"TensorWrongShape", A("run -m {tensor_shape} -p hi"), "has shape [64, 600]"},
      {"TensorUnsupportedType", A("run -m {tensor_type_i32} -p hi"), "unsupported type"},
      // -- the same hostile counts through every other command
      {"PerplexityBlockCount2p30", A("perplexity -m {layers_2p30} -f {long.txt} -c 64"), "block_count"},
      {"BenchBlockCount2p30", A("bench -m {layers_2p30} --depths 0 -p 8 -n 2 -r 1"), "block_count"},
      {"PlanBlockCount2p30", A("plan -m {layers_2p30} --ctx 64 --mem 64M"), "block_count"},
      {"EvalBlockCount2p30", A("eval -m {layers_2p30} --kv codec=f16 --tasks ppl -f {long.txt} -c 64 -q"),
       "block_count"},
      {"EvalEmbedding2p30", A("eval -m {embd_2p30} --kv codec=f16 --tasks copy -c 64 -q"), "embedding_length"},
      {"InspectMissing", A("inspect {missing}"), "cannot open"},
      {"InspectDirectory", A("inspect {dir}"), "is a directory"},
      {"InspectNotGguf", A("inspect {text_not_gguf}"), "GGUF"},
      {"InspectTruncated", A("inspect {half}"), "truncated"},

      // -- prompts and text files
      {"PromptInvalidUtf8File", A("run -m {tiny} -n 4 -f {bad_utf8.txt}"), "not valid UTF-8"},
      {"PromptInvalidUtf8Arg", A("run -m {tiny} -n 4 -p", "caf\xE9 \xC0\xAF"), "not valid UTF-8"},
      {"PromptLongerThanContext", A("run -m {tiny} -n 4 -c 32 -f {long.txt}"), "context"},
      {"PromptFileIsDirectory", A("run -m {tiny} -n 4 -f {dir}"), "is a directory"},
      {"PromptFileIsDevice", A("run -m {tiny} -n 4 -f {devnull}"), "is a device"},
      {"PromptFileMissing", A("run -m {tiny} -n 4 -f {missing}"), "cannot open"},
      {"PerplexityTextIsDirectory", A("perplexity -m {tiny} -c 64 -f {dir}"), "is a directory"},
      {"PerplexityTextTooShort", A("perplexity -m {tiny} -c 64 -f {short.txt}"), "needs at least"},
      {"PerplexityTextInvalidUtf8", A("perplexity -m {tiny} -c 64 -f {bad_utf8.txt}"), "UTF-8"},
      {"EvalTextIsDirectory", A("eval -m {tiny} --kv codec=f16 --tasks ppl -c 64 -q -f {dir}"), "is a directory"},

      // -- --kv specs
      {"KvUnknownKey", A(run + "--kv codec=f16,bogus=1"), "bogus"},
      {"KvUnknownCodec", A(run + "--kv codec=int3"), "int3"},
      {"KvPageNotPowerOfTwo", A(run + "--kv page=3"), "power of two"},
      {"KvHostileText", A(run + "--kv", "codec=f16\x1B[2J"), "\\x1B[2J"},
      {"KvBudgetExhausted", A("run -m {tiny} -p hi -n 100 --kv budget=4K"), "budget"},
      {"KvBudgetOverflow", A(run + "--kv budget=99999999999999999999G"), "budget"},
      {"PerplexityKvUnknownCodec", A(ppl + "--kv codec=int3"), "int3"},
      {"BenchKvUnknownCodec", A(bench + "--kv codec=int3"), "int3"},
      {"PlanKvUnknownCodec", A(plan + "--kv codec=int3"), "int3"},
      {"PlanShapeKvUnknownCodec", A("plan --shape tiny --kv codec=int3"), "int3"},
      {"EvalKvUnknownCodec", A("eval -m {tiny} --kv codec=int3 --tasks ppl -f {long.txt} -c 64 -q"), "int3"},
      {"EvalBaselineUnknownCodec",
       A("eval -m {tiny} --kv codec=f16 --baseline codec=int3 --tasks ppl -f {long.txt} -c 64 -q"), "int3"},
      {"InspectKvPageTooSmallForKivi", A("inspect {tiny} --kv codec=kivi2,page=2,residual=0"), "at least 4 tokens"},
      {"InspectKvLayerOverride", A("inspect {tiny} --kv codec=int4,bits.5=k4v4"), "names layer 5"},
      {"InspectKvHeadSize", A("inspect {hd12} --kv codec=int4"), "head"},
      {"InspectKvUnknownCodec", A("inspect {tiny} --kv codec=int3"), "int3"},
      // The reproduction of issue 20 (SIGFPE) and the silently dropped options, on every run path.
      {"RunKvKiviPage2", A(run + "--kv codec=kivi2,page=2,residual=0"), "at least 4 tokens"},
      {"PerplexityKvKiviPage2", A(ppl + "--kv codec=kivi2,page=2,residual=0"), "at least 4 tokens"},
      {"EvalKvKiviPage2", A("eval -m {tiny} --kv codec=kivi2,page=2,residual=0 --tasks ppl -f {long.txt} -c 64 -q"),
       "at least 4 tokens"},
      {"BenchKvKiviPage2", A(bench + "--kv codec=kivi2,page=2,residual=0"), "at least 4 tokens"},
      {"PlanMeasureKvKiviPage2", A(plan + "--measure --kv codec=kivi2,page=2,residual=0"), "at least 4 tokens"},
      {"RunKvLayerOverrideOutOfRange", A(run + "--kv codec=int4,bits.5=k4v4"), "names layer 5"},
      {"RunKvCodecHeadSize", A("run -m {hd12} -p hi -n 4 --kv codec=int4"), "head"},

      // -- numeric flags, every command
      {"RunThreadsHuge", A(run + "-t 100000"), "--threads: '100000' is not an integer in 0..1024"},
      {"RunThreadsNegative", A(run + "-t -1"), "--threads"},
      {"RunTopPZero", A(run + "--top-p 0"), "--top-p"},
      {"RunTopPTwo", A(run + "--top-p 2"), "--top-p: '2' is not a number in (0, 1]"},
      {"RunTopPNan", A(run + "--top-p nan"), "--top-p"},
      {"RunMinPNegative", A(run + "--min-p -0.1"), "--min-p"},
      {"RunMinPTwo", A(run + "--min-p 2"), "--min-p"},
      {"RunTopKNegative", A(run + "--top-k -1"), "--top-k"},
      {"RunTempInf", A(run + "--temp inf"), "--temp"},
      {"RunRepeatPenaltyZero", A(run + "--repeat-penalty 0"), "--repeat-penalty"},
      {"RunRepeatLastNNegative", A(run + "--repeat-last-n -1"), "--repeat-last-n"},
      {"RunNPredictNegative", A(run + "-n -2"), "--n-predict"},
      {"RunNPredictNotANumber", A(run + "-n lots"), "--n-predict"},
      {"RunCtxNegative", A(run + "-c -1"), "--ctx-size"},
      {"RunCtxHuge", A(run + "-c 1099511627776"), "--ctx-size"},
      {"RunBatchZero", A(run + "-b 0"), "--batch-size"},
      {"PerplexityChunksZero", A(ppl + "--chunks 0"), "--chunks: '0' is neither -1 (all)"},
      {"PerplexityCtxTooSmall", A("perplexity -m {tiny} -f {long.txt} -c 2"), "--ctx-size"},
      {"PerplexityThreadsNegative", A(ppl + "-t -4"), "--threads"},
      {"BenchRepsZero", A("bench -m {tiny} --depths 0 -p 8 -n 2 -r 0"), "--reps"},
      {"BenchPromptTokensZero", A("bench -m {tiny} --depths 0 -p 0 -n 2 -r 1"), "--prompt-tokens"},
      {"BenchGenTokensNegative", A("bench -m {tiny} --depths 0 -p 8 -n -3 -r 1"), "--gen-tokens"},
      {"BenchDepthsNegative", A("bench -m {tiny} --depths 0,-64 -p 8 -n 2 -r 1"), "--depths"},
      {"BenchDepthsHuge", A("bench -m {tiny} --depths 99999999999 -p 8 -n 2 -r 1"), "--depths"},
      {"BenchDepthsEmpty", A("bench -m {tiny} -p 8 -n 2 -r 1 --depths", ""), "--depths"},
      {"BenchThreadsHuge", A(bench + "-t 5000"), "--threads"},
      {"BenchSeveralKvWithSeqs", A(bench + "--kv codec=f16 --kv codec=int8 --seqs 2"), "take one --kv"},
      {"BenchSeveralKvOneUnknown", A(bench + "--kv codec=f16 --kv codec=int3"), "int3"},
      {"PlanCtxZero", A("plan --shape tiny --mem 1G --ctx 0"), "--ctx"},
      {"PlanCtxNegative", A("plan --shape tiny --mem 1G --ctx -5"), "--ctx"},
      {"PlanMemZero", A("plan --shape tiny --mem 0"), "--mem must be a positive size"},
      {"PlanMemNotASize", A("plan --shape tiny --mem lots"), "--mem 'lots' is not a size"},
      {"PlanTierDirMissing", A("plan --shape tiny --mem 1G --tier-dir {missing}"), "does not exist"},
      {"PlanTierDirIsFile", A("plan --shape tiny --mem 1G --tier-dir {plain_file}"), "is not a directory"},
      {"PlanThreadsHuge", A("plan --shape tiny --mem 1G -t 99999"), "--threads"},
      {"PlanShapeAndModel", A("plan --shape tiny -m {tiny}"), "excludes"},
      {"PlanNoModel", A("plan --mem 1G"), "give exactly one of -m MODEL or --shape NAME"},
      {"PlanShapeUnknown", A("plan --shape gpt5 --mem 1G"), "gpt5"},
      {"PlanTypeUnknown", A("plan --shape tiny --type q3_X --mem 1G"), "q3_X"},
      {"PlanMeasureWithoutModel", A("plan --shape tiny --mem 1G --measure"), "--measure needs a model file"},
      {"EvalChunksZero", A(eval + "--chunks 0"), "--chunks"},
      {"EvalThreadsHuge", A(eval + "-t 100000"), "--threads"},
      {"EvalDepthAboveOne", A(eval + "--depths 0.5,1.5"), "--depths: '1.5' is not a number in [0, 1]"},
      {"EvalLengthZero", A(eval + "--lengths 0"), "--lengths"},
      {"EvalCopySpanOne", A(eval + "--copy-span 1"), "--copy-span"},
      {"EvalBatchZero", A(eval + "-b 0"), "--batch-size"},
      {"EvalTasksUnknown", A("eval -m {tiny} --kv codec=f16 --tasks bogus -q"), "unknown task 'bogus'"},
      {"EvalRagNotAlone", A("eval -m {tiny} --kv codec=f16 --tasks ppl,rag -q"), "--tasks rag runs alone"},
      {"EvalRagTwoSpecs", A("eval -m {tiny} --kv codec=f16 --kv codec=f32 --tasks rag -q"), "one --kv spec at a time"},
      {"EvalRagBadRepair", A("eval -m {tiny} --tasks rag --chunk-repair blend,r=2 -q"), "r must be a fraction in [0, 1]"},
      {"EvalRagKivi", A("eval -m {tiny} --kv codec=kivi4,page=32 --tasks rag --rag-sizes 64 --rag-questions 1 -q"),
       "chunk reuse cannot use codec=kivi4"},
      {"GenModelInitStdZero", A("gen-model --shape tiny -o {plain_file} --init-std 0"), "--init-std"},
      {"GenModelInitStdNan", A("gen-model --shape tiny -o {plain_file} --init-std nan"), "--init-std"},
      {"GenModelTypeUnknown", A("gen-model --shape tiny -o {plain_file} --type q3_X"), "q3_X"},
      {"GenModelShapeUnknown", A("gen-model --shape gpt5 -o {plain_file}"), "gpt5"},
      {"GenModelNoOutput", A("gen-model --shape tiny"), "-o FILE"},
      {"GenModelOutputIsDirectory", A("gen-model --shape tiny -o {dir}"), "{dir}"},

      // -- output files: one rule for every command that writes (util/output_file.h)
      {"GenModelOutputFifo", A("gen-model --shape tiny -o {fifo}"), "{fifo}': it is a pipe"},
      {"GenModelOutputDevice", A("gen-model --shape tiny -o {device}"), "is a device"},
      {"RunSaveSessionFifo", A(run + "--save-session {fifo}"), "is a pipe"},
      {"RunSaveSessionDevice", A(run + "--save-session {device}"), "is a device"},
      {"RunSaveSessionDirectory", A(run + "--save-session {dir}"), "is a directory"},
      {"EvalJsonFifo", A(eval + "--json {fifo}"), "is a pipe"},
      {"EvalJsonDevice", A(eval + "--json {device}"), "is a device"},
      {"BenchJsonFifo", A(bench + "--json {fifo}"), "is a pipe"},
      {"BenchJsonDevice", A(bench + "--json {device}"), "is a device"},
      {"BatchOutputFifo", A("batch {requests.jsonl} -m {tiny} -n 2 -o {fifo}"), "is a pipe"},
      {"BatchOutputDevice", A("batch {requests.jsonl} -m {tiny} -n 2 -o {device}"), "is a device"},
      {"CalibrateOutputFifo", A("calibrate-heads -m {tiny} --lengths 64 --trials 1 -o {fifo}"), "is a pipe"},
      {"CalibrateOutputDirectory", A("calibrate-heads -m {tiny} --lengths 64 --trials 1 -o {dir}"), "is a directory"},

      // -- numbers that cannot be right
      {"WeightsNanQ8Scale", A("perplexity -m {nan_q8_scale} -f {long.txt} -c 64"),
       "'blk.1.attn_q.weight' (q8_0) holds a NaN"},
      {"WeightsNanNorm", A("run -m {nan_norm} -p hi -n 4"), "'output_norm.weight' holds a NaN"},
      {"WeightsInfF32Row", A("run -m {inf_f32_row} -p hi -n 4"), "'blk.0.ffn_up.weight' (f32) holds a NaN or infinite"},
      {"LogitsNanRun", A("run -m {nan_logit_row} -p hi -n 4"), "NaN or infinite logit (token id 5)"},
      {"LogitsNanPerplexity", A("perplexity -m {nan_logit_row} -f {long.txt} -c 64"), "NaN or infinite logit"},
      {"PromptFileEmpty", A("run -m {tiny} -n 4 -f {empty.txt}"), "'{empty.txt}' is empty"},
      {"PerplexityTextEmpty", A("perplexity -m {tiny} -c 64 -f {empty.txt}"), "'{empty.txt}' is empty"},
      {"EvalTextEmpty", A("eval -m {tiny} --kv codec=f16 --tasks ppl -c 64 -q -f {empty.txt}"), "'{empty.txt}' is empty"},
      {"EvalCompressNoneOncePolicy", A(eval + "--compress none --kv", kSnapKv), "--compress none never asks"},
      {"EvalCompressNoneOnceBaseline", A(eval + "--compress none --baseline", kSnapKv),
       "--baseline '" + kSnapKv + "' has a policy that compresses only when asked"},
      {"CalibrateBeyondContext", A("calibrate-heads -m {tiny} --lengths 1048576 -o {plain_file}"),
       "beyond the model's trained context of 512"},
      {"PerplexityBeyondContext", A("perplexity -m {tiny} -f {long.txt} -c 4096"),
       "the chunk (-c) has 4096 tokens, beyond the model's trained context of 512"},
      {"BenchBeyondContext", A("bench -m {tiny} --depths 0,4096 -p 8 -n 2 -r 1"),
       "the deepest context (--depths, --seq-depths, -p) has 4096 tokens, beyond"},
      {"BenchSeqDepthsBeyondContext", A("bench -m {tiny} --depths 0 --seqs 2 --seq-depths 2048 -p 8 -n 2 -r 1"),
       "has 2048 tokens, beyond the model's trained context of 512"},
      {"EvalEveryCellFailed",
       A("eval -m {tiny} --kv codec=f16,budget=8K --baseline codec=f16,budget=8K --tasks ppl,kld -f {long.txt} -c 64 -q"),
       "every cell of the evaluation failed (3 cells"},
      {"CalibrateCopyTextMissing", A("calibrate-heads -m {tiny} --lengths 512 --text {dir}/no-such.txt -o {plain_file}"),
       "no-such.txt"},
      {"CalibrateRazorBeyondContext",
       A("calibrate-heads -m {tiny} --method razor --span 512 --repeats 64 -o {plain_file}"),
       "32769 tokens"},
  };
}

// The error messages kvx printed, each from "kvx: error:" to the end of its
// line (run echoes the prompt without a newline, so a generation error may
// follow it on the same line).
std::vector<std::string> ErrorLines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (const size_t at = line.find("kvx: error:"); at != std::string::npos) lines.push_back(line.substr(at));
  }
  return lines;
}

class CliBadInputTest : public ::testing::TestWithParam<Row> {};

TEST_P(CliBadInputTest, Rejects) {
  const Row& row = GetParam();
  std::vector<std::string> argv = {BinaryDir() + "/kvx"};
  std::string shown = "kvx";
  auto expand = [](std::string s) {
    for (size_t open; (open = s.find('{')) != std::string::npos;) {
      const size_t close = s.find('}', open);
      if (close == std::string::npos) break;
      s = s.substr(0, open) + Fixture(s.substr(open + 1, close - open - 1)) + s.substr(close + 1);
    }
    return s;
  };
  for (const std::string& a : row.args) {
    argv.push_back(expand(a));
    shown += " " + argv.back();
  }
  const std::string needle = expand(row.needle);
  const CommandOutcome r = RunCommand(argv, 120);
  SCOPED_TRACE(shown + "\n" + r.output);
  ASSERT_TRUE(r.exited) << "kvx did not exit cleanly: " << r.Describe();
  EXPECT_EQ(r.exit_code, 1);
  const std::vector<std::string> errors = ErrorLines(r.output);
  ASSERT_EQ(errors.size(), 1u) << "expected one 'kvx: error:' line";
  EXPECT_NE(errors[0].find(needle), std::string::npos) << "the message should contain: " << needle;
  // Not the guard in main: its message means an exception escaped a command.
  EXPECT_EQ(errors[0].find("please report"), std::string::npos);
  for (char c : errors[0]) {
    EXPECT_GE(static_cast<unsigned char>(c), 0x20) << "raw control character in the message";
    EXPECT_NE(c, '\x7F');
  }
}

std::string RowName(const ::testing::TestParamInfo<Row>& info) { return info.param.name; }

// Several sequences in one step (kvx batch prefills the three prompts
// together): the engine checks their logits row by row on the pool, and each
// request fails with the culprit's token id.
TEST(CliBadInputBatchTest, NonFiniteLogitsFailEveryRequestOfTheStep) {
  const std::vector<std::string> argv = {BinaryDir() + "/kvx", "batch", Fixture("three_requests.jsonl"),
                                         "-m", Fixture("nan_logit_row"), "-n", "4", "-t", "2"};
  const CommandOutcome r = RunCommand(argv, 120);
  SCOPED_TRACE(r.output);
  ASSERT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1);
  size_t failed = 0;
  for (size_t at = 0; (at = r.output.find("\"error\":\"internal error: the model computed a NaN or infinite logit "
                                           "(token id 5)", at)) != std::string::npos; ++at) {
    ++failed;
  }
  EXPECT_EQ(failed, 3u);
}

INSTANTIATE_TEST_SUITE_P(BadInput, CliBadInputTest, ::testing::ValuesIn(Rows()), RowName);

TEST(CliBadInputTableTest, HasEnoughRowsAndUniqueNames) {
  const std::vector<Row> rows = Rows();
  EXPECT_GE(rows.size(), 60u);
  std::set<std::string> names;
  for (const Row& r : rows) EXPECT_TRUE(names.insert(r.name).second) << r.name;
}

// The refused targets are left as they were (not replaced by a regular
// file), and a symbolic link is followed: the file it names is replaced, the
// link stays (README, Commands).
TEST(CliBadInputTableTest, OutputTargetsKeepTheirKind) {
  const std::string kvx = BinaryDir() + "/kvx";
  for (const char* name : {"fifo", "device"}) {
    const std::string target = Fixture(name);
    const CommandOutcome r = RunCommand({kvx, "gen-model", "--shape", "tiny", "-o", target}, 60);
    ASSERT_TRUE(r.exited) << r.Describe();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    struct stat st {};
    ASSERT_EQ(::lstat(target.c_str(), &st), 0) << target;
    EXPECT_TRUE(std::string(name) == "fifo" ? S_ISFIFO(st.st_mode) : S_ISCHR(st.st_mode)) << target << " replaced";
  }
  const std::string real = TempDir() + "/linked_model.gguf", link = TempDir() + "/model_link.gguf";
  WriteFile(real, "old");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  const CommandOutcome r = RunCommand({kvx, "gen-model", "--shape", "tiny", "-o", link}, 60);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << r.output;
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
  EXPECT_TRUE(gguf::GgufFile::Open(real).ok()) << "the linked file holds the model";
}

// Files that report size 0 (procfs) are read to their end: `run -f
// /proc/...` generates from the file's text, not from an empty prompt.
TEST(CliBadInputTableTest, PromptFileFromProcfsIsRead) {
  const CommandOutcome r =
      RunCommand({BinaryDir() + "/kvx", "run", "-m", TinyModel(), "-f", "/proc/self/comm", "-n", "2"}, 60);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << r.output;
  EXPECT_NE(r.output.find("kvx"), std::string::npos) << "the prompt (the process name) is echoed: " << r.output;
}

// `kvx inspect` prints a file's keys, values and tensor names: a hostile
// file's strings reach the terminal only as escapes (util/printable.h).
TEST(CliBadInputTableTest, InspectPrintsHostileStringsAsEscapes) {
  const std::string path = EditedModel("hostile_strings", [](GgufWriter& w) {
    w.SetString("general.name", kHostile);
    constexpr char kKey[] = "evil.\x1B[31mkey\0x";
    w.SetString(std::string(kKey, sizeof(kKey) - 1), "v");
    std::vector<float> d(4);
    EXPECT_TRUE(w.AddTensor("evil\r\x1B[Atensor", gguf::TensorType::kF32, {4}, d.data(), 16).ok());
  });
  const CommandOutcome r = RunCommand({BinaryDir() + "/kvx", "inspect", path, "--all"});
  ASSERT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (char c : r.output) {
    if (c == '\n') continue;
    ASSERT_GE(static_cast<unsigned char>(c), 0x20) << "raw control character in:\n" << r.output;
  }
  EXPECT_NE(r.output.find("\"ll\\x1B[2J\\x1B]0;pwned\\x07ama\\x00tail\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("evil.\\x1B[31mkey\\x00x"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("evil\\x0D\\x1B[Atensor"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvx
