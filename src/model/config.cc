#include "model/config.h"

#include <sstream>

namespace kvx::model {

std::string SupportedArchitecturesList() { return "llama, qwen2"; }

namespace {

// Reads "<arch>.<suffix>" as a positive int.
Result<int> ReadPositive(const gguf::GgufFile& f, const std::string& arch, const std::string& suffix) {
  const std::string key = arch + "." + suffix;
  auto v = f.GetUint(key);
  if (!v.ok()) return v.status().WithContext("model metadata");
  if (*v == 0 || *v > (1u << 30)) {
    return InvalidArgument("model metadata: " + key + " = " + std::to_string(*v) + " is out of range");
  }
  return static_cast<int>(*v);
}

}  // namespace

Result<ModelConfig> ModelConfig::FromGguf(const gguf::GgufFile& f) {
  ModelConfig c;
  KVX_ASSIGN_OR_RETURN(c.arch_name, f.GetString("general.architecture"));
  if (c.arch_name == "llama") {
    c.arch = Architecture::kLlama;
  } else if (c.arch_name == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.rope_neox = true;
    c.has_qkv_bias = true;
  } else {
    return Unimplemented("unsupported model architecture '" + c.arch_name +
                         "'; kvx supports: " + SupportedArchitecturesList());
  }
  const std::string& a = c.arch_name;
  KVX_ASSIGN_OR_RETURN(c.name, f.GetStringOr("general.name", ""));
  KVX_ASSIGN_OR_RETURN(c.n_embd, ReadPositive(f, a, "embedding_length"));
  KVX_ASSIGN_OR_RETURN(c.n_layers, ReadPositive(f, a, "block_count"));
  KVX_ASSIGN_OR_RETURN(c.n_ff, ReadPositive(f, a, "feed_forward_length"));
  KVX_ASSIGN_OR_RETURN(c.n_heads, ReadPositive(f, a, "attention.head_count"));
  KVX_ASSIGN_OR_RETURN(c.n_ctx_train, ReadPositive(f, a, "context_length"));
  c.n_kv_heads = c.n_heads;
  if (f.Has(a + ".attention.head_count_kv")) {
    KVX_ASSIGN_OR_RETURN(c.n_kv_heads, ReadPositive(f, a, "attention.head_count_kv"));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return InvalidArgument("model metadata: head_count " + std::to_string(c.n_heads) +
                           " is not a multiple of head_count_kv " + std::to_string(c.n_kv_heads));
  }
  c.head_dim = c.n_embd / c.n_heads;
  if (f.Has(a + ".attention.key_length")) {
    KVX_ASSIGN_OR_RETURN(c.head_dim, ReadPositive(f, a, "attention.key_length"));
  }
  if (f.Has(a + ".attention.value_length")) {
    KVX_ASSIGN_OR_RETURN(int v_len, ReadPositive(f, a, "attention.value_length"));
    if (v_len != c.head_dim) {
      return Unimplemented("model has key_length " + std::to_string(c.head_dim) + " != value_length " +
                           std::to_string(v_len) + "; kvx needs equal key and value head sizes");
    }
  }
  if (c.head_dim % 2 != 0) return InvalidArgument("model metadata: head size must be even for RoPE");
  KVX_ASSIGN_OR_RETURN(double eps, f.GetFloatOr(a + ".attention.layer_norm_rms_epsilon", 1e-5));
  if (!(eps > 0 && eps < 1)) return InvalidArgument("model metadata: layer_norm_rms_epsilon out of range");
  c.rms_eps = static_cast<float>(eps);
  KVX_ASSIGN_OR_RETURN(double base, f.GetFloatOr(a + ".rope.freq_base", 10000.0));
  if (!(base > 1)) return InvalidArgument("model metadata: rope.freq_base must be > 1");
  c.rope_freq_base = static_cast<float>(base);
  c.rope_dims = c.head_dim;
  if (f.Has(a + ".rope.dimension_count")) {
    KVX_ASSIGN_OR_RETURN(c.rope_dims, ReadPositive(f, a, "rope.dimension_count"));
    if (c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
      return InvalidArgument("model metadata: rope.dimension_count " + std::to_string(c.rope_dims) +
                             " must be even and <= head size " + std::to_string(c.head_dim));
    }
  }
  // RoPE scaling: none, linear (positions scaled), llama3 (per-frequency
  // factors from the rope_freqs tensor, applied by the forward pass).
  KVX_ASSIGN_OR_RETURN(std::string scaling, f.GetStringOr(a + ".rope.scaling.type", "none"));
  if (scaling == "linear") {
    KVX_ASSIGN_OR_RETURN(double factor, f.GetFloatOr(a + ".rope.scaling.factor", 1.0));
    if (!(factor > 0)) return InvalidArgument("model metadata: rope.scaling.factor must be > 0");
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && scaling != "llama3") {
    return Unimplemented("RoPE scaling type '" + scaling + "' is not supported; kvx supports none, linear, llama3");
  }
  if (f.Has(a + ".attention.sliding_window")) {
    KVX_ASSIGN_OR_RETURN(uint64_t window, f.GetUint(a + ".attention.sliding_window"));
    if (window != 0 && window < static_cast<uint64_t>(c.n_ctx_train)) {
      return Unimplemented("sliding-window attention (window " + std::to_string(window) +
                           ") is not supported yet");
    }
  }
  // n_vocab: from the token list (the authority llama.cpp uses).
  KVX_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  c.n_vocab = static_cast<int>(tokens.size());
  if (c.n_vocab == 0) return InvalidArgument("model has an empty vocabulary");
  return c;
}

std::string ModelConfig::ToString() const {
  std::ostringstream s;
  s << "arch=" << arch_name << " n_vocab=" << n_vocab << " n_embd=" << n_embd << " n_layers=" << n_layers
    << " n_heads=" << n_heads << " n_kv_heads=" << n_kv_heads << " head_dim=" << head_dim << " n_ff=" << n_ff
    << " n_ctx_train=" << n_ctx_train << " rope(base=" << rope_freq_base << ", scale=" << rope_freq_scale
    << ", dims=" << rope_dims << (rope_neox ? ", neox" : ", normal") << ")";
  return s.str();
}

}  // namespace kvx::model
