#include "kv/kv_manager.h"

#include <algorithm>
#include <unordered_map>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/policy/policy.h"
#include "util/step_profile.h"
#include "util/check.h"

namespace kvx::kv {

uint64_t BlockHash(uint64_t seed, std::span<const int32_t> block) {
  return XXH3_64bits_withSeed(block.data(), block.size() * sizeof(int32_t), seed);
}

Result<std::unique_ptr<KVManager>> KVManager::Create(ResolvedKVSpec spec, const KVManagerOptions& options) {
  std::unique_ptr<KVManager> m(new KVManager(std::move(spec), options));
  BlockPoolOptions o;
  o.budget_bytes = m->spec_.budget_bytes;
  o.page_bytes = PageBytes(m->spec_.layers);
  o.extent_bytes = ExtentBytesFor(m->spec_.layout, o.budget_bytes, m->spec_.n_seqs);
  KVX_ASSIGN_OR_RETURN(m->pool_, BlockPool::Create(o));
  for (std::unique_ptr<KVPolicy>& policy : m->spec_.policies) m->AddPolicy(std::move(policy));
  m->spec_.policies.clear();  // adopted: policies() holds them
  return m;
}

KVManager::KVManager(ResolvedKVSpec spec, const KVManagerOptions& options)
    : spec_(std::move(spec)), options_(options) {}

KVManager::~KVManager() {
  if (in_step_) AbortStep();
  seqs_.clear();  // before the pool
}

KVManager::Sequence& KVManager::Seq(SeqId id) {
  auto it = seqs_.find(id);
  KVX_CHECK_MSG(it != seqs_.end(), "unknown sequence id");
  return it->second;
}

const KVManager::Sequence& KVManager::Seq(SeqId id) const {
  auto it = seqs_.find(id);
  KVX_CHECK_MSG(it != seqs_.end(), "unknown sequence id");
  return it->second;
}

SeqId KVManager::AddSequence(uint64_t salt) {
  KVX_CHECK(!in_step_);
  const SeqId id = next_id_++;
  Sequence& s = seqs_[id];
  s.kv = std::make_unique<SequenceKV>(pool_.get(), spec_.layout, spec_.spec.codec, spec_.layers);
  s.salt = salt;
  return id;
}

Result<SeqId> KVManager::ForkPrefix(SeqId src_id, int n_tokens) {
  KVX_CHECK(!in_step_);
  if (!HasSequence(src_id)) return NotFound("no sequence " + std::to_string(src_id));
  const Sequence& src = Seq(src_id);
  if (src.entries_removed) {
    if (n_tokens != static_cast<int>(src.tokens.size())) {
      return InvalidArgument("sequence " + std::to_string(src_id) +
                             " had entries removed by a policy: its pages no longer hold its token prefix, so only "
                             "the whole sequence (" + std::to_string(src.tokens.size()) +
                             " tokens) can be forked, not " + std::to_string(n_tokens));
    }
    // The whole sequence: every page shared (appends copy a shared last
    // page first), tokens, positions and hashes as they are.
    const SeqId id = next_id_++;
    Sequence& s = seqs_[id];
    s.kv = src.kv->Fork();
    s.tokens = src.tokens;
    s.positions = src.positions;
    s.salt = src.salt;
    s.block_hashes = src.block_hashes;
    s.entries_removed = true;
    return id;
  }
  if (n_tokens < 0 || n_tokens > static_cast<int>(src.tokens.size())) {
    return InvalidArgument("prefix of " + std::to_string(n_tokens) + " tokens is outside sequence " +
                           std::to_string(src_id) + " of " + std::to_string(src.tokens.size()) + " tokens");
  }
  KVX_ASSIGN_OR_RETURN(auto kv, src.kv->ForkPrefix(n_tokens));
  const SeqId id = next_id_++;
  Sequence& s = seqs_[id];
  s.kv = std::move(kv);
  s.tokens.assign(src.tokens.begin(), src.tokens.begin() + n_tokens);
  s.positions.assign(src.positions.begin(), src.positions.begin() + n_tokens);
  s.salt = src.salt;
  const size_t blocks = static_cast<size_t>(n_tokens / spec_.layout.page_tokens);
  s.block_hashes.assign(src.block_hashes.begin(), src.block_hashes.begin() + std::min(blocks, src.block_hashes.size()));
  return id;
}

Result<SeqId> KVManager::ImportSequence(const SequenceImage& image, SharedPrefix prefix) {
  KVX_CHECK(!in_step_);
  const size_t n = image.tokens.size();
  const Sequence* src = nullptr;
  if (prefix.tokens > 0) {
    const int T = spec_.layout.page_tokens;
    if (!HasSequence(prefix.from)) return InvalidArgument("no sequence " + std::to_string(prefix.from) + " to share");
    src = &Seq(prefix.from);
    if (prefix.tokens % T != 0 || prefix.tokens > static_cast<int>(std::min(n, src->tokens.size())) ||
        src->entries_removed) {
      return InvalidArgument("a shared prefix must be whole pages that both the sequence and the image hold");
    }
  }
  if (image.positions.size() != n) {
    return DataLoss(std::to_string(n) + " tokens but " + std::to_string(image.positions.size()) + " positions");
  }
  if (n > static_cast<size_t>(spec_.n_ctx)) {
    return InvalidArgument("the saved sequence holds " + std::to_string(n) + " tokens, more than the context length " +
                           std::to_string(spec_.n_ctx) + "; raise the context length (-c)");
  }
  for (size_t i = 0; i < n; ++i) {
    if (image.tokens[i] < 0) return DataLoss("token " + std::to_string(i) + " has a negative id");
    if (static_cast<int>(i) < prefix.tokens) continue;  // the shared sequence's positions
    if (image.positions[i] < 0 || image.positions[i] >= spec_.n_ctx) {
      return InvalidArgument("saved position " + std::to_string(image.positions[i]) + " is outside the context 0.." +
                             std::to_string(spec_.n_ctx - 1) + "; raise the context length (-c)");
    }
  }
  // The hash chain is a function of the tokens and the salt: recompute it.
  Sequence probe;
  probe.tokens = image.tokens;
  probe.salt = image.salt;
  ExtendHashes(probe);
  const bool chained = image.block_hashes.size() <= probe.block_hashes.size() &&
                       std::equal(image.block_hashes.begin(), image.block_hashes.end(), probe.block_hashes.begin());
  if (!chained || (!image.entries_removed && image.block_hashes.size() != probe.block_hashes.size())) {
    return DataLoss("the block hashes are not those of the saved tokens");
  }
  const size_t shared_blocks = static_cast<size_t>(prefix.tokens / spec_.layout.page_tokens);
  if (src != nullptr && (src->block_hashes.size() < shared_blocks ||
                         !std::equal(probe.block_hashes.begin(), probe.block_hashes.begin() + shared_blocks,
                                     src->block_hashes.begin()))) {
    return InvalidArgument("the shared sequence does not hold the image's first " + std::to_string(prefix.tokens) +
                           " tokens");
  }
  if (!image.entries_removed) {
    for (size_t i = 0; i < image.tables.size(); ++i) {
      if (image.tables[i].length != static_cast<int>(n)) {
        const int H = spec_.layout.n_kv_heads;
        return DataLoss("table (layer " + std::to_string(i / H) + ", kv head " + std::to_string(i % H) + ") holds " +
                        std::to_string(image.tables[i].length) + " slots for " + std::to_string(n) + " tokens");
      }
    }
  }
  auto kv = std::make_unique<SequenceKV>(pool_.get(), spec_.layout, spec_.spec.codec, spec_.layers);
  KVX_RETURN_IF_ERROR(kv->Import(image.tables, src ? src->kv.get() : nullptr, static_cast<int>(shared_blocks)));
  if (!image.entries_removed) {
    for (int l = 0; l < spec_.layout.n_layers; ++l) {
      for (int h = 0; h < spec_.layout.n_kv_heads; ++h) {
        if (kv->LiveEntries(l, h) != static_cast<int>(n)) {
          return DataLoss("a page table holds dead entries but the sequence says none were removed");
        }
      }
    }
  }
  const SeqId id = next_id_++;
  Sequence& s = seqs_[id];
  s.kv = std::move(kv);
  s.tokens = image.tokens;
  s.positions = image.positions;
  if (src != nullptr) std::copy_n(src->positions.begin(), prefix.tokens, s.positions.begin());
  s.block_hashes = image.block_hashes;
  s.salt = image.salt;
  s.entries_removed = image.entries_removed;
  return id;
}

namespace {

// An image holds each page as f16 or packed in the layer codec, and nothing
// beside the pages: pages of the other formats, and tables that read their
// pages through side data, cannot be exported yet. One refusal names every
// such kind the sequence holds, why, and what to do (session files and the
// eval prefill cache both export through here).
Status CheckExportable(const SequenceKV& kv) {
  struct Unexportable {
    const char* what;    // the pages
    const char* policy;  // the policy that writes them
    const char* why;     // what an image has no field for
    const char* also;    // a way out besides exporting before compressing ("" when none)
  };
  static constexpr Unexportable kMerged{"pages merged across layers", "policy=minicache",
                                        "shared pages read with per-layer norms", ""};
  static constexpr Unexportable kPruned{"key-channel-pruned pages", "policy think",
                                        "pruned keys and their channel masks", ""};
  static constexpr Unexportable kDemoted{"demoted pages", "policy mikv / fate=demote", "pages in the demotion codec",
                                         "use fate=drop instead of fate=demote"};
  bool pruned = kv.KeyChannelBytes() > 0, demoted = false;
  const KVLayout& layout = kv.layout();
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      const PageTable& t = kv.table(l, h);
      for (int p = 0; p < t.num_pages(); ++p) {
        if (t.format(p) == kPagePruned) {
          pruned = true;
        } else if (t.format(p) != kPagePacked && t.format(p) != kPageFull) {
          demoted = true;
        }
      }
    }
  }
  std::vector<const Unexportable*> found;
  if (kv.EntryScaleBytes() > 0) found.push_back(&kMerged);
  if (pruned) found.push_back(&kPruned);
  if (demoted) found.push_back(&kDemoted);
  if (found.empty()) return Status::Ok();
  std::string msg = "this sequence's KV cache cannot be exported yet: it holds ";
  std::string fixes = "save (export) before compressing";
  for (size_t i = 0; i < found.size(); ++i) {
    if (i > 0) msg += i + 1 < found.size() ? ", " : " and ";
    msg += std::string(found[i]->what) + " (" + found[i]->policy + ": an exported image has no field for " +
           found[i]->why + ")";
    if (*found[i]->also != '\0') fixes += std::string(", or ") + found[i]->also;
  }
  return Unimplemented(msg + "; " + fixes);
}

}  // namespace

Result<KVManager::SequenceImage> KVManager::ExportSequence(SeqId id) const {
  KVX_CHECK(!in_step_);
  const Sequence& s = Seq(id);
  SequenceImage image;
  image.tokens = s.tokens;
  image.positions = s.positions;
  image.block_hashes = s.block_hashes;
  image.salt = s.salt;
  image.entries_removed = s.entries_removed;
  KVX_RETURN_IF_ERROR(CheckExportable(*s.kv));
  const KVLayout& layout = spec_.layout;
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      const PageTable& t = s.kv->table(l, h);
      SequenceKV::TableImage& ti = image.tables.emplace_back();
      ti.length = t.length();
      for (int p = 0; p < t.num_pages(); ++p) {
        const PageId page = t.pages()[p];
        ti.full.push_back(t.is_full(p) ? 1 : 0);
        ti.pages.emplace_back(pool_->PageData(page), pool_->PageBytesOf(page));
      }
    }
  }
  return image;
}

void KVManager::ReleaseSequence(SeqId id) {
  KVX_CHECK(!in_step_);
  for (const auto& p : policies_) p->OnSequenceReleased(id);
  seqs_.erase(id);
  MaybeReleaseMemory();
}

void KVManager::ResetSequence(SeqId id) {
  KVX_CHECK(!in_step_);
  Sequence& s = Seq(id);
  for (const auto& p : policies_) p->OnSequenceReleased(id);
  s.kv->Clear();
  s.tokens.clear();
  s.positions.clear();
  s.block_hashes.clear();
  s.entries_removed = false;
}

std::vector<SeqId> KVManager::SequenceIds() const {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

void KVManager::MarkEntriesRemoved(SeqId id) {
  Sequence& s = Seq(id);
  s.entries_removed = true;
}

void KVManager::MaybeReleaseMemory() {
  const BlockPoolStats st = pool_->Stats();
  const uint64_t idle = st.bytes_committed_estimate > st.bytes_in_use ? st.bytes_committed_estimate - st.bytes_in_use : 0;
  if (idle > options_.release_watermark_bytes || (options_.release_watermark_bytes == 0 && idle > 0)) {
    pool_->ReleaseFreeMemory();
  }
}

Status KVManager::BeginStep(std::span<const StepRequest> requests) {
  KVX_CHECK_MSG(!in_step_, "BeginStep during a step");
  // 1. Validate everything before touching anything.
  std::vector<SeqId> seen;
  for (const StepRequest& r : requests) {
    if (!HasSequence(r.seq)) return NotFound("step names unknown sequence " + std::to_string(r.seq));
    if (std::find(seen.begin(), seen.end(), r.seq) != seen.end()) {
      return InvalidArgument("sequence " + std::to_string(r.seq) + " appears twice in one step");
    }
    seen.push_back(r.seq);
    if (r.tokens.empty()) return InvalidArgument("sequence " + std::to_string(r.seq) + " has no tokens in the step");
    if (r.tokens.size() != r.positions.size()) return InvalidArgument("step tokens and positions differ in length");
    const Sequence& s = Seq(r.seq);
    const size_t held = s.tokens.size();
    if (held + r.tokens.size() > static_cast<size_t>(spec_.n_ctx)) {
      return InvalidArgument("context is full: " + std::to_string(held) + " tokens in the context + " +
                             std::to_string(r.tokens.size()) + " new tokens > context length " +
                             std::to_string(spec_.n_ctx) + "; shorten the prompt or raise the context length (-c)");
    }
    for (int32_t p : r.positions) {
      if (p < 0 || p >= spec_.n_ctx) {
        return InvalidArgument("position " + std::to_string(p) + " is outside the context 0.." +
                               std::to_string(spec_.n_ctx - 1));
      }
    }
  }
  // 2. Reserve every page, all sequences or none.
  for (size_t i = 0; i < requests.size(); ++i) {
    Status s = Seq(requests[i].seq).kv->Reserve(static_cast<int>(requests[i].tokens.size()));
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) Seq(requests[j].seq).kv->CancelReservation();
      return s;
    }
  }
  in_step_ = true;
  step_data_.clear();
  step_.clear();
  for (const StepRequest& r : requests) {
    step_data_.emplace_back(r.tokens.begin(), r.tokens.end());
    step_data_.emplace_back(r.positions.begin(), r.positions.end());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    step_.push_back({requests[i].seq, step_data_[2 * i], step_data_[2 * i + 1]});
  }
  return Status::Ok();
}

void KVManager::AbortStep() {
  KVX_CHECK(in_step_);
  for (const StepRequest& r : step_) Seq(r.seq).kv->CancelReservation();
  step_.clear();
  step_data_.clear();
  in_step_ = false;
}

void KVManager::ExtendHashes(Sequence& s) const {
  if (s.entries_removed) return;
  const size_t T = static_cast<size_t>(spec_.layout.page_tokens);
  for (size_t b = s.block_hashes.size(); (b + 1) * T <= s.tokens.size(); ++b) {
    const uint64_t seed = b == 0 ? s.salt : s.block_hashes[b - 1];
    s.block_hashes.push_back(BlockHash(seed, std::span<const int32_t>(&s.tokens[b * T], T)));
  }
}

Status KVManager::CommitStep() {
  KVX_CHECK(in_step_);
  for (const StepRequest& r : step_) {
    Sequence& s = Seq(r.seq);
    s.kv->CancelReservation();  // pages a step planned but did not take (a copy made unnecessary)
    s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
    s.positions.insert(s.positions.end(), r.positions.begin(), r.positions.end());
    ExtendHashes(s);
  }
  in_step_ = false;
  util::ScopedPhase phase(util::StepPhase::kPolicy);
  for (const auto& policy : policies_) {
    for (const StepRequest& r : step_) {
      if (Status st = policy->OnStepCommitted(*this, r.seq); !st.ok()) {
        return st.WithContext(std::string("policy ") + std::string(policy->name()));
      }
    }
  }
  return Status::Ok();
}

Status KVManager::Compress(SeqId seq) {
  KVX_CHECK(!in_step_);
  if (!HasSequence(seq)) return NotFound("no sequence " + std::to_string(seq));
  util::ScopedPhase phase(util::StepPhase::kPolicy);
  for (const auto& policy : policies_) {
    if (Status st = policy->Compress(*this, seq); !st.ok()) {
      return st.WithContext(std::string("policy ") + std::string(policy->name()));
    }
  }
  // What the policies freed leaves the process too (the same rule as a
  // sequence's end), so compression lowers RSS, not just the pool's count.
  MaybeReleaseMemory();
  return Status::Ok();
}

bool KVManager::HasOncePolicy() const {
  for (const auto& policy : policies_) {
    if (policy->compresses_once()) return true;
  }
  return false;
}

std::optional<int> KVManager::PromptWindow() const {
  int window = 0;
  for (const auto& policy : policies_) {
    const std::optional<int> w = policy->prompt_window();
    if (!w.has_value()) return std::nullopt;
    window = std::max(window, *w);
  }
  return window;
}

void KVManager::AddPolicy(std::unique_ptr<KVPolicy> policy) { policies_.push_back(std::move(policy)); }

Status KVManager::CheckInvariants() const {
  KVX_RETURN_IF_ERROR(pool_->CheckInvariants());
  std::unordered_map<PageId, int32_t> refs;
  for (const auto& [id, s] : seqs_) {
    const std::string name = "sequence " + std::to_string(id);
    if (Status st = s.kv->CheckTables(); !st.ok()) return Internal(name + ": " + st.message());
    if (s.tokens.size() != s.positions.size()) return Internal(name + ": token and position counts differ");
    if (!s.entries_removed) {
      const size_t T = static_cast<size_t>(spec_.layout.page_tokens);
      if (s.block_hashes.size() != s.tokens.size() / T) return Internal(name + ": block hashes out of step");
      for (int l = 0; l < spec_.layout.n_layers; ++l) {
        for (int h = 0; h < spec_.layout.n_kv_heads; ++h) {
          if (s.kv->Length(l, h) != static_cast<int>(s.tokens.size()) ||
              s.kv->LiveEntries(l, h) != static_cast<int>(s.tokens.size())) {
            return Internal(name + ": table (" + std::to_string(l) + ", " + std::to_string(h) + ") holds " +
                            std::to_string(s.kv->LiveEntries(l, h)) + " entries for " +
                            std::to_string(s.tokens.size()) + " tokens");
          }
        }
      }
    }
    s.kv->ForEachPage([&](PageId p) { ++refs[p]; });
  }
  int64_t listed = 0;
  for (const auto& [page, n] : refs) {
    if (pool_->RefCount(page) != n) {
      return Internal("page " + std::to_string(page) + " has refcount " + std::to_string(pool_->RefCount(page)) +
                      " but " + std::to_string(n) + " references from sequences");
    }
    ++listed;
  }
  if (listed != pool_->pages_in_use()) {
    return Internal(std::to_string(pool_->pages_in_use()) + " pages in use, " + std::to_string(listed) +
                    " referenced by sequences (a leak)");
  }
  return Status::Ok();
}

uint64_t KVManager::SideBytes(SeqId seq) const {
  uint64_t bytes = kv(seq).SideBytes();
  for (const auto& p : policies_) bytes += p->SideBytes(seq);
  return bytes;
}

}  // namespace kvx::kv
