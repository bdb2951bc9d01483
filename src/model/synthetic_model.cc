#include "model/synthetic_model.h"

#include <cmath>
#include <unordered_set>

#include "gguf/gguf_writer.h"
#include "ops/quantize.h"

namespace kvx::model {

const std::vector<ModelShape>& ModelShapes() {
  // Hyperparameters from the models' published configs.
  static const std::vector<ModelShape> kShapes = {
      {"tiny", "llama", "2-layer test model", 512, 64, 2, 4, 2, 128, 512, 10000.0f, 1e-5f, true, "smollm"},
      {"tiny-untied", "llama", "2-layer test model, separate output matrix", 512, 64, 2, 4, 2, 128, 512, 10000.0f,
       1e-5f, false, "llama-bpe"},
      {"tiny-qwen2", "qwen2", "2-layer qwen2 test model (QKV bias, NeoX RoPE)", 512, 64, 2, 4, 2, 128, 512,
       1000000.0f, 1e-6f, true, "qwen2"},
      {"smollm2-135m", "llama", "HuggingFaceTB/SmolLM2-135M", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0f, 1e-5f,
       true, "smollm"},
      {"smollm2-360m", "llama", "HuggingFaceTB/SmolLM2-360M", 49152, 960, 32, 15, 5, 2560, 8192, 100000.0f, 1e-5f,
       true, "smollm"},
      {"qwen2.5-0.5b", "qwen2", "Qwen/Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 4864, 32768, 1000000.0f, 1e-6f, true,
       "qwen2"},
      {"llama-3.2-1b", "llama", "meta-llama/Llama-3.2-1B", 128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f, 1e-5f,
       true, "llama-bpe", /*llama3_rope=*/true},
  };
  return kShapes;
}

Result<ModelShape> FindModelShape(const std::string& name) {
  std::string names;
  for (const ModelShape& s : ModelShapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  return InvalidArgument("unknown model shape '" + name + "'; known shapes: " + names);
}

namespace {

// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest
// to code points from U+0100 on, so every byte is a visible character.
std::string ByteToUnicode(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// SplitMix64: a small, fast, seedable generator.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  // Standard normal via Box-Muller (one value per call keeps it simple).
  float Normal() {
    const double u1 = Uniform() + 1e-300, u2 = Uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

}  // namespace

SyntheticVocab MakeSyntheticVocab(int n_vocab) {
  SyntheticVocab v;
  const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int n_special = 3;
  const int n_regular = n_vocab - n_special;
  std::unordered_set<std::string> seen;
  auto add = [&](const std::string& t) {
    v.tokens.push_back(t);
    v.token_types.push_back(1);
    seen.insert(t);
  };
  for (int b = 0; b < 256 && static_cast<int>(v.tokens.size()) < n_regular; ++b) add(ByteToUnicode(b));
  auto merge = [&](int left, int right) {
    std::string joined = v.tokens[left] + v.tokens[right];
    if (seen.count(joined) != 0) return;
    v.merges.push_back(v.tokens[left] + " " + v.tokens[right]);
    add(joined);
  };
  // First the merges that make English-looking text tokenize into words:
  // "Ġ"+letter, then letter pairs, then random concatenations of existing tokens.
  const std::string space = ByteToUnicode(' ');
  const int space_id = ' ';  // byte tokens are in byte order
  for (int c = 'a'; c <= 'z' && static_cast<int>(v.tokens.size()) < n_regular; ++c) merge(space_id, c);
  for (int a = 'a'; a <= 'z'; ++a) {
    for (int b = 'a'; b <= 'z' && static_cast<int>(v.tokens.size()) < n_regular; ++b) merge(a, b);
  }
  Rng rng{12345};
  while (static_cast<int>(v.tokens.size()) < n_regular) {
    const int size = static_cast<int>(v.tokens.size());
    const int left = static_cast<int>(rng.Next() % size), right = static_cast<int>(rng.Next() % size);
    if (v.tokens[left].size() + v.tokens[right].size() > 24) continue;
    merge(left, right);
  }
  v.eos_id = static_cast<int32_t>(v.tokens.size());
  for (int i = 0; i < n_special && static_cast<int>(v.tokens.size()) < n_vocab; ++i) {
    v.tokens.push_back(kSpecials[i]);
    v.token_types.push_back(3);
  }
  return v;
}

gguf::TensorType SyntheticMatrixType(gguf::TensorType wanted, uint64_t n_in) {
  const gguf::TensorTypeTraits* t = gguf::GetTensorTypeTraits(static_cast<uint32_t>(wanted));
  if (n_in % t->block_size == 0) return wanted;
  if (n_in % 32 == 0) return gguf::TensorType::kQ8_0;
  return gguf::TensorType::kF16;
}

ShapeWeightBytes ComputeShapeWeightBytes(const ModelShape& s, gguf::TensorType type) {
  const uint64_t head_dim = s.n_embd / s.n_heads, d = s.n_embd;
  const uint64_t q_dim = s.n_heads * head_dim, kv_dim = s.n_kv_heads * head_dim;
  auto bytes = [&](uint64_t n_in, uint64_t n_out) {
    return static_cast<double>(gguf::RowBytes(SyntheticMatrixType(type, n_in), n_in) * n_out);
  };
  ShapeWeightBytes w;
  const double layer = bytes(d, q_dim) + 2 * bytes(d, kv_dim) + bytes(q_dim, d) + 2 * bytes(d, s.n_ff) +
                       bytes(s.n_ff, d) + 2 * 4.0 * d;
  const double embd = bytes(d, s.n_vocab);
  w.total = s.n_layers * layer + embd * (s.tied_embeddings ? 1 : 2) + 4.0 * d;
  w.decode_per_token = s.n_layers * layer + embd + 4.0 * d;
  w.matmul_flops_per_token =
      2.0 * s.n_layers * (d * q_dim + 2.0 * d * kv_dim + q_dim * d + 3.0 * d * s.n_ff);
  return w;
}

namespace {

Status AddMatrix(gguf::GgufWriter* w, Rng* rng, const std::string& name, gguf::TensorType type, uint64_t n_in,
                 uint64_t n_out, float std_dev) {
  type = SyntheticMatrixType(type, n_in);
  const uint64_t row_bytes = gguf::RowBytes(type, n_in);
  std::vector<uint8_t> bytes(row_bytes * n_out);
  std::vector<float> row(n_in);
  for (uint64_t r = 0; r < n_out; ++r) {
    for (auto& x : row) x = std_dev * rng->Normal();
    ops::QuantizeRow(type, row.data(), bytes.data() + r * row_bytes, static_cast<int64_t>(n_in));
  }
  return w->AddTensor(name, type, {n_in, n_out}, std::move(bytes));
}

Status AddVector(gguf::GgufWriter* w, const std::string& name, const std::vector<float>& v) {
  return w->AddTensor(name, gguf::TensorType::kF32, {v.size()}, v.data(), v.size() * sizeof(float));
}

}  // namespace

Status WriteSyntheticModel(const SyntheticModelOptions& options, const std::string& path) {
  KVX_ASSIGN_OR_RETURN(ModelShape s, FindModelShape(options.shape));
  if (!gguf::IsSupportedWeightType(options.type)) {
    return InvalidArgument("unsupported weight type " + gguf::TensorTypeName(options.type) + "; use one of " +
                           gguf::SupportedWeightTypesList());
  }
  const std::string& a = s.arch;
  const int head_dim = s.n_embd / s.n_heads;
  gguf::GgufWriter w;
  w.SetString("general.architecture", a);
  w.SetString("general.name", "kvx synthetic " + s.name + " (random weights, " + s.description + " shape)");
  w.SetUint32("general.file_type", 1);
  w.SetUint32(a + ".context_length", s.n_ctx);
  w.SetUint32(a + ".embedding_length", s.n_embd);
  w.SetUint32(a + ".block_count", s.n_layers);
  w.SetUint32(a + ".feed_forward_length", s.n_ff);
  w.SetUint32(a + ".attention.head_count", s.n_heads);
  w.SetUint32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.SetFloat32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.SetFloat32(a + ".rope.freq_base", s.rope_theta);
  w.SetUint32(a + ".rope.dimension_count", head_dim);
  w.SetUint32(a + ".vocab_size", s.n_vocab);

  const SyntheticVocab vocab = MakeSyntheticVocab(s.n_vocab);
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", s.bpe_pre);
  w.SetStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", vocab.token_types);
  w.SetStringArray("tokenizer.ggml.merges", vocab.merges);
  w.SetUint32("tokenizer.ggml.bos_token_id", vocab.eos_id);
  w.SetUint32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.SetUint32("tokenizer.ggml.padding_token_id", vocab.eos_id);
  if (!options.chat_template.empty()) w.SetString("tokenizer.chat_template", options.chat_template);
  w.SetBool("tokenizer.ggml.add_bos_token", false);

  Rng rng{options.seed};
  const float sd = options.init_std;
  const uint64_t d = s.n_embd, q_dim = static_cast<uint64_t>(s.n_heads) * head_dim,
                 kv_dim = static_cast<uint64_t>(s.n_kv_heads) * head_dim;
  KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, "token_embd.weight", options.type, d, s.n_vocab, sd));
  KVX_RETURN_IF_ERROR(AddVector(&w, "output_norm.weight", std::vector<float>(d, 1.0f)));
  if (!s.tied_embeddings) {
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, "output.weight", options.type, d, s.n_vocab, sd));
  }
  if (s.llama3_rope) {
    // Llama 3.1/3.2 scaling (factor 32, low 1, high 4, original context 8192):
    // long wavelengths are divided by the factor, short ones kept, smooth between.
    std::vector<float> factors(head_dim / 2);
    const double factor = 32, low = 1, high = 4, orig = 8192;
    for (int i = 0; i < head_dim / 2; ++i) {
      const double freq = 1.0 / std::pow(s.rope_theta, 2.0 * i / head_dim);
      const double wavelen = 2 * M_PI / freq;
      if (wavelen < orig / high) {
        factors[i] = 1.0f;
      } else if (wavelen > orig / low) {
        factors[i] = static_cast<float>(factor);
      } else {
        const double smooth = (orig / wavelen - low) / (high - low);
        factors[i] = static_cast<float>(1.0 / ((1 - smooth) / factor + smooth));
      }
    }
    KVX_RETURN_IF_ERROR(AddVector(&w, "rope_freqs.weight", factors));
  }
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    KVX_RETURN_IF_ERROR(AddVector(&w, p + "attn_norm.weight", std::vector<float>(d, 1.0f)));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "attn_q.weight", options.type, d, q_dim, sd));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "attn_k.weight", options.type, d, kv_dim, sd));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "attn_v.weight", options.type, d, kv_dim, sd));
    if (a == "qwen2") {
      std::vector<float> b(q_dim);
      for (auto& x : b) x = sd * rng.Normal();
      KVX_RETURN_IF_ERROR(AddVector(&w, p + "attn_q.bias", b));
      b.resize(kv_dim);
      for (auto& x : b) x = sd * rng.Normal();
      KVX_RETURN_IF_ERROR(AddVector(&w, p + "attn_k.bias", b));
      for (auto& x : b) x = sd * rng.Normal();
      KVX_RETURN_IF_ERROR(AddVector(&w, p + "attn_v.bias", b));
    }
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "attn_output.weight", options.type, q_dim, d, sd));
    KVX_RETURN_IF_ERROR(AddVector(&w, p + "ffn_norm.weight", std::vector<float>(d, 1.0f)));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "ffn_gate.weight", options.type, d, s.n_ff, sd));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "ffn_up.weight", options.type, d, s.n_ff, sd));
    KVX_RETURN_IF_ERROR(AddMatrix(&w, &rng, p + "ffn_down.weight", options.type, s.n_ff, d, sd));
  }
  return w.WriteToFile(path);
}

}  // namespace kvx::model
