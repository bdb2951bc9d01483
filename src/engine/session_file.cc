#include "engine/session_file.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "kv/codec/codec_id.h"
#include "model/fingerprint.h"
#include "util/byte_io.h"
#include "util/output_file.h"

namespace kvx::engine {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'X', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kNoCompression = 0, kZstd = 1;

// The body, field by field (all little-endian; str = u32 length + bytes):
//   identity  u64 model fingerprint, str model name, str architecture,
//             u32 n_vocab, u32 n_layers, u32 n_kv_heads, u32 head_dim,
//             u32 page_tokens, str KV spec (canonical, budget excluded)
//   sequence  u64 salt, u8 entries removed, u32 n, i32[n] tokens,
//             i32[n] positions, u32 m, u64[m] block hashes
//   logits    u32 k (0 or n_vocab), f32[k]
//   pending   u32 p, i32[p] token ids
//   tables    n_layers * n_kv_heads times, layer-major: u32 slots,
//             u32 pages, then per page u8 f16 (1) / packed (0), u32 bytes,
//             the page's bytes
// The KV spec as it matters for the pages: the canonical form without the
// pool budget (a session may move to a pool of another size).
std::string PageSpec(const kv::KVSpec& spec) {
  kv::KVSpec s = spec;
  s.budget_bytes = 0;
  return s.ToString();
}

std::string ModelName(const model::Model& m) {
  return m.config().name.empty() ? std::filesystem::path(m.file().name()).filename().string() : m.config().name;
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The largest body a session of this engine can have: every page within the
// pool budget (plus 5 bytes of framing per page of at least 64 bytes), the
// tokens, positions and hashes of a full context, the logits.
uint64_t MaxBodyBytes(const Engine& e) {
  const kv::ResolvedKVSpec& r = e.kv_manager().spec();
  return r.budget_bytes * 2 + static_cast<uint64_t>(r.n_ctx) * 16 +
         static_cast<uint64_t>(e.model().config().n_vocab) * 4 + (1u << 20);
}

}  // namespace

Result<std::string> EncodeSession(const Engine& engine, kv::SeqId seq, const SessionExtras& extras,
                                  const SessionFileOptions& options) {
  const std::span<const float> logits = extras.logits;
  const kv::KVManager& m = engine.kv_manager();
  if (!m.HasSequence(seq)) return NotFound("no sequence " + std::to_string(seq) + " to save");
  if (m.in_step()) return Internal("a session cannot be saved during a step");
  const model::Model& model = engine.model();
  const int n_vocab = model.config().n_vocab;
  if (!logits.empty() && logits.size() != static_cast<size_t>(n_vocab)) {
    return InvalidArgument("saved logits must hold n_vocab (" + std::to_string(n_vocab) + ") values");
  }
  const kv::KVLayout& layout = m.spec().layout;
  ByteWriter w;
  w.U64(model::ModelFingerprint(model.file()));
  w.Str(ModelName(model));
  w.Str(model.config().arch_name);
  w.U32(static_cast<uint32_t>(n_vocab));
  w.U32(static_cast<uint32_t>(layout.n_layers));
  w.U32(static_cast<uint32_t>(layout.n_kv_heads));
  w.U32(static_cast<uint32_t>(layout.head_dim));
  w.U32(static_cast<uint32_t>(layout.page_tokens));
  w.Str(PageSpec(m.spec().spec));

  // The export names what cannot be stored (pages merged, pruned or demoted), and the fix.
  Result<kv::KVManager::SequenceImage> exported = m.ExportSequence(seq);
  if (!exported.ok()) {
    return Status(exported.status().code(), "session files cannot store this sequence: " + exported.status().message());
  }
  const kv::KVManager::SequenceImage& image = *exported;
  const size_t n = image.tokens.size();
  w.U64(image.salt);
  w.U8(image.entries_removed ? 1 : 0);
  w.U32(static_cast<uint32_t>(n));
  w.Bytes(image.tokens.data(), n * sizeof(int32_t));
  w.Bytes(image.positions.data(), n * sizeof(int32_t));
  w.U32(static_cast<uint32_t>(image.block_hashes.size()));
  w.Bytes(image.block_hashes.data(), image.block_hashes.size() * sizeof(uint64_t));
  w.U32(static_cast<uint32_t>(logits.size()));
  w.Bytes(logits.data(), logits.size() * sizeof(float));
  for (int32_t t : extras.pending) {
    if (t < 0 || t >= n_vocab) return InvalidArgument("pending token " + std::to_string(t) + " is outside the vocabulary");
  }
  w.U32(static_cast<uint32_t>(extras.pending.size()));
  w.Bytes(extras.pending.data(), extras.pending.size() * sizeof(int32_t));
  for (const kv::SequenceKV::TableImage& t : image.tables) {
    w.U32(static_cast<uint32_t>(t.length));
    w.U32(static_cast<uint32_t>(t.pages.size()));
    for (size_t p = 0; p < t.pages.size(); ++p) {
      w.U8(t.full[p]);
      w.U32(static_cast<uint32_t>(t.pages[p].size()));
      w.Bytes(t.pages[p].data(), t.pages[p].size());
    }
  }

  std::string body = std::move(w.out());
  std::string stored;
  uint32_t compression = kNoCompression;
  if (options.compress) {
    stored.resize(ZSTD_compressBound(body.size()));
    const size_t n = ZSTD_compress(stored.data(), stored.size(), body.data(), body.size(), options.zstd_level);
    if (ZSTD_isError(n)) return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    stored.resize(n);
    compression = kZstd;
  } else {
    stored = body;
  }
  ByteWriter header;
  header.Bytes(kMagic, sizeof kMagic);
  header.U32(kSessionFileVersion);
  header.U32(compression);
  header.U64(body.size());
  header.U64(stored.size());
  header.U64(XXH3_64bits(stored.data(), stored.size()));
  header.U64(XXH3_64bits(header.out().data(), header.out().size()));
  std::string file = std::move(header.out());
  file += stored;
  return file;
}

Status SaveSessionFile(const Engine& engine, kv::SeqId seq, const std::string& path, const SessionExtras& extras,
                       const SessionFileOptions& options) {
  KVX_ASSIGN_OR_RETURN(std::string bytes, EncodeSession(engine, seq, extras, options));
  return WriteFileAtomically(path, bytes);
}

Result<RestoredSession> DecodeSession(Engine& engine, std::span<const uint8_t> bytes) {
  // 1. Header: magic, its own checksum, version, sizes, the body's checksum.
  if (bytes.size() < kSessionHeaderBytes) {
    if (std::memcmp(bytes.data(), kMagic, std::min(bytes.size(), sizeof kMagic)) != 0) {
      return InvalidArgument("not a kvx session file (no KVXSESS magic)");
    }
    return DataLoss("session file is truncated: " + std::to_string(bytes.size()) + " bytes, its header alone has " +
                    std::to_string(kSessionHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return InvalidArgument("not a kvx session file (no KVXSESS magic)");
  }
  ByteReader hr(bytes.first(kSessionHeaderBytes), "session file");
  uint8_t magic[8];
  hr.Take(magic, sizeof magic, "magic");
  const uint32_t version = hr.U32("version");
  const uint32_t compression = hr.U32("compression");
  const uint64_t body_bytes = hr.U64("body size");
  const uint64_t stored_bytes = hr.U64("stored size");
  const uint64_t body_hash = hr.U64("body checksum");
  const uint64_t header_hash = hr.U64("header checksum");
  if (XXH3_64bits(bytes.data(), kSessionHeaderBytes - 8) != header_hash) {
    return DataLoss("session file header is corrupted (checksum mismatch)");
  }
  if (version != kSessionFileVersion) {
    return Unimplemented("session file version " + std::to_string(version) + "; this kvx reads version " +
                         std::to_string(kSessionFileVersion) + " (save the session again with this build)");
  }
  if (compression != kNoCompression && compression != kZstd) {
    return DataLoss("session file names an unknown compression (" + std::to_string(compression) + ")");
  }
  const uint64_t have = bytes.size() - kSessionHeaderBytes;
  if (stored_bytes != have) {
    return DataLoss(std::string("session file is ") + (have < stored_bytes ? "truncated" : "longer than its header says") +
                    ": its header announces " + std::to_string(stored_bytes) + " bytes of data, the file has " +
                    std::to_string(have));
  }
  const std::span<const uint8_t> stored = bytes.subspan(kSessionHeaderBytes);
  if (XXH3_64bits(stored.data(), stored.size()) != body_hash) {
    return DataLoss("session file is corrupted (checksum mismatch over its data)");
  }
  if (body_bytes > MaxBodyBytes(engine)) {
    return InvalidArgument("the session holds " + std::to_string(body_bytes) +
                           " bytes, more than this engine's KV pool could ever hold; raise the budget");
  }
  std::string raw;
  std::span<const uint8_t> body = stored;
  if (compression == kZstd) {
    const unsigned long long frame = ZSTD_getFrameContentSize(stored.data(), stored.size());
    if (frame != body_bytes) return DataLoss("session file's compressed data does not match its header");
    raw.resize(body_bytes);
    const size_t n = ZSTD_decompress(raw.data(), raw.size(), stored.data(), stored.size());
    if (ZSTD_isError(n) || n != body_bytes) return DataLoss("session file's compressed data is damaged");
    body = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  } else if (body_bytes != stored_bytes) {
    return DataLoss("session file's sizes disagree");
  }

  // 2. Identity: the same model and the same page format, before anything else.
  ByteReader r(body, "session file");
  const uint64_t fingerprint = r.U64("model fingerprint");
  const std::string model_name = r.Str("model name");
  const std::string arch = r.Str("architecture");
  const uint32_t n_vocab = r.U32("vocabulary size");
  kv::KVLayout layout;
  layout.n_layers = static_cast<int>(r.U32("layer count"));
  layout.n_kv_heads = static_cast<int>(r.U32("kv head count"));
  layout.head_dim = static_cast<int>(r.U32("head size"));
  layout.page_tokens = static_cast<int>(r.U32("page size"));
  const std::string spec = r.Str("KV spec");
  if (!r.ok()) return r.Error();
  const model::Model& model = engine.model();
  const kv::KVManager& m = engine.kv_manager();
  if (fingerprint != model::ModelFingerprint(model.file()) ||
      n_vocab != static_cast<uint32_t>(model.config().n_vocab)) {
    return InvalidArgument("session file was saved with another model ('" + model_name + "', " + arch +
                           ", fingerprint " + Hex(fingerprint) + "); this engine runs '" + ModelName(model) +
                           "' (fingerprint " + Hex(model::ModelFingerprint(model.file())) +
                           "): restore it with the model it was saved with");
  }
  const kv::KVLayout& ours = m.spec().layout;
  if (spec != PageSpec(m.spec().spec) || layout.n_layers != ours.n_layers || layout.n_kv_heads != ours.n_kv_heads ||
      layout.head_dim != ours.head_dim || layout.page_tokens != ours.page_tokens) {
    return InvalidArgument("session file was saved with --kv '" + spec + "'; this engine runs --kv '" +
                           PageSpec(m.spec().spec) + "': restore it with the spec it was saved with");
  }

  // 3. The sequence and its tables.
  kv::KVManager::SequenceImage image;
  image.salt = r.U64("salt");
  image.entries_removed = r.U8("flags") != 0;
  const uint32_t n = r.U32("token count");
  r.Array(&image.tokens, n, "token ids");
  r.Array(&image.positions, n, "positions");
  r.Array(&image.block_hashes, r.U32("hash count"), "block hashes");
  RestoredSession out;
  const uint32_t n_logits = r.U32("logit count");
  r.Array(&out.logits, n_logits, "logits");
  r.Array(&out.pending, r.U32("pending count"), "pending tokens");
  if (!r.ok()) return r.Error();
  for (int32_t t : out.pending) {
    if (t < 0 || t >= static_cast<int32_t>(n_vocab)) return DataLoss("session file holds a pending token outside the vocabulary");
  }
  if (n_logits != 0 && n_logits != n_vocab) return DataLoss("session file holds logits of the wrong size");
  for (int32_t t : image.tokens) {
    if (t < 0 || t >= static_cast<int32_t>(n_vocab)) {
      return DataLoss("session file holds token id " + std::to_string(t) + " outside the vocabulary");
    }
  }
  image.tables.resize(static_cast<size_t>(layout.n_layers) * layout.n_kv_heads);
  for (kv::SequenceKV::TableImage& t : image.tables) {
    t.length = static_cast<int>(r.U32("table length"));
    const uint32_t pages = r.U32("page count");
    if (!r.Fits(pages, 5, "page list")) return r.Error();
    t.full.resize(pages);
    t.pages.resize(pages);
    for (uint32_t p = 0; p < pages; ++p) {
      t.full[p] = r.U8("page kind");
      if (t.full[p] > 1) return DataLoss("session file names an unknown page kind");
      t.pages[p] = r.Span(r.U32("page size"), "page bytes");
    }
    if (!r.ok()) return r.Error();
    if (t.length < 0) return DataLoss("session file holds a negative table length");
  }
  if (!r.at_end()) return DataLoss("session file has bytes after its last page table");
  KVX_ASSIGN_OR_RETURN(out.seq, engine.kv_manager().ImportSequence(image));
  return out;
}

Result<RestoredSession> LoadSessionFile(Engine& engine, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound("no session file " + path);
  if (!std::filesystem::is_regular_file(path, ec)) return InvalidArgument(path + " is not a regular file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return IoError("cannot read " + path + ": " + ec.message());
  const uint64_t limit = ZSTD_compressBound(MaxBodyBytes(engine)) + kSessionHeaderBytes;
  if (size > limit) {
    return InvalidArgument(path + " holds " + std::to_string(size) +
                           " bytes, more than a session of this engine's KV pool can take; raise the budget");
  }
  std::string bytes(size, '\0');
  std::ifstream f(path, std::ios::binary);
  if (!f || !f.read(bytes.data(), static_cast<std::streamsize>(size))) return IoError("cannot read " + path);
  auto r = DecodeSession(engine, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), size));
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

}  // namespace kvx::engine
