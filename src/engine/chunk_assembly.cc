#include "engine/chunk_assembly.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "model/fingerprint.h"
#include "ops/nn.h"

namespace kvx::engine {
namespace {

constexpr std::string_view kRepairForms = "none, full, epic[,k=N], blend[,r=X][,layer=L][,k=N][,dev=kv|k|v]";

Status BadRepair(std::string_view text, const std::string& what) {
  return InvalidArgument("chunk repair '" + std::string(text) + "': " + what + " (valid: " + std::string(kRepairForms) +
                         ")");
}

// Which rows of the assembly step run through which layers (the plan of one
// repair) and where every other row's K/V comes from (cached_k/v[layer]).
// Chunk rows are the spans [first, second) of `chunk_spans`; every other row
// is prompt text in context (the template text between chat parts, the
// suffix), which runs through every layer like the last row (its logits
// are the answer's).
class RepairPlan final : public model::RowRecompute {
 public:
  RepairPlan(const ChunkRepair& repair, int kv_dim, int n_rows,
             const std::vector<std::pair<int32_t, int32_t>>& chunk_spans,
             const std::vector<std::vector<float>>* cached_k, const std::vector<std::vector<float>>* cached_v)
      : repair_(repair),
        kv_dim_(kv_dim),
        use_k_(repair.blend_deviation != ChunkRepair::Deviation::kV),
        use_v_(repair.blend_deviation != ChunkRepair::Deviation::kK),
        cached_k_(cached_k),
        cached_v_(cached_v),
        is_chunk_(static_cast<size_t>(n_rows), false) {
    for (int i = 0; i < n_rows; ++i) all_.push_back(i);
    std::vector<bool> always(static_cast<size_t>(n_rows), true);
    const bool first_k = repair.mode == ChunkRepairMode::kEpic || repair.mode == ChunkRepairMode::kBlend;
    for (const auto& [first, end] : chunk_spans) {
      for (int i = first; i < end; ++i) {
        is_chunk_[i] = true;
        always[i] = first_k && i < first + repair.epic_tokens;
        ++n_chunk_;
      }
    }
    always.back() = true;
    for (int i = 0; i < n_rows; ++i) {
      if (always[i]) late_.push_back(i);
    }
  }

  std::span<const int32_t> Rows(int layer) override {
    const bool early = repair_.mode == ChunkRepairMode::kBlend && layer <= repair_.blend_layer;
    return early ? std::span<const int32_t>(all_) : std::span<const int32_t>(late_);
  }

  void Merge(int layer, std::span<const int32_t> rows, const float* k, const float* v, float* k_all,
             float* v_all) override {
    const std::vector<float>& ck = (*cached_k_)[layer];
    const std::vector<float>& cv = (*cached_v_)[layer];
    std::copy(ck.begin(), ck.end(), k_all);
    std::copy(cv.begin(), cv.end(), v_all);
    const bool check = repair_.mode == ChunkRepairMode::kBlend && layer == repair_.blend_layer;
    std::vector<std::pair<double, int32_t>> deviation;
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t at = static_cast<size_t>(rows[i]) * kv_dim_;
      const float* fk = k + i * kv_dim_;
      const float* fv = v + i * kv_dim_;
      if (check && is_chunk_[rows[i]]) {
        double d = 0;
        for (int j = 0; j < kv_dim_; ++j) {
          const double dk = fk[j] - ck[at + j], dv = fv[j] - cv[at + j];
          d += (use_k_ ? dk * dk : 0.0) + (use_v_ ? dv * dv : 0.0);
        }
        deviation.push_back({d, rows[i]});
      }
      std::memcpy(k_all + at, fk, sizeof(float) * kv_dim_);
      std::memcpy(v_all + at, fv, sizeof(float) * kv_dim_);
    }
    if (check) Select(std::move(deviation));
  }

  // Chunk rows that run through the last layer.
  std::vector<int32_t> RecomputedChunkRows(int last_layer) {
    std::vector<int32_t> out;
    for (int32_t r : Rows(last_layer)) {
      if (is_chunk_[r]) out.push_back(r);
    }
    return out;
  }

 private:
  // The top r fraction of the chunk rows by deviation (ties: the earlier
  // row), with the rows that always run.
  void Select(std::vector<std::pair<double, int32_t>> deviation) {
    // Rows recomputed anyway (the first k of each chunk) are not ranked.
    std::erase_if(deviation, [&](const auto& d) { return std::binary_search(late_.begin(), late_.end(), d.second); });
    const size_t keep = std::min(deviation.size(), static_cast<size_t>(std::ceil(repair_.blend_ratio * n_chunk_)));
    std::partial_sort(deviation.begin(), deviation.begin() + static_cast<std::ptrdiff_t>(keep), deviation.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    std::vector<int32_t> chosen;
    for (size_t i = 0; i < keep; ++i) chosen.push_back(deviation[i].second);
    for (int32_t r : late_) {
      if (std::find(chosen.begin(), chosen.end(), r) == chosen.end()) chosen.push_back(r);
    }
    std::sort(chosen.begin(), chosen.end());
    late_ = std::move(chosen);
  }

  ChunkRepair repair_;
  int kv_dim_, n_chunk_ = 0;
  bool use_k_, use_v_;  // what the deviation sums
  const std::vector<std::vector<float>>* cached_k_;
  const std::vector<std::vector<float>>* cached_v_;
  std::vector<bool> is_chunk_;  // per row
  std::vector<int32_t> all_, late_;
};

// Assembly re-encodes cached K/V at new positions: refuse the page formats
// where that would quantize them a second time.
Status CheckReusableFormat(const kv::ResolvedKVSpec& spec) {
  for (const kv::LayerCodec& layer : spec.layers) {
    const std::string name(kv::CodecName(layer.id));
    if (kv::IsKivi(layer.id)) {
      return InvalidArgument("chunk reuse cannot use codec=" + name +
                             ": KIVI quantizes keys per channel over a page, and a chunk's tokens fall into other pages "
                             "at their new positions, so its keys would be quantized twice; use codec=f16 or a row-wise "
                             "codec (int8, int4, int2) with prerope=1");
    }
    if (kv::IsQuantized(layer.id) && !spec.spec.codec.pre_rope) {
      return InvalidArgument("chunk reuse with codec=" + name +
                             " needs prerope=1: re-rotating quantized keys to their new positions would quantize them "
                             "twice, while keys stored before RoPE need no rotation (or use codec=f16)");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string ChunkRepair::ToString() const {
  char buf[64];
  switch (mode) {
    case ChunkRepairMode::kNone: return "none";
    case ChunkRepairMode::kFull: return "full";
    case ChunkRepairMode::kEpic: return "epic,k=" + std::to_string(epic_tokens);
    case ChunkRepairMode::kBlend: {
      std::snprintf(buf, sizeof buf, "blend,r=%g,layer=%d", blend_ratio, blend_layer);
      std::string out = buf;
      if (epic_tokens > 0) out += ",k=" + std::to_string(epic_tokens);
      if (blend_deviation == Deviation::kK) out += ",dev=k";
      if (blend_deviation == Deviation::kV) out += ",dev=v";
      return out;
    }
  }
  return "?";
}

std::vector<int32_t> ChunkPrompt::Tokens() const {
  std::vector<int32_t> out = prefix;
  for (size_t c = 0; c < chunks.size(); ++c) {
    out.insert(out.end(), chunks[c].begin(), chunks[c].end());
    if (c < gaps.size()) out.insert(out.end(), gaps[c].begin(), gaps[c].end());
  }
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

Result<ChunkPrompt> MakeChunkPrompt(const model::Tokenizer& tokenizer, std::span<const std::string> chunks,
                                    const std::string& suffix, bool parse_special, const ChunkRepair& repair) {
  ChunkPrompt c;
  KVX_ASSIGN_OR_RETURN(c.prefix, tokenizer.Encode("", /*add_special=*/true, /*parse_special=*/false));  // BOS
  // Every chunk as running text, the first too, so a chunk has one key
  // wherever it is placed: the prompt's SentencePiece leading space is the
  // first chunk's own (a document that starts with its space), not added.
  KVX_ASSIGN_OR_RETURN(c.chunks, TokenizeChunks(tokenizer, chunks, /*after_text=*/true));
  const bool after_text = std::any_of(chunks.begin(), chunks.end(), [](const std::string& t) { return !t.empty(); });
  if (!suffix.empty()) {
    KVX_ASSIGN_OR_RETURN(c.suffix, after_text ? tokenizer.EncodeContinuation(suffix, parse_special)
                                              : tokenizer.Encode(suffix, /*add_special=*/false, parse_special));
  }
  c.repair = repair;
  return c;
}

Result<ChunkRepair> ParseChunkRepair(std::string_view text) {
  ChunkRepair r;
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  const std::string_view mode = parts[0];
  if (mode == "none") r.mode = ChunkRepairMode::kNone;
  else if (mode == "full") r.mode = ChunkRepairMode::kFull;
  else if (mode == "epic") r.mode = ChunkRepairMode::kEpic, r.epic_tokens = 4;
  else if (mode == "blend") r.mode = ChunkRepairMode::kBlend, r.epic_tokens = 0;
  else return BadRepair(text, "unknown mode '" + std::string(mode) + "'");
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    const std::string key(parts[i].substr(0, eq));
    const std::string value(eq == std::string_view::npos ? "" : parts[i].substr(eq + 1));
    const std::string want = r.mode == ChunkRepairMode::kEpic    ? "k"
                             : r.mode == ChunkRepairMode::kBlend ? "r, layer, k, dev"
                                                                 : "";
    const bool takes_k = r.mode == ChunkRepairMode::kEpic || r.mode == ChunkRepairMode::kBlend;
    if (takes_k && key == "k") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), r.epic_tokens);
      if (ec != std::errc() || end != value.data() + value.size() || r.epic_tokens < 0) {
        return BadRepair(text, "k must be a token count >= 0");
      }
    } else if (r.mode == ChunkRepairMode::kBlend && key == "layer") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), r.blend_layer);
      if (ec != std::errc() || end != value.data() + value.size() || r.blend_layer < 0) {
        return BadRepair(text, "layer must be a layer index >= 0");
      }
    } else if (r.mode == ChunkRepairMode::kBlend && key == "dev") {
      if (value == "kv") r.blend_deviation = ChunkRepair::Deviation::kKV;
      else if (value == "k") r.blend_deviation = ChunkRepair::Deviation::kK;
      else if (value == "v") r.blend_deviation = ChunkRepair::Deviation::kV;
      else return BadRepair(text, "dev must be kv, k or v");
    } else if (r.mode == ChunkRepairMode::kBlend && key == "r") {
      char* end = nullptr;
      r.blend_ratio = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(r.blend_ratio >= 0 && r.blend_ratio <= 1)) {
        return BadRepair(text, "r must be a fraction in [0, 1]");
      }
    } else {
      return BadRepair(text, "'" + key + "' is not a key of " + std::string(mode) +
                                 (want.empty() ? " (it takes none)" : " (its keys: " + want + ")"));
    }
  }
  return r;
}

Result<std::vector<std::vector<int32_t>>> TokenizeChunks(const model::Tokenizer& tokenizer,
                                                         std::span<const std::string> texts, bool after_text) {
  std::vector<std::vector<int32_t>> chunks;
  for (size_t c = 0; c < texts.size(); ++c) {
    Result<std::vector<int32_t>> tokens =
        after_text ? tokenizer.EncodeContinuation(texts[c], /*parse_special=*/false)
                   : tokenizer.Encode(texts[c], /*add_special=*/false, /*parse_special=*/false);
    if (!tokens.ok()) return tokens.status().WithContext("chunk " + std::to_string(c));
    after_text = after_text || !texts[c].empty();
    chunks.push_back(std::move(tokens).value());
  }
  return chunks;
}

Result<std::unique_ptr<ChunkAssembler>> ChunkAssembler::Create(Engine* engine, uint64_t cache_bytes) {
  const kv::ResolvedKVSpec& spec = engine->kv_manager().spec();
  KVX_RETURN_IF_ERROR(CheckReusableFormat(spec));
  KVX_ASSIGN_OR_RETURN(kv::tier::BlockSpace space,
                       kv::tier::MakeBlockSpace(spec, model::ModelFingerprint(engine->model().file()),
                                                spec.layout.page_tokens));
  return std::unique_ptr<ChunkAssembler>(new ChunkAssembler(engine, std::move(space), cache_bytes));
}

Result<const kv::KVManager::SequenceImage*> ChunkAssembler::ChunkImage(uint64_t salt, std::span<const int32_t> tokens,
                                                                       ChunkUsage* usage) {
  const kv::tier::BlockKey key = Key(salt, tokens);
  if (const kv::KVManager::SequenceImage* hit = cache_.Find(key, tokens)) {
    usage->cached_tokens += static_cast<int64_t>(tokens.size());
    return hit;
  }
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<Session> alone, engine_->NewSession(salt));
  KVX_RETURN_IF_ERROR(alone->Feed(tokens).status());
  if (engine_->kv_manager().entries_removed(alone->id())) {
    return InvalidArgument("chunk reuse needs the KV of every chunk token, but the spec's policy removed entries "
                           "while a chunk was computed alone: use its mode=once (it then compresses the assembled "
                           "prompt) or no policy");
  }
  KVX_ASSIGN_OR_RETURN(kv::KVManager::SequenceImage image, engine_->kv_manager().ExportSequence(alone->id()));
  usage->computed_tokens += static_cast<int64_t>(tokens.size());
  if (on_computed_) on_computed_(salt, image);
  const kv::KVManager::SequenceImage* kept = cache_.Insert(key, image);
  if (kept != nullptr) return kept;
  uncached_.push_back(kv::CopySequenceImage(image));  // larger than the whole cache: kept for this call only
  return &uncached_.back().image;
}

Status ChunkAssembler::LoadChunkRows(const kv::KVManager::SequenceImage& image, int32_t first_position, int row,
                                     std::vector<std::vector<float>>* k, std::vector<std::vector<float>>* v) {
  kv::KVManager& manager = engine_->kv_manager();
  KVX_ASSIGN_OR_RETURN(kv::SeqId id, manager.ImportSequence(image));
  const kv::SequenceKV& seq = manager.kv(id);
  const kv::KVLayout& layout = seq.layout();
  const int hd = layout.head_dim, kv_dim = layout.n_kv_heads * hd;
  const int n = static_cast<int>(image.tokens.size());
  const ops::RopeParams rope = engine_->model().rope_params();
  std::vector<float> cs(static_cast<size_t>(rope.n_dims));
  ops::RopeCosSin(first_position, rope, cs.data());  // R(p): R(p + j) = R(p) R(j)
  std::vector<float> ck, cv;
  std::vector<int32_t> pos;
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      seq.ReadChain(l, h, &ck, &cv, &pos);
      bool in_order = static_cast<int>(pos.size()) == n;
      for (int j = 0; in_order && j < n; ++j) in_order = pos[j] == j;
      if (!in_order) {
        manager.ReleaseSequence(id);
        return Internal("a cached chunk's table does not hold its " + std::to_string(n) +
                        " tokens at positions 0..n-1");
      }
      for (int j = 0; j < n; ++j) {
        float* dk = &(*k)[l][static_cast<size_t>(row + j) * kv_dim + static_cast<size_t>(h) * hd];
        float* dv = &(*v)[l][static_cast<size_t>(row + j) * kv_dim + static_cast<size_t>(h) * hd];
        std::memcpy(dk, &ck[static_cast<size_t>(j) * hd], sizeof(float) * hd);
        std::memcpy(dv, &cv[static_cast<size_t>(j) * hd], sizeof(float) * hd);
        if (!seq.keys_pre_rope()) ops::RopeApply(dk, cs.data(), rope);
      }
    }
  }
  manager.ReleaseSequence(id);
  return Status::Ok();
}

Result<const float*> ChunkAssembler::Assemble(Session* session, std::span<const int32_t> prefix,
                                              std::span<const std::vector<int32_t>> chunks,
                                              std::span<const int32_t> suffix, const ChunkRepair& repair,
                                              ChunkUsage* usage, std::span<const std::vector<int32_t>> gaps) {
  ChunkUsage local;
  if (usage == nullptr) usage = &local;
  *usage = {};
  uncached_.clear();
  const model::ModelConfig& config = engine_->model().config();
  const int n_ctx = engine_->n_ctx();
  if (repair.mode == ChunkRepairMode::kBlend && repair.blend_layer >= config.n_layers) {
    return InvalidArgument("chunk repair blend: check layer " + std::to_string(repair.blend_layer) +
                           " is beyond the model's last layer " + std::to_string(config.n_layers - 1));
  }
  if (gaps.size() > chunks.size()) return InvalidArgument("more gaps than chunks: a gap follows its chunk");
  // Every chunk's rows and the gap after it in one list, then the suffix's.
  std::vector<int32_t> tokens;
  std::vector<std::pair<int32_t, int32_t>> chunk_spans;
  int n_chunk = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (static_cast<int64_t>(chunks[c].size()) > n_ctx) {
      return InvalidArgument("chunk " + std::to_string(c) + " holds " + std::to_string(chunks[c].size()) +
                             " tokens, more than the context (" + std::to_string(n_ctx) +
                             "): split it into smaller chunks or raise the context length (-c)");
    }
    if (!chunks[c].empty()) {
      const int32_t first = static_cast<int32_t>(tokens.size());
      chunk_spans.push_back({first, first + static_cast<int32_t>(chunks[c].size())});
      tokens.insert(tokens.end(), chunks[c].begin(), chunks[c].end());
      n_chunk += static_cast<int>(chunks[c].size());
    }
    if (c < gaps.size()) {
      tokens.insert(tokens.end(), gaps[c].begin(), gaps[c].end());
      usage->gap_tokens += static_cast<int64_t>(gaps[c].size());
    }
  }
  tokens.insert(tokens.end(), suffix.begin(), suffix.end());
  usage->prefix_tokens = static_cast<int64_t>(prefix.size());
  usage->chunk_tokens = n_chunk;
  usage->suffix_tokens = static_cast<int64_t>(suffix.size());
  const int64_t total = session->n_past() + static_cast<int64_t>(prefix.size()) + static_cast<int64_t>(tokens.size());
  if (prefix.empty() && tokens.empty()) return InvalidArgument("nothing to assemble: the prefix, chunks and suffix are all empty");
  if (total > n_ctx) {
    return InvalidArgument("the assembled prompt holds " + std::to_string(total) + " tokens (with what the session holds), "
                           "more than the context (" + std::to_string(n_ctx) + "): drop chunks or raise the context length (-c)");
  }
  const float* logits = nullptr;
  if (!prefix.empty()) {
    KVX_ASSIGN_OR_RETURN(logits, session->Feed(prefix));
  }
  if (tokens.empty()) return logits;
  if (repair.mode == ChunkRepairMode::kFull || n_chunk == 0) {
    usage->recomputed_tokens = n_chunk;
    return session->Feed(tokens);
  }
  // The cached K/V of every chunk row at its new position.
  const uint64_t salt = engine_->kv_manager().salt(session->id());
  const int kv_dim = config.n_kv_heads * config.head_dim, p0 = session->n_past();
  std::vector<std::vector<float>> cached_k(config.n_layers), cached_v(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    cached_k[l].assign(tokens.size() * static_cast<size_t>(kv_dim), 0.0f);
    cached_v[l].assign(tokens.size() * static_cast<size_t>(kv_dim), 0.0f);
  }
  for (const auto& [first, end] : chunk_spans) {
    const std::span<const int32_t> chunk(tokens.data() + first, static_cast<size_t>(end - first));
    KVX_ASSIGN_OR_RETURN(const kv::KVManager::SequenceImage* image, ChunkImage(salt, chunk, usage));
    KVX_RETURN_IF_ERROR(LoadChunkRows(*image, p0 + first, first, &cached_k, &cached_v));
  }
  uncached_.clear();
  RepairPlan plan(repair, kv_dim, static_cast<int>(tokens.size()), chunk_spans, &cached_k, &cached_v);
  StepInput in;
  in.session = session;
  in.tokens = tokens;
  in.logits = &logits_;
  in.recompute = &plan;
  const StepInput one[] = {in};
  KVX_RETURN_IF_ERROR(engine_->Step(one));
  for (int32_t row : plan.RecomputedChunkRows(config.n_layers - 1)) usage->recomputed_positions.push_back(p0 + row);
  usage->recomputed_tokens = static_cast<int64_t>(usage->recomputed_positions.size());
  return static_cast<const float*>(logits_.data());
}

}  // namespace kvx::engine
