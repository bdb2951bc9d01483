// Session files: one sequence of an engine saved to bytes (or a file) and
// restored into a new sequence of an engine running the same model and KV
// spec, where it continues exactly as if it had never left (the same logits,
// bit for bit: the pages are restored as stored, never re-encoded).
//
// What a file holds: the model's identity (model/fingerprint.h, its name and
// architecture for messages), the KV layout and spec (budget excluded: a
// session moves between pools of any size), the sequence's token ids,
// positions, block hashes and salt, whether a policy removed entries, the
// logits after its last token (optional: what the next token is sampled
// from), pending tokens (optional), and every (layer, kv-head) page table with its pages' bytes as the
// codec stored them (positions of dead slots included).
//
// Format (little-endian):
//   header, 48 bytes: magic "KVXSESS\0", u32 version (kSessionFileVersion),
//     u32 compression (0 none, 1 zstd), u64 body bytes, u64 stored bytes,
//     u64 XXH3 of the stored body, u64 XXH3 of the 40 bytes before it;
//   body (zstd-compressed unless compression is 0): identity, sequence,
//     logits, tables (session_file.cc has the field list).
// A file is refused — never half-restored, never a crash — when it is
// truncated or a byte changed (checksums: DataLoss), is of another version
// (Unimplemented), was made with another model or KV spec
// (InvalidArgument naming both and what to run instead), or does not fit
// the context or the pool (InvalidArgument / ResourceExhausted).
//
// Privacy: the last page of each table is saved whole, so its unused slots
// carry whatever bytes that pool page held before (another sequence's old
// entries). Files stay on the machine that wrote them (the server saves and
// restores from its own directory); do not hand them to other tenants.
//
// Thread-safety: as Engine (call from the thread that drives it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kv/kv_manager.h"
#include "util/status.h"

namespace kvx::engine {

inline constexpr uint32_t kSessionFileVersion = 1;
inline constexpr size_t kSessionHeaderBytes = 48;

struct SessionFileOptions {
  bool compress = true;  // zstd the body (f16 pages shrink ~10-20%, quantized ones less)
  int zstd_level = 3;
};

// What a session holds besides its sequence.
struct SessionExtras {
  std::span<const float> logits;     // after its last token: n_vocab floats, or empty
  std::span<const int32_t> pending;  // tokens of the conversation not in the KV yet (the scheduler's
                                     // sessions: the last sampled token), fed before what comes next
};

// The bytes of a session file for sequence `seq` of `engine`.
Result<std::string> EncodeSession(const Engine& engine, kv::SeqId seq, const SessionExtras& extras = {},
                                  const SessionFileOptions& options = {});
// EncodeSession written to `path` (a temporary file renamed into place, so a
// crash never leaves half a file under the name).
Status SaveSessionFile(const Engine& engine, kv::SeqId seq, const std::string& path,
                       const SessionExtras& extras = {}, const SessionFileOptions& options = {});

struct RestoredSession {
  kv::SeqId seq = -1;             // a new sequence of the engine's manager
  std::vector<float> logits;      // as saved (empty if none were)
  std::vector<int32_t> pending;   // as saved
};
// Checks `bytes` completely, then restores them into a new sequence of
// `engine`'s manager (errors above; nothing changes on error).
Result<RestoredSession> DecodeSession(Engine& engine, std::span<const uint8_t> bytes);
Result<RestoredSession> LoadSessionFile(Engine& engine, const std::string& path);

}  // namespace kvx::engine
