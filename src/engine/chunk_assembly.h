// Chunk reuse (CacheBlend / EPIC; docs/kv-reuse.md): a prompt made of a
// prefix, text chunks and a suffix is assembled from the chunks' KV computed
// on their own, instead of prefilling every token in place.
//
//   Assemble(session, prefix, chunks, suffix, repair)
//     1. prefix: fed normally (after whatever the session already holds: a
//        prefix-cache fork);
//     2. each chunk: its KV at positions 0..n-1 from the ChunkCache (key:
//        tier::ChunkKey: tokens, model, spec, tenant salt), or computed alone
//        and kept there on a miss;
//     3. one step over the chunks' and the suffix's tokens at their new
//        positions, in which each chunk token's K/V at each layer is either
//        the cached one (keys re-rotated from position j to p + j: RoPE is a
//        rotation, R(p + j) = R(p) R(j); with prerope=1 keys are stored
//        before RoPE and need nothing) or recomputed in context, as the
//        repair says:
//          none   no chunk token (naive concatenation);
//          full   every token (the reference: a plain prefill);
//          epic   the first k tokens of every chunk, through every layer (EPIC);
//          blend  every token through layers 0..L; at the check layer L the
//                 tokens whose fresh K/V deviate most from the cached ones
//                 (sum of squared differences of K and V over kv heads and
//                 channels), the top r fraction, go on through the later
//                 layers (CacheBlend);
//        the suffix's tokens, and the last token when the suffix is empty,
//        always run through every layer (their logits are the answer's), and
//        so do the gaps: prompt text between chunks that is not a chunk
//        (a chat template's text between content parts), never cached.
//
// Formats: keys re-rotated at new positions are re-encoded into the spec's
// pages, so assembly accepts what it can store without a second
// quantization: f32/f16 pages (either RoPE mode), row-wise quantized codecs
// (int8/int4/int2) only with prerope=1; KIVI (keys grouped per channel over
// a page, which regroups at new positions) is refused with the fix.
//
// Thread-safety: as Engine (one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"
#include "kv/chunk_cache.h"
#include "kv/tier/block_key.h"
#include "util/status.h"

namespace kvx::engine {

enum class ChunkRepairMode { kNone, kFull, kEpic, kBlend };

// The default (ChunkRepair{}, --chunk-repair) is epic,k=16: on the recall
// model it matches blend's KLD at a quarter of its time to first token
// (docs/kv-reuse.md, Results).
struct ChunkRepair {
  ChunkRepairMode mode = ChunkRepairMode::kEpic;
  // epic: k, tokens recomputed at the start of each chunk (4 when parsed
  // without k); blend: k first tokens of each chunk recomputed besides its
  // selection (EPIC + blend; 0 when parsed without k).
  int epic_tokens = 16;
  double blend_ratio = 0.15;  // blend: r, fraction of chunk tokens recomputed past the check layer
  int blend_layer = 1;        // blend: L, the check layer (LMCache's default: 1)
  // blend: what ranks the tokens at the check layer: the squared deviation
  // of keys and values (kv), keys only (k, LMCache's), values only (v).
  enum class Deviation { kKV, kK, kV } blend_deviation = Deviation::kKV;
  // "blend,r=0.15,layer=1", "epic,k=4", "none", "full" (ParseChunkRepair's input).
  std::string ToString() const;
};
// "none", "full", "epic[,k=N]" (N >= 0),
// "blend[,r=X][,layer=L][,k=N][,dev=kv|k|v]" (0 <= X <= 1, L >= 0: checked
// against the model's layers at assembly; defaults r=0.15, layer=1, k=0, kv). InvalidArgument
// naming the bad part and the valid forms.
Result<ChunkRepair> ParseChunkRepair(std::string_view text);

// Each chunk's text tokenized on its own, without BOS, so a chunk's tokens
// (and its cache key) do not depend on its neighbours: chunk boundaries are
// token boundaries. A chunk is tokenized as it reads inside the running
// prompt (Tokenizer::EncodeContinuation: no SentencePiece space prefix), so
// chunks whose texts concatenate to a prompt's text get that prompt's
// tokens wherever no merge crosses a seam; only when no text precedes the
// chunks (`after_text` false) does the first non-empty one, the prompt's
// first text, get the prefix, as in a plain prompt. InvalidArgument naming
// the chunk when its text is not valid UTF-8 (e.g. a chunk cut inside a
// multi-byte character).
Result<std::vector<std::vector<int32_t>>> TokenizeChunks(const model::Tokenizer& tokenizer,
                                                         std::span<const std::string> texts, bool after_text);

// A prompt made of chunks (the scheduler's GenerationRequest::chunks, the
// server's "chunks"): prefix, then each chunk, then the suffix, assembled
// with `repair` instead of prefilled.
struct ChunkPrompt {
  std::vector<int32_t> prefix;               // fed normally (BOS, instructions)
  std::vector<std::vector<int32_t>> chunks;  // each tokenized alone (TokenizeChunks)
  // gaps[c]: prompt text right after chunks[c], computed in context like the
  // suffix (a chat template's text between two content parts); at most one
  // per chunk, none for adjacent chunks.
  std::vector<std::vector<int32_t>> gaps;
  std::vector<int32_t> suffix;               // after the chunks (the question)
  ChunkRepair repair;
  // prefix + every chunk and its gap + suffix: the prompt's tokens.
  std::vector<int32_t> Tokens() const;
};

// A chunked prompt from texts: BOS (if the model adds one), each chunk
// tokenized alone (TokenizeChunks), then `suffix` without BOS, each as it
// reads in the text of the chunks and suffix concatenated.
Result<ChunkPrompt> MakeChunkPrompt(const model::Tokenizer& tokenizer, std::span<const std::string> chunks,
                                    const std::string& suffix, bool parse_special, const ChunkRepair& repair);

// What an assembly took from where (tokens).
struct ChunkUsage {
  int64_t prefix_tokens = 0;      // fed normally
  int64_t chunk_tokens = 0;       // in all chunks
  int64_t cached_tokens = 0;      // chunk tokens whose KV came from the chunk cache
  int64_t computed_tokens = 0;    // chunk tokens computed alone (cache misses; then cached)
  int64_t recomputed_tokens = 0;  // chunk tokens recomputed in context through the last layer
  int64_t suffix_tokens = 0;
  int64_t gap_tokens = 0;         // prompt text between chunks (ChunkPrompt::gaps), computed in context
  std::vector<int32_t> recomputed_positions;  // of those chunk tokens, increasing
  double RecomputedFraction() const {
    return chunk_tokens > 0 ? static_cast<double>(recomputed_tokens) / static_cast<double>(chunk_tokens) : 0.0;
  }
};

class ChunkAssembler {
 public:
  // A chunk cache of `cache_bytes` for `engine`'s model and spec.
  // InvalidArgument naming the fix when the spec's pages cannot take chunks
  // at new positions (see the header comment).
  static Result<std::unique_ptr<ChunkAssembler>> Create(Engine* engine, uint64_t cache_bytes);

  // Appends prefix, chunks (each followed by its gap, if any) and suffix to
  // `session` (see the header comment) and returns the logits after the
  // last token (valid until the next call). Empty chunks are skipped (not
  // their gaps). InvalidArgument for a chunk or a
  // prompt longer than the context, an empty prompt, or a check layer
  // beyond the model's; ResourceExhausted when the pool cannot hold it.
  // `usage` (optional) gets what was taken from where.
  Result<const float*> Assemble(Session* session, std::span<const int32_t> prefix,
                                std::span<const std::vector<int32_t>> chunks, std::span<const int32_t> suffix,
                                const ChunkRepair& repair, ChunkUsage* usage = nullptr,
                                std::span<const std::vector<int32_t>> gaps = {});

  kv::ChunkCache& cache() { return cache_; }
  // Called with every chunk computed alone (a cache miss), after it is
  // cached: the scheduler writes it to the KV tiers (docs/kv-reuse.md).
  void SetOnComputed(std::function<void(uint64_t salt, const kv::KVManager::SequenceImage& image)> on_computed) {
    on_computed_ = std::move(on_computed);
  }
  // The key a chunk of `tokens` has for tenant `salt`.
  kv::tier::BlockKey Key(uint64_t salt, std::span<const int32_t> tokens) const {
    return kv::tier::ChunkKey(space_, salt, tokens);
  }

 private:
  ChunkAssembler(Engine* engine, kv::tier::BlockSpace space, uint64_t cache_bytes)
      : engine_(engine), space_(std::move(space)), cache_(cache_bytes) {}
  // The chunk's image from the cache, or computed alone and cached.
  Result<const kv::KVManager::SequenceImage*> ChunkImage(uint64_t salt, std::span<const int32_t> tokens,
                                                         ChunkUsage* usage);
  // Writes the chunk's K/V, keys at positions from `first_position` on, to
  // rows [row, row + n) of the per-layer buffers.
  Status LoadChunkRows(const kv::KVManager::SequenceImage& image, int32_t first_position, int row,
                       std::vector<std::vector<float>>* k, std::vector<std::vector<float>>* v);

  Engine* engine_;
  kv::tier::BlockSpace space_;
  kv::ChunkCache cache_;
  std::list<kv::OwnedSequenceImage> uncached_;  // chunks larger than the whole cache, for one call
  std::function<void(uint64_t, const kv::KVManager::SequenceImage&)> on_computed_;
  std::vector<float> logits_;
};

}  // namespace kvx::engine
