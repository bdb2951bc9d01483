// Weights that cannot be right: NaN or infinity in a model file, found at
// load so that a corrupt file is an error instead of `PPL = nan` (one NaN
// block scale of a q8_0 matrix poisons every logit it reaches).
//
// Checked cheaply: the per-block scales of quantized tensors, all of them
// (q8_0 and q4_0 d; q4_K and q5_K d and dmin; q6_K d: the quants themselves
// are small integers and cannot be non-finite), and a sample of rows of
// float (f32, f16, bf16) matrices. Vectors (norms, biases) are checked whole
// by the loader after it dequantizes them. The cost at load (measured on
// the smollm2-135m shape) is stated in README.md, "Supported models".
//
// Thread-safety: pure function of the tensor's bytes.
#pragma once

#include "gguf/gguf_file.h"
#include "util/status.h"

namespace kvx::model {

// Float matrices: rows checked (evenly spaced, the first and last among them).
inline constexpr int kFiniteSampleRows = 64;

// DataLoss naming the tensor, the row and what is not finite, for a tensor
// (ggml order: dims[0] elements per row) of a supported weight type.
Status CheckWeightsFinite(const gguf::TensorInfo& t, int sample_rows = kFiniteSampleRows);

}  // namespace kvx::model
