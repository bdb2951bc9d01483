// Synthetic models: GGUF files with random weights and the exact architecture
// (every hyperparameter and tensor shape) of real models, with a valid
// byte-level BPE tokenizer of the real vocabulary size. Loadable by kvx and
// by llama.cpp alike. Speed and memory work at real scale uses them, since
// real weights of large models are not available offline.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "util/status.h"

namespace kvx::model {

struct ModelShape {
  std::string name;          // "smollm2-135m"
  std::string arch;          // "llama" or "qwen2"
  std::string description;   // what real model it mirrors
  int n_vocab, n_embd, n_layers, n_heads, n_kv_heads, n_ff, n_ctx;
  float rope_theta;
  float rms_eps;
  bool tied_embeddings;
  std::string bpe_pre;       // tokenizer.ggml.pre
  bool llama3_rope = false;  // llama3-style rope scaling (rope_freqs tensor)
};

// All known shapes, smallest first.
const std::vector<ModelShape>& ModelShapes();
// The shape called `name`, or InvalidArgument listing the known names.
Result<ModelShape> FindModelShape(const std::string& name);

struct SyntheticModelOptions {
  std::string shape = "tiny";
  gguf::TensorType type = gguf::TensorType::kQ8_0;  // matrices and embeddings
  uint64_t seed = 1;
  float init_std = 0.02f;  // weights ~ N(0, init_std^2)
  std::string chat_template;  // tokenizer.chat_template; empty: none
};

// Writes the model to `path`. Matrices whose row length is not a multiple of
// the type's block size (e.g. 576 for the 256-element k-quants) fall back to
// q8_0, then f16, as llama.cpp's quantizer does; norms are f32.
Status WriteSyntheticModel(const SyntheticModelOptions& options, const std::string& path);

// The type a matrix with rows of n_in elements gets when `wanted` is asked
// for: `wanted` if its block divides n_in, else q8_0, else f16.
gguf::TensorType SyntheticMatrixType(gguf::TensorType wanted, uint64_t n_in);

// Bytes of the weights WriteSyntheticModel writes for (shape, type), split
// into everything and what one decoded token reads.
struct ShapeWeightBytes {
  double total = 0;
  double decode_per_token = 0;
  double matmul_flops_per_token = 0;  // 2 x multiply-adds of the layer matrices
};
ShapeWeightBytes ComputeShapeWeightBytes(const ModelShape& shape, gguf::TensorType type);

// The synthetic byte-level BPE vocabulary for `n_vocab` tokens: 256 byte
// tokens (GPT-2 byte-to-unicode alphabet), deterministic merges, and the
// special tokens <|endoftext|>, <|im_start|>, <|im_end|> at the end.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control
  std::vector<std::string> merges;   // "left right", by rank
  int32_t eos_id = 0;
};
SyntheticVocab MakeSyntheticVocab(int n_vocab);

}  // namespace kvx::model
