// ModelConfig: every hyperparameter of a llama-family model, read from GGUF
// metadata (never hard-coded), plus the derived values the forward pass needs.
//
// Supported architectures: `llama` (Llama 2/3, TinyLlama, SmolLM/SmolLM2,
// Mistral without sliding window) and `qwen2` (QKV bias, NeoX RoPE).
// Thread-safety: value type.
#pragma once

#include <string>

#include "gguf/gguf_file.h"
#include "util/status.h"

namespace kvx::model {

enum class Architecture { kLlama, kQwen2 };

// "llama, qwen2" (for error messages).
std::string SupportedArchitecturesList();

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;   // as in general.architecture
  std::string name;        // general.name, if any
  int n_vocab = 0;
  int n_embd = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;        // key/value length per head
  int n_ff = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  // RoPE: frequencies theta_i = pos * freq_scale / (freq_base^(2i/rope_dims) * factor_i)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  int rope_dims = 0;
  bool rope_neox = false;  // rotate (x[i], x[i+d/2]) instead of adjacent pairs
  bool has_qkv_bias = false;

  // Reads and validates the config; errors name the missing/invalid key.
  static Result<ModelConfig> FromGguf(const gguf::GgufFile& file);

  std::string ToString() const;
};

}  // namespace kvx::model
