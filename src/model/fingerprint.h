// ModelFingerprint: a 64-bit identity of a GGUF model, so that files made
// with one model (saved sessions, engine/session_file.h) are refused by
// another. Two files of the same model give the same value wherever they
// are; a different model, a fine-tune or another quantization gives a
// different one.
//
// What it hashes (XXH3): every metadata key with its type and value
// (tokenizer included), every tensor's name, type and shape, and a sample of
// each tensor's bytes (up to 16 evenly spread 4 KiB runs, the first and last
// included). Hashing all weights would read the whole file (slow for large
// models); a change that leaves all sampled bytes, metadata and shapes alike
// is not detected.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "gguf/gguf_file.h"

namespace kvx::model {

uint64_t ModelFingerprint(const gguf::GgufFile& file);

}  // namespace kvx::model
