#include "model/config.h"

#include <cstdio>
#include <sstream>
#include <variant>
#include <vector>

#include "util/printable.h"

namespace kvx::model {

std::string SupportedArchitecturesList() { return "llama, qwen2"; }

namespace {

// Largest count or width kvx accepts from metadata (a context length, a layer
// or head count, a vocabulary): well past any real model, small enough that
// products of two fit in 64 bits and single counts in an int.
constexpr int kMaxCount = 1 << 30;

// Reads "<arch>.<suffix>" as a positive int.
Result<int> ReadPositive(const gguf::GgufFile& f, const std::string& arch, const std::string& suffix) {
  const std::string key = arch + "." + suffix;
  auto v = f.GetUint(key);
  if (!v.ok()) return v.status().WithContext("model metadata");
  if (*v == 0 || *v > static_cast<uint64_t>(kMaxCount)) {
    return InvalidArgument("model metadata: " + key + " = " + std::to_string(*v) + " is out of range");
  }
  return static_cast<int>(*v);
}

// Weights a layer must hold at least (attention norm, Q, K, V, output, FFN
// norm, gate, up, down), to bound block_count by the tensors present.
constexpr uint64_t kTensorsPerLayer = 9;

// Every count read from the metadata sizes something later: the per-layer
// weight table (block_count entries), activation buffers (n_embd, n_ff,
// n_heads * head_dim floats per token), the KV layout. A hostile or corrupt
// file can claim block_count = 2^30 with everything else intact, and the
// first thing sized by it would throw std::bad_alloc. So before any of it is
// used, the counts are checked against what the file holds: the layers need
// their tensors, and the weights the shapes imply need (about) as many
// elements in the file's tensors, whatever their type (a tensor's element
// count is already bounded by its bytes in the file). Exact shapes are
// checked when the weights are loaded; this only keeps every size derived
// from the metadata within a small factor of the file.
Status CheckAgainstTensors(const gguf::GgufFile& f, const ModelConfig& c) {
  const std::string& a = c.arch_name;
  const uint64_t n_tensors = f.tensors().size();
  if (static_cast<uint64_t>(c.n_layers) * kTensorsPerLayer > n_tensors) {
    return InvalidArgument("model metadata: " + a + ".block_count = " + std::to_string(c.n_layers) +
                           " layers, but the file holds only " + std::to_string(n_tensors) +
                           " tensors (each layer needs at least " + std::to_string(kTensorsPerLayer) +
                           "): the metadata is corrupt or belongs to another model");
  }
  uint64_t file_elements = 0;  // no overflow: each tensor's elements are bounded by its bytes in the file
  for (const gguf::TensorInfo& t : f.tensors()) file_elements += t.n_elements;
  // In double: the products of hostile counts (each up to 2^30) overflow 64 bits.
  const double embd = c.n_embd, q_dim = static_cast<double>(c.n_heads) * c.head_dim;
  const double kv_dim = static_cast<double>(c.n_kv_heads) * c.head_dim;
  const double per_layer = embd * (q_dim + 2 * kv_dim) + q_dim * embd + 3 * embd * c.n_ff;
  const double needed = embd * c.n_vocab + c.n_layers * per_layer;
  // Twice the file's elements: far below what a hostile count implies, and
  // loose enough that a missing or misshapen tensor is reported by name when
  // the weights are loaded rather than as a count mismatch here.
  if (q_dim > kMaxCount || kv_dim > kMaxCount || needed > 2.0 * static_cast<double>(file_elements)) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.4g", needed);
    return InvalidArgument("model metadata describes " + std::string(buf) + " weights (" + a + ".block_count " +
                           std::to_string(c.n_layers) + ", embedding_length " + std::to_string(c.n_embd) +
                           ", feed_forward_length " + std::to_string(c.n_ff) + ", head_count " +
                           std::to_string(c.n_heads) + " x head size " + std::to_string(c.head_dim) +
                           ", vocabulary " + std::to_string(c.n_vocab) + "), but the file's tensors hold " +
                           std::to_string(file_elements) +
                           ": the metadata is corrupt or belongs to another model");
  }
  return Status::Ok();
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
    return Unimplemented("unsupported model architecture " + QuotePrintable(c.arch_name) +
                         "; kvx supports: " + SupportedArchitecturesList());
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
  if (c.head_dim == 0 && !f.Has(a + ".attention.key_length")) {
    return InvalidArgument("model metadata: " + a + ".attention.head_count " + std::to_string(c.n_heads) +
                           " exceeds " + a + ".embedding_length " + std::to_string(c.n_embd) +
                           " (a head would have 0 dimensions)");
  }
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
    return Unimplemented("RoPE scaling type " + QuotePrintable(scaling) +
                         " is not supported; kvx supports none, linear, llama3");
  }
  if (f.Has(a + ".attention.sliding_window")) {
    KVX_ASSIGN_OR_RETURN(uint64_t window, f.GetUint(a + ".attention.sliding_window"));
    if (window != 0 && window < static_cast<uint64_t>(c.n_ctx_train)) {
      return Unimplemented("sliding-window attention (window " + std::to_string(window) +
                           ") is not supported yet");
    }
  }
  // n_vocab: from the token list (the authority llama.cpp uses). Its length
  // is bounded by the file's size (the GGUF reader checks every array count
  // against the bytes left), so reading it allocates nothing unbounded.
  const gguf::Value* tokens = f.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr) return NotFound("model metadata: tokenizer.ggml.tokens is missing");
  const auto* token_list = std::get_if<std::vector<gguf::Value>>(&tokens->data);
  if (tokens->type != gguf::ValueType::kArray || tokens->array_type != gguf::ValueType::kString ||
      token_list == nullptr) {
    return InvalidArgument("model metadata: tokenizer.ggml.tokens must be an array of strings");
  }
  if (token_list->empty()) return InvalidArgument("model has an empty vocabulary");
  if (token_list->size() > static_cast<size_t>(kMaxCount)) {
    return InvalidArgument("model metadata: tokenizer.ggml.tokens has " + std::to_string(token_list->size()) +
                           " entries, more than kvx supports (" + std::to_string(kMaxCount) + ")");
  }
  c.n_vocab = static_cast<int>(token_list->size());
  KVX_RETURN_IF_ERROR(CheckAgainstTensors(f, c));
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
