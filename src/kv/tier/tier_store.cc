#include "kv/tier/tier_store.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include "kv/tier/ram_tier.h"
#include "util/clock.h"

namespace kvx::kv::tier {
namespace {

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

double ThisThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

Result<KVManager::SequenceImage> LoadImage(const TierLoad& load, std::span<const int32_t> tokens,
                                           const BlockSpace& space, uint64_t salt) {
  const KVLayout& l = space.layout;
  const int B = space.block_tokens, pages_per_block = (B + l.page_tokens - 1) / l.page_tokens;  // a chunk's last partial
  const size_t n_tables = static_cast<size_t>(l.n_layers) * l.n_kv_heads;
  const size_t skipped_pages = static_cast<size_t>(load.first_block) * pages_per_block;
  const size_t end = (static_cast<size_t>(load.first_block) + load.blocks.size()) * B;
  if (load.first_block < 0 || tokens.size() < end) {
    return InvalidArgument("a tier load of blocks " + std::to_string(load.first_block) + ".. needs the " +
                           std::to_string(end) + " tokens they hold, not " + std::to_string(tokens.size()));
  }
  KVManager::SequenceImage image;
  image.salt = salt;
  image.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(end));
  image.positions.assign(static_cast<size_t>(load.first_block) * B, 0);  // the shared prefix's: not read
  image.tables.resize(n_tables);
  for (SequenceKV::TableImage& t : image.tables) {
    t.length = static_cast<int>(end);
    t.full.assign(skipped_pages, 0);
    t.pages.assign(skipped_pages, {});
  }
  for (size_t i = 0; i < load.blocks.size(); ++i) {
    const ParsedBlock& b = load.blocks[i];
    const size_t first_token = static_cast<size_t>(b.index) * B;
    if (b.index != load.first_block + static_cast<int>(i) || b.block_tokens != B ||
        b.tables != static_cast<int>(n_tables) || b.pages_per_table != pages_per_block ||
        b.positions.size() != static_cast<size_t>(B) || b.model_fingerprint != space.model_fingerprint ||
        b.spec_fingerprint != space.spec_fingerprint || b.salt_digest != SaltDigest(salt) ||
        b.tokens.size() != first_token + B ||
        !std::equal(b.tokens.begin() + static_cast<std::ptrdiff_t>(first_token), b.tokens.end(),
                    tokens.begin() + static_cast<std::ptrdiff_t>(first_token))) {
      return InvalidArgument("tier block " + std::to_string(b.index) + " is not block " +
                             std::to_string(load.first_block + static_cast<int>(i)) +
                             " of these tokens for this tenant, model and block space");
    }
    image.positions.insert(image.positions.end(), b.positions.begin(), b.positions.end());
    for (size_t t = 0; t < n_tables; ++t) {
      const size_t first = t * static_cast<size_t>(pages_per_block);
      image.tables[t].full.insert(image.tables[t].full.end(), b.full.begin() + first,
                                  b.full.begin() + first + pages_per_block);
      image.tables[t].pages.insert(image.tables[t].pages.end(), b.pages.begin() + first,
                                   b.pages.begin() + first + pages_per_block);
    }
  }
  // The manager's chain of page hashes over the tokens, for the tenant.
  uint64_t chain = salt;
  for (size_t start = 0; start + l.page_tokens <= end; start += l.page_tokens) {
    chain = BlockHash(chain, std::span<const int32_t>(image.tokens.data() + start, l.page_tokens));
    image.block_hashes.push_back(chain);
  }
  return image;
}

Result<std::unique_ptr<TierStore>> TierStore::Create(BlockSpace space, std::vector<std::unique_ptr<Tier>> tiers,
                                                     TierStoreOptions options) {
  if (tiers.empty()) return InvalidArgument("a tier store needs at least one tier");
  if (tiers.size() > 32) return InvalidArgument("a tier store holds at most 32 tiers");
  if (!options.tier_levels.empty() && options.tier_levels.size() != tiers.size()) {
    return InvalidArgument("a tier store needs one storage level per tier");
  }
  for (const auto& t : tiers) {
    if (t == nullptr) return InvalidArgument("a tier store was given a null tier");
  }
  std::unique_ptr<TierStore> s(new TierStore(std::move(space), std::move(tiers), options));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

TierStore::TierStore(BlockSpace space, std::vector<std::unique_ptr<Tier>> tiers, TierStoreOptions options)
    : space_(std::move(space)), tiers_(std::move(tiers)), options_(options) {
  levels_ = options_.tier_levels;
  levels_.resize(tiers_.size(), options_.encode.level);
  for (size_t i = 0; i < tiers_.size() && i < 31; ++i) {
    tiers_[i]->SetOnDrop([this, bit = 1u << i](const BlockKey& key) { Mark(key, 0, bit); });
  }
  for (const auto& t : tiers_) {
    const std::string name = t->name();
    kinds_.push_back(name.substr(0, name.find(' ')));
    TierMetrics m;
    m.name = name;
    m.load_bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    m.load_counts.assign(m.load_bounds.size() + 1, 0);
    metrics_.push_back(std::move(m));
  }
}

TierStore::~TierStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [request, load] : lookups_) {
      load->done_.store(true, std::memory_order_release);
    }
    lookups_.clear();
    for (WriteJob& job : writes_) {
      if (job.load) job.load->Cancel();  // served at once: it stops before its first block
    }
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<PendingLoad> TierStore::Lookup(LookupRequest request) {
  auto load = std::make_shared<PendingLoad>();
  std::lock_guard<std::mutex> lock(mu_);
  counters_.lookups++;
  if (request.after_writes) {
    WriteJob job;
    job.load = load;
    job.lookup = std::move(request);
    writes_.push_back(std::move(job));
  } else {
    lookups_.emplace_back(std::move(request), load);
  }
  wake_.notify_all();
  return load;
}

void TierStore::SetOnLoad(std::function<void()> on_load) {
  std::lock_guard<std::mutex> lock(mu_);
  on_load_ = std::move(on_load);
}

void TierStore::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !lookups_.empty() || !writes_.empty(); });
    if (!lookups_.empty()) {  // loads first: a request waits for them
      auto [request, load] = std::move(lookups_.front());
      lookups_.pop_front();
      ServeLookup(request, load, lock);
    } else if (!writes_.empty()) {
      WriteJob job = std::move(writes_.front());
      writes_.pop_front();
      if (job.load) {
        ServeLookup(job.lookup, job.load, lock);
      } else if (job.pin) {
        busy_ = true;
        lock.unlock();
        RunPin(job.lookup, *job.pin);
        lock.lock();
      } else {
        busy_ = true;
        lock.unlock();
        RunWrite(job);
        lock.lock();
        pending_write_bytes_ -= job.bytes;
      }
    } else {
      break;  // stopping, and every write is done
    }
    counters_.io_cpu_seconds = ThisThreadCpuSeconds();
    busy_ = false;
    idle_.notify_all();
  }
  busy_ = false;
  idle_.notify_all();
}

void TierStore::ServeLookup(const LookupRequest& request, const std::shared_ptr<PendingLoad>& load,
                            std::unique_lock<std::mutex>& lock) {
  busy_ = true;
  lock.unlock();
  RunLookup(request, *load);
  lock.lock();
  load->done_.store(true, std::memory_order_release);
  if (on_load_) on_load_();
}

void TierStore::ServeQueuedLookups() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!lookups_.empty()) {
    auto [request, load] = std::move(lookups_.front());
    lookups_.pop_front();
    ServeLookup(request, load, lock);
  }
}

void TierStore::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return lookups_.empty() && writes_.empty() && !busy_; });
}

void TierStore::RecordLoad(size_t tier, double seconds, bool hit) {
  std::lock_guard<std::mutex> lock(mu_);
  TierMetrics& m = metrics_[tier];
  if (hit) m.hit_blocks++;
  const size_t b = std::lower_bound(m.load_bounds.begin(), m.load_bounds.end(), seconds) - m.load_bounds.begin();
  m.load_counts[b]++;
  m.load_seconds += seconds;
  m.loads++;
}

std::optional<ParsedBlock> TierStore::GetBlock(size_t t, const BlockRequest& request, std::string* bytes) {
  const double ts = util::MonotonicSeconds();
  std::optional<std::string> got = tiers_[t]->Get(request.key);
  if (!got) {
    RecordLoad(t, util::MonotonicSeconds() - ts, false);
    return std::nullopt;
  }
  Result<ParsedBlock> block = DecodeBlock(AsBytes(*got), request);
  RecordLoad(t, util::MonotonicSeconds() - ts, block.ok());
  if (!block.ok()) {
    // Damaged: never served, never read again. Another block (NotFound) or
    // another version (Unimplemented: an older or newer kvx sharing the
    // tier) is a miss and stays for its readers.
    const StatusCode code = block.status().code();
    if (code != StatusCode::kNotFound && code != StatusCode::kUnimplemented) {
      tiers_[t]->DropCorrupt(request.key);
      std::lock_guard<std::mutex> lock(mu_);
      counters_.corrupt_blocks++;
    }
    return std::nullopt;
  }
  *bytes = std::move(*got);
  return std::move(block).value();
}

void TierStore::RunChunkLookup(const LookupRequest& q, PendingLoad& load) {
  TierLoad& out = load.result_;
  const double t0 = util::MonotonicSeconds();
  out.chunks.resize(q.chunks.size());
  out.tier_of_chunk.assign(q.chunks.size(), -1);
  for (size_t c = 0; c < q.chunks.size() && !load.cancelled_.load(std::memory_order_relaxed); ++c) {
    const Result<BlockSpace> space = ChunkSpace(space_, static_cast<int>(q.chunks[c].size()));
    if (!space.ok()) continue;
    const BlockKey key = ChunkKey(*space, q.salt, q.chunks[c]);
    for (size_t t = 0; t < tiers_.size() && !out.chunks[c]; ++t) {
      std::string bytes;
      out.chunks[c] = GetBlock(t, {&*space, q.salt, q.chunks[c], 0, key, level(t)}, &bytes);
      if (out.chunks[c]) out.tier_of_chunk[c] = static_cast<int>(t);
    }
  }
  out.seconds = util::MonotonicSeconds() - t0;
}

void TierStore::RunLookup(const LookupRequest& q, PendingLoad& load) {
  if (!q.chunks.empty()) return RunChunkLookup(q, load);
  TierLoad& out = load.result_;
  const double t0 = util::MonotonicSeconds();
  const int B = space_.block_tokens;
  const std::vector<BlockKey> keys = BlockKeys(space_, q.salt, q.tokens);
  const int n = std::min<int>(q.max_blocks, static_cast<int>(keys.size()));
  out.first_block = std::max(q.first_block, 0);
  WriteJob promote;  // blocks found below the first tier, copied up
  for (int i = out.first_block; i < n && !load.cancelled_.load(std::memory_order_relaxed); ++i) {
    const double elapsed = util::MonotonicSeconds() - t0;
    const int loaded = i - out.first_block;
    if (q.recompute_seconds_per_token > 0 && loaded > 0 && elapsed > loaded * B * q.recompute_seconds_per_token) {
      out.abandoned = true;  // slower than recomputing what is loaded: recompute the rest
      break;
    }
    bool found = false;
    for (size_t t = 0; t < tiers_.size() && !found; ++t) {
      std::string bytes;
      std::optional<ParsedBlock> block = GetBlock(t, {&space_, q.salt, q.tokens, i, keys[i], level(t)}, &bytes);
      if (!block) continue;
      found = true;
      const StorageLevel stored = block->level;
      out.blocks.push_back(std::move(*block));
      out.tier_of_block.push_back(static_cast<int>(t));
      Mark(keys[i], 1u << t, 0);
      uint32_t above = 0;  // the tiers above that serve the block's level get a copy
      for (size_t u = 0; u < t; ++u) above |= AcceptsLevel(level(u), stored) ? 1u << u : 0;
      if (above != 0) {
        promote.encoded.push_back(EncodedBlock{keys[i], std::move(bytes), stored});
        promote.put_in.push_back(above);
      }
    }
    if (!found) break;
  }
  out.seconds = util::MonotonicSeconds() - t0;
  std::lock_guard<std::mutex> lock(mu_);
  if (out.abandoned) counters_.abandoned++;
  if (!promote.encoded.empty()) {
    for (const EncodedBlock& b : promote.encoded) promote.bytes += b.bytes.size();
    pending_write_bytes_ += promote.bytes;
    writes_.push_back(std::move(promote));
  }
}

void TierStore::RunChunkWrite(const WriteJob& job) {
  const KVManager::SequenceImage& image = job.chunk->image;
  const Result<BlockSpace> space = ChunkSpace(space_, static_cast<int>(image.tokens.size()));
  if (!space.ok()) return;
  BlockEncodeOptions options = options_.encode;
  options.level = StorageLevel::kLossless;
  if (!encoder_.Encode(*space, job.lookup.salt, image, 0, options).ok()) return;
  uint32_t held = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) held |= tiers_[t]->Put(encoder_.key(), encoder_.bytes()).ok() ? 1u << t : 0;
  Stored(encoder_.key(), held);
}

void TierStore::RunWrite(WriteJob& job) {
  if (job.chunk) return RunChunkWrite(job);
  if (job.snapshot) {  // each block encoded once per storage level its tiers write, and put at once
    const BlockSnapshot& s = *job.snapshot;
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      ServeQueuedLookups();
      uint32_t levels_done = 0, held = 0;
      bool encoded = false;
      for (size_t t = 0; t < tiers_.size(); ++t) {
        const StorageLevel l = level(t);
        if (levels_done & (1u << static_cast<int>(l))) continue;
        levels_done |= 1u << static_cast<int>(l);
        BlockEncodeOptions options = options_.encode;
        options.level = l;
        if (!encoder_.Encode(space_, s.salt, s.image, s.blocks[i], options).ok()) break;  // not storable after all
        encoded = true;
        for (size_t u = 0; u < tiers_.size(); ++u) {
          if (level(u) == l) held |= tiers_[u]->Put(s.keys[i], encoder_.bytes()).ok() ? 1u << u : 0;
        }
      }
      if (encoded) {
        Stored(s.keys[i], held);
      } else {
        Mark(s.keys[i], 0, kWriting);  // not storable (e.g. a staging page): forgotten
      }
    }
    job.snapshot.reset();  // the pages' copies go as soon as they are written
  }
  // Promotions: consecutive encodings of one key are one block, held by the tiers that took one.
  for (size_t i = 0; i < job.encoded.size();) {
    ServeQueuedLookups();
    const BlockKey key = job.encoded[i].key;
    uint32_t held = 0;
    for (; i < job.encoded.size() && job.encoded[i].key == key; ++i) {
      for (size_t t = 0; t < tiers_.size(); ++t) {
        if (job.put_in[i] & (1u << t)) held |= tiers_[t]->Put(key, job.encoded[i].bytes).ok() ? 1u << t : 0;
      }
    }
    Stored(key, held);
  }
}

void TierStore::Stored(const BlockKey& key, uint32_t held) {
  Mark(key, held, kWriting);  // no tier has it: forgotten, a later sequence may write it
  std::lock_guard<std::mutex> lock(mu_);
  if (held != 0) {
    counters_.blocks_written++;
  } else {
    counters_.write_errors++;
  }
}

void TierStore::RunPin(const LookupRequest& what, bool on) {
  auto* ram = dynamic_cast<RamTier*>(tiers_[0].get());
  if (ram == nullptr) return;
  const std::vector<BlockKey> keys = BlockKeys(space_, what.salt, what.tokens);
  for (size_t i = 0; i < keys.size(); ++i) {
    ram->Pin(keys[i], on);
    if (!on || ram->Has(keys[i])) continue;
    // Copied up from the first lower tier holding a block the RAM tier would
    // serve (DecodeBlock, as a lookup reads it: sound, this block, a level
    // it accepts); a lossier block would be a miss there, wasted RAM.
    const BlockRequest request{&space_, what.salt, what.tokens, static_cast<int>(i), keys[i], level(0)};
    for (size_t t = 1; t < tiers_.size(); ++t) {
      std::optional<std::string> bytes = tiers_[t]->Get(keys[i]);
      if (!bytes || !DecodeBlock(AsBytes(*bytes), request).ok()) continue;
      if (ram->Put(keys[i], *bytes).ok()) Mark(keys[i], 1u, 0);
      break;
    }
  }
}

void TierStore::Pin(uint64_t salt, std::vector<int32_t> tokens, bool on) {
  WriteJob job;
  job.pin = on;
  job.lookup.salt = salt;
  job.lookup.tokens = std::move(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  writes_.push_back(std::move(job));
  wake_.notify_all();
}

uint64_t TierStore::pin_capacity() const {
  const auto* ram = dynamic_cast<const RamTier*>(tiers_[0].get());
  return ram != nullptr ? ram->max_bytes() : 0;
}

void TierStore::Mark(const BlockKey& key, uint32_t set, uint32_t clear) {
  std::lock_guard<std::mutex> lock(known_mu_);
  auto it = known_.find(key);
  if (it == known_.end()) {
    if (set == 0) return;
    if (known_.size() >= options_.max_known_keys) known_.clear();
    it = known_.emplace(key, 0).first;
  }
  it->second = (it->second | set) & ~clear;
  if (it->second == 0) known_.erase(it);
}

bool TierStore::Known(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(known_mu_);
  return known_.count(key) != 0;
}

std::optional<BlockSnapshot> TierStore::Snapshot(const KVManager& m, SeqId seq) {
  if (m.entries_removed(seq)) return std::nullopt;
  const std::vector<int32_t>& tokens = m.tokens(seq);
  const int B = space_.block_tokens;
  const std::vector<BlockKey> keys = BlockKeys(space_, m.salt(seq), tokens);
  BlockSnapshot s;
  for (int i = 0; i < static_cast<int>(keys.size()); ++i) {
    if (!Known(keys[i])) {
      s.blocks.push_back(i);
      s.keys.push_back(keys[i]);
    }
  }
  if (s.blocks.empty()) return std::nullopt;
  Result<KVManager::SequenceImage> exported = m.ExportSequence(seq);
  if (!exported.ok()) return std::nullopt;  // a codec the block format does not carry
  const KVManager::SequenceImage& e = *exported;
  // The snapshot ends with the last block to write; it copies only the
  // pages of the blocks it writes (EncodeBlock reads no other), and stops
  // at the first block still in a sealed layer's f16 staging window.
  const int ppb = B / space_.layout.page_tokens;
  const size_t n_heads = static_cast<size_t>(space_.layout.n_kv_heads);
  std::vector<int> blocks;
  for (int b : s.blocks) {
    bool final_pages = true;
    for (size_t t = 0; t < e.tables.size() && final_pages; ++t) {
      const LayerCodec& lc = space_.layers[t / n_heads];
      for (int p = b * ppb; p < (b + 1) * ppb; ++p) final_pages = final_pages && !(e.tables[t].full[p] && p >= lc.sink_pages);
    }
    if (!final_pages) break;
    blocks.push_back(b);
  }
  s.keys.resize(blocks.size());
  s.blocks = std::move(blocks);
  if (s.blocks.empty()) return std::nullopt;
  const int end = (s.blocks.back() + 1) * B;
  s.salt = e.salt;
  s.image.salt = e.salt;
  s.image.tokens.assign(e.tokens.begin(), e.tokens.begin() + end);
  s.image.positions.assign(e.positions.begin(), e.positions.begin() + end);
  s.image.tables.resize(e.tables.size());
  for (size_t t = 0; t < e.tables.size(); ++t) {
    SequenceKV::TableImage& ti = s.image.tables[t];
    ti.length = end;
    ti.full.assign(e.tables[t].full.begin(), e.tables[t].full.begin() + end / space_.layout.page_tokens);
    ti.pages.resize(ti.full.size());
    for (int b : s.blocks) {
      for (int p = b * ppb; p < (b + 1) * ppb; ++p) {
        const std::span<const uint8_t> page = e.tables[t].pages[p];
        s.storage.emplace_back(page.begin(), page.end());
        ti.pages[p] = s.storage.back();
        s.bytes += page.size();
      }
    }
  }
  for (const BlockKey& k : s.keys) Mark(k, kWriting, 0);
  return s;
}

void TierStore::Write(BlockSnapshot snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_write_bytes_ + snapshot.bytes > options_.max_pending_write_bytes) {
    counters_.writes_dropped += snapshot.blocks.size();
    for (const BlockKey& k : snapshot.keys) Mark(k, 0, kWriting);
    return;
  }
  WriteJob job;
  job.bytes = snapshot.bytes;
  job.snapshot = std::move(snapshot);
  pending_write_bytes_ += job.bytes;
  writes_.push_back(std::move(job));
  wake_.notify_all();
}

void TierStore::WriteChunk(uint64_t salt, const KVManager::SequenceImage& image) {
  if (image.tokens.empty() || image.tokens.size() > static_cast<size_t>(kMaxBlockTokens) || image.entries_removed) return;
  WriteJob job;
  job.lookup.salt = salt;
  job.chunk = CopySequenceImage(image);
  job.bytes = job.chunk->page_bytes;
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_write_bytes_ + job.bytes > options_.max_pending_write_bytes) {
    counters_.writes_dropped++;
    return;
  }
  pending_write_bytes_ += job.bytes;
  writes_.push_back(std::move(job));
  wake_.notify_all();
}

std::vector<TierMetrics> TierStore::Metrics() const {
  std::vector<TierMetrics> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = metrics_;
  }
  for (size_t t = 0; t < tiers_.size(); ++t) out[t].stats = tiers_[t]->stats();
  return out;
}

TierStoreCounters TierStore::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace kvx::kv::tier
