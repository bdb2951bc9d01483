// SequenceKV: the KV cache of one sequence (one session's context): for every
// (layer, kv-head) a PageTable of pages from a shared BlockPool, encoded as the
// CodecConfig says (codec_config.h; per layer, so layers may differ in bits).
// The forward pass appends each layer's new K/V here and reads it back through
// Attention() (kv/attention.h).
//
// Writing pages. A token goes
//   * straight into a packed page (EncodeRow) for row-wise codecs without a
//     residual window or outliers (f32, f16, int8/4/2): llama.cpp's q8_0/q4_0
//     behaviour;
//   * otherwise into an f16 staging page. Once a staging page is full and all
//     its tokens are older than the newest `residual` tokens, it is SEALED:
//     its rows (plus any new rows that complete it) are encoded at once
//     (EncodePage) into a page of the codec's size class and the staging page
//     is released. Pages that fill up and leave the window inside one Append
//     (a long prompt) are encoded from the input directly, never staged.
//   * Sink pages (the first ceil(sinks/page_tokens) pages) stay f16.
// Rotation (Hadamard) is applied to K and V here, before any encoding, so
// every page of the chain lives in the rotated basis; Attention rotates the
// queries to match and rotates the outputs back. With pre-RoPE keys the
// caller appends un-roped K; set_rope() hands over the RoPE parameters that
// Attention applies at read time, from a per-position cos/sin table kept here
// (positions * rope_dims floats, shared by all layers and heads).
//
// Ownership: a SequenceKV holds one pool reference per page it lists and drops
// them in Clear()/the destructor. Pages may be shared with other sequences
// (Fork()); a shared partially filled last page is copied before it is
// written (copy-on-write), so sharing is invisible to the forward pass.
//
// Thread-safety: not thread-safe to mutate; Attention() may read one
// SequenceKV from many threads while nothing appends to it. Mutations also
// touch the pool, so sequences sharing a pool must be mutated by one thread
// at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/codec/codec_config.h"
#include "kv/codec/codec_id.h"
#include "kv/codec/hadamard.h"
#include "kv/layout.h"
#include "kv/page_selection.h"
#include "kv/page_table.h"
#include "kv/pruned_keys.h"
#include "ops/nn.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::kv {

// Sizes of a layout's pages under a codec. Each takes the per-layer codecs
// (ResolveLayers(layout, codec); a ResolvedKVSpec holds them) or, for callers
// without a resolved spec, the codec config to resolve.
// Bytes of the largest page the layers use (size class 0 of a pool made for
// them).
size_t PageBytes(std::span<const LayerCodec> layers);
size_t PageBytes(const KVLayout& layout, const CodecConfig& codec);
// Bytes one token costs across all layers and kv heads once its pages are
// packed (sum over layers of packed page bytes * n_kv_heads / page_tokens,
// rounded up): the asymptotic cost, without the f16 residual/sink pages.
size_t BytesPerToken(const KVLayout& layout, std::span<const LayerCodec> layers);
size_t BytesPerToken(const KVLayout& layout, const CodecConfig& codec);
// Exact bytes of the pages of one sequence holding `n_ctx` tokens in every
// (layer, kv-head), f16 residual and sink pages included.
uint64_t BytesForContext(const KVLayout& layout, std::span<const LayerCodec> layers, int64_t n_ctx);
uint64_t BytesForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx);
// Pool budget that holds `n_ctx` tokens of one sequence: BytesForContext plus,
// for sealed codecs, the pages an Append may hold while it seals (the new
// packed pages are allocated before the staging pages they replace are freed).
uint64_t BudgetForContext(const KVLayout& layout, std::span<const LayerCodec> layers, int64_t n_ctx);
uint64_t BudgetForContext(const KVLayout& layout, const CodecConfig& codec, int64_t n_ctx);

// Extent size (BlockPoolOptions::extent_bytes, block_pool.h "Locality") for a
// pool of `budget` bytes shared by n_seqs sequences of `layout`: one
// (layer, kv head) table's share of the budget, so that every table can run
// through an extent of its own (at most kMaxExtentBytes).
inline constexpr size_t kMaxExtentBytes = 4 << 20;
size_t ExtentBytesFor(const KVLayout& layout, uint64_t budget, int n_seqs);

// OK when pages of layer codec `a` can be listed by a table of layer codec
// `b` too (SequenceKV::ShareEntries): the same row-wise codec and parameters,
// no sealing (staging pages, KIVI), no f16 sink pages, no outliers;
// InvalidArgument naming what works otherwise.
Status CanShareAcrossLayers(const LayerCodec& a, const LayerCodec& b);

class SequenceKV {
 public:
  // `layers`: ResolveLayers(layout, codec), resolved once by the caller (a
  // KVManager passes its ResolvedKVSpec's). REQUIRES: pool outlives this
  // object; layout.Validate() is OK; layers.size() == layout.n_layers;
  // pool->page_bytes() >= PageBytes(layers). ValidateCodecConfig() should
  // have accepted `codec` (otherwise it is adapted, see ResolveLayers).
  SequenceKV(BlockPool* pool, const KVLayout& layout, const CodecConfig& codec, std::vector<LayerCodec> layers);
  // Resolves the layers itself: for a sequence made without a manager
  // (tests, benchmarks).
  SequenceKV(BlockPool* pool, const KVLayout& layout, const CodecConfig& codec);
  ~SequenceKV();
  SequenceKV(const SequenceKV&) = delete;
  SequenceKV& operator=(const SequenceKV&) = delete;

  // Appends n tokens' K and V for one layer. k, v: [n][n_kv_heads][head_dim]
  // floats (k un-roped when keys_pre_rope()); pos[n]: their positions (any
  // order, gaps allowed; >= 0 with pre-RoPE keys). Every kv-head of the layer
  // gets the n entries.
  // ResourceExhausted when the pool cannot supply the pages; then nothing
  // changed (all pages the call needs are allocated before any is written).
  // With `threads`, the kv heads are written in parallel (the pages are
  // allocated first, on the caller): a prompt's append was 4% of prefill
  // on the caller alone while the other threads waited.
  // REQUIRES: 0 <= layer < n_layers, n >= 0.
  Status Append(int layer, int n, const int32_t* pos, const float* k, const float* v, ThreadPool* threads = nullptr);

  // One sequence's rows of AppendBatch: as Append's arguments.
  struct AppendRows {
    SequenceKV* kv;
    int n;
    const int32_t* pos;
    const float* k;
    const float* v;
  };
  // Append(layer, ...) for several sequences of one pool (a batched step's
  // rows): every item is checked and its pages are taken first, on the
  // caller, then the (sequence, kv head) writes of all items run in one
  // parallel loop on `threads`. A batched step of 32 one-token sequences made
  // 32 serial calls per layer (8.8% of the step on 2 threads). On error (a
  // bad position, the pool exhausted) no item's rows were written; the pages
  // already taken stay reserved for the items (CancelReservation).
  // REQUIRES: distinct sequences sharing one pool; as Append for each.
  static Status AppendBatch(int layer, std::span<const AppendRows> items, ThreadPool* threads = nullptr);

  // Pre-RoPE keys (KVQuant): the caller does not rope K; Attention applies
  // `rope` at each entry's stored position. Call before Attention (cheap when
  // unchanged). `rope.freq_factors` must outlive this object.
  bool keys_pre_rope() const { return codec_.pre_rope; }
  void set_rope(const ops::RopeParams& rope);
  const ops::RopeParams& rope() const { return rope_; }
  // cos/sin table of `pos` (RopeCosSin layout). REQUIRES: keys_pre_rope(),
  // set_rope() called, 0 <= pos <= the largest position appended.
  const float* RopeCosSin(int32_t pos) const {
    KVX_DCHECK(pos >= 0 && pos < rope_positions_);
    return rope_table_.data() + static_cast<size_t>(pos) * rope_.n_dims;
  }

  // The Hadamard rotation applied to V, or nullptr; keys_rotated(): also to K.
  const HadamardRotation* rotation() const { return rotation_.get(); }
  bool keys_rotated() const { return codec_.rotation == Rotation::kHadamard; }

  // Slots of (layer, kv_head)'s chain (live and dead entries; page_table.h).
  int Length(int layer, int kv_head) const { return table(layer, kv_head).length(); }
  // Live entries of (layer, kv_head).
  int LiveEntries(int layer, int kv_head) const;

  // Step protocol (kv_manager.h). Reserve(n) allocates every page the next
  // Append of n tokens to every layer will take (new pages, seals,
  // copy-on-write copies), or fails with ResourceExhausted having changed
  // nothing. Append(layer, n, ...) then consumes layer's reservation; an
  // Append without one allocates for itself (one layer at a time).
  // CancelReservation returns reserved pages not yet consumed (all layers,
  // or one). Tables must not change between Reserve and the Appends.
  Status Reserve(int n);
  void CancelReservation(int layer = -1);
  int64_t ReservedPages() const;

  // Removes entries (by slot index in the chain) of one head: each becomes a
  // dead slot (position kDeadPosition, never attended); pages left without
  // live entries leave the chain and return to the pool at once (sink pages
  // excepted). Shared pages that keep live entries are copied first.
  // Dead or repeated slots are ignored. InvalidArgument for a slot outside
  // the chain; ResourceExhausted when a copy cannot be allocated (then
  // nothing changed). REQUIRES: no reservation pending.
  Status RemoveEntries(int layer, int kv_head, const std::vector<int>& slots);
  // Packs the live entries of the head's sealed-or-row-wise region (after
  // the sink pages, before the staging pages or the open last page) into
  // fewer pages, in chain order, run by run: each run of source pages whose
  // live entries fill at most kCompactRunPages pages is rewritten into
  // ceil(live / page_tokens) new pages (only when that frees a page), so
  // every run but the last may leave one partly filled page (the live
  // fraction stays above (R-1)/R for runs of R pages). The pages freed
  // return to the pool. Entries are decoded and re-encoded: exact for
  // f32/f16 pages, one more quantization of already quantized values
  // otherwise. A run's new pages are allocated before its sources are
  // released, so compaction needs kCompactRunPages free pages, not a
  // table's worth; ResourceExhausted leaves the runs done so far done and
  // the table consistent.
  static constexpr int kCompactRunPages = 8;
  Status Compact(int layer, int kv_head);

  // A new sequence holding the first `n_slots` slots of every table:
  // whole pages shared (refcount +1), the partial last page shared and
  // copied on write, or, when it is a sealed packed page (which cannot take
  // more rows), its entries copied into an f16 staging page. InvalidArgument
  // when a chain is shorter; ResourceExhausted (nothing changed).
  Result<std::unique_ptr<SequenceKV>> ForkPrefix(int n_slots) const;

  // Internal error describing the first broken table invariant: page count
  // covers the slots, pages are held and of their size class, live counts
  // match the stored positions, no empty non-sink page stays listed.
  Status CheckTables() const;
  // Calls fn for every page reference this sequence holds (tables and
  // pending reservations): for cross-checks of the pool's refcounts.
  void ForEachPage(const std::function<void(PageId)>& fn) const;

  // Returns every page to the pool (drops this sequence's references).
  void Clear();

  // Session files (engine/session_file.h) save each table's pages as stored
  // (table(), pool().PageData()) and restore them with Import.
  struct TableImage {
    int length = 0;                             // slots
    std::vector<uint8_t> full;                  // per page: f16 (staging/sink) or packed
    std::vector<std::span<const uint8_t>> pages;  // per page: its bytes, as PageData() held them
  };
  // Fills this empty sequence's tables ([n_layers * n_kv_heads], layer-major)
  // with copies of the given pages, allocated from the pool. Everything is
  // checked first, so a damaged image cannot break an invariant later: page
  // counts cover the slots, each page has its size class's byte size, the
  // f16/packed flags follow the codec rules (sinks f16; packed pages of a
  // sealed layer hold a whole page and precede the f16 staging run; no f16
  // page in a layer that never stages), positions are live (>= 0, and below
  // the pre-RoPE limit) or dead, and no non-sink page is empty.
  // DataLoss naming the table and the problem; ResourceExhausted when the
  // pool cannot hold the pages. On any error nothing changed.
  // With `prefix` (a sequence of the same manager), the first
  // `prefix_pages` pages of every table are `prefix`'s pages, shared (by
  // reference, copied on write) rather than copied: the image's entries for
  // them are not read (their spans may be empty). The caller vouches that
  // they hold the same tokens (KVManager::ImportSequence checks the hashes).
  // REQUIRES: every table empty, no reservation pending.
  Status Import(const std::vector<TableImage>& tables, const SequenceKV* prefix = nullptr, int prefix_pages = 0);

  // Bytes of the pages this sequence references (pages shared with other
  // sequences count fully, a page two of its tables list (ShareEntries)
  // once; each page counts its own size class).
  size_t BytesInUse() const;
  // Pages this sequence references (shared pages count once per reference).
  int64_t PagesInUse() const;

  // A new sequence sharing every page with this one (refcounts +1); later
  // appends to either copy a shared last page before writing it.
  std::unique_ptr<SequenceKV> Fork() const;

  // Reads entry `index` of (layer, kv_head) back as floats and its position:
  // K and V as appended, up to the codec's error (rotation undone; pre-RoPE
  // keys stay un-roped). For tests, debugging and tiers; not a hot path.
  // REQUIRES: 0 <= index < Length(layer, kv_head); k, v hold head_dim floats.
  void ReadEntry(int layer, int kv_head, int index, float* k, float* v, int32_t* pos) const;

  // Overwrites the K and V of live entries of one head (merging policies:
  // KVMerger/D2O fold evicted entries into kept ones): slots[i] gets rows
  // k[i], v[i] ([slots.size()][head_dim] floats, in the form ReadChain
  // returns: rotation undone; pre-RoPE keys un-roped). Positions stay. Each
  // touched page is decoded and re-encoded, so a quantized page's other
  // entries are quantized once more (exact for f32/f16 pages). Shared pages
  // are copied first. InvalidArgument for a dead or out-of-range slot;
  // ResourceExhausted when a copy cannot be allocated (nothing changed).
  // REQUIRES: no reservation pending.
  Status RewriteEntries(int layer, int kv_head, const std::vector<int>& slots, const float* k, const float* v);

  // Page formats (page_table.h): the codec a page of `format` in `layer` is
  // read and written with. Packed: the layer codec; full: f16 with the
  // layer's parameters; demoted: the demotion codec (SetDemotionCodec).
  // Pruned pages (ThinK) are laid out by kv/pruned_keys.h with the table's
  // channel mask `kept` (id: the layer's block codec, pruned::BlockCodec,
  // and the layer's parameters), so their codec depends on the kv head: pass
  // it for any page that may be pruned.
  struct FormatCodec {
    CodecId id = CodecId::kF16;
    const CodecParams* params = nullptr;
    bool whole_pages = false;  // encoded at once (EncodePage of page_tokens rows) and decoded whole
    const std::vector<int>* kept = nullptr;  // pruned pages: the kept key channels
    // Pruned pages: where their blocks are (REQUIRES kept != nullptr).
    pruned::Shape pruned_shape() const { return pruned::ShapeFor(id, *params, static_cast<int>(kept->size())); }
  };
  FormatCodec format_codec(int layer, PageFormat format, int kv_head = -1) const;

  // ThinK key-channel pruning (kv/policy/think.h; pages kPagePruned,
  // kv/pruned_keys.h). Sets the channel mask of (layer, kv_head) to `kept`
  // (ascending channel indices, 1 <= size < head_dim) and rewrites every
  // packed page of the chain that lies wholly before its last `recent` live
  // entries into a pruned page: keys hold the kept channels only (the others
  // read as zero in q.k from now on), encoded with the layer's block codec
  // (f16 for f16/f32 layers, the layer codec for int8/4/2), values stay
  // whole (as stored for int8/4/2 and f16, rounded to f16 for f32); slots,
  // positions and live counts stay, and each old page returns to the pool
  // (its new page is allocated first). Pages written later (recent and new
  // tokens) keep every channel; a later call with the same mask prunes the
  // pages that have aged since. Sink, staging and demoted pages are left.
  // InvalidArgument for a bad mask, a mask different from the one the
  // table already has, a layer codec without a pruned format (KIVI, outliers),
  // a mask that saves no bytes in that codec, pre-RoPE or Hadamard-rotated
  // keys, Quest bounds or cross-layer shared pages (entry scales), naming
  // what works; ResourceExhausted when no page can be allocated (the pages
  // rewritten so far stay rewritten, the table consistent).
  // REQUIRES: no reservation pending.
  Status PruneKeyChannels(int layer, int kv_head, const std::vector<int>& kept, int recent);
  // The channel mask of (layer, kv_head): empty when never pruned.
  const std::vector<int>& kept_channels(int layer, int kv_head) const {
    return kept_channels_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  }
  // Bytes the channel masks take (heap, beside the tables; not pool pages).
  size_t KeyChannelBytes() const;

  // MiKV demotion (the `demote` eviction fate, kv/policy/demote_fate.h).
  // SetDemotionCodec picks the low-bit codec of demoted pages (a quantized
  // codec: int8/int4/int2/kivi4/kivi2 with its default bits and group; one
  // per sequence, fixed once a page is demoted). InvalidArgument naming the
  // fix for an unquantized codec, a head_dim the codec cannot quantize, or
  // a different codec after pages were demoted.
  Status SetDemotionCodec(CodecId id);
  // kF16 when no demotion codec is set.
  CodecId demotion_codec() const { return demote_id_; }
  // Bytes of one demoted page (0 when no demotion codec is set).
  size_t DemotedPageBytes() const { return demote_page_bytes_; }
  // Moves live entries (slots of (layer, kv_head), any order) into demoted
  // pages: their K and V as stored are decoded, re-encoded with the
  // demotion codec into ceil(n / page_tokens) new whole pages (dead slots
  // padded) inserted after the sink pages and any earlier demoted pages,
  // and the originals removed as RemoveEntries does (their pages return to
  // the pool once empty or compacted). Entries already in demoted pages
  // and dead or repeated slots are ignored. Demoted entries keep their
  // positions and stay attended, at the demotion codec's precision. Slot
  // indices change (pages are inserted). InvalidArgument for a slot outside
  // the chain or no demotion codec; ResourceExhausted when the pool cannot
  // hold the new pages (nothing changed). REQUIRES: no reservation pending.
  Status DemoteEntries(int layer, int kv_head, const std::vector<int>& slots);
  // Live entries of (layer, kv_head) in pages of `format`.
  int LiveEntriesIn(int layer, int kv_head, PageFormat format) const;

  // Quest page selection (kv/page_selection.h): from now on every page of
  // every table keeps the per-channel min/max of its keys as stored (the
  // pages already written are decoded once here; later writes update them),
  // and Attention reads only the selected pages of each kv head at decode.
  // InvalidArgument with pre-RoPE keys (the stored keys are not the keys
  // attention dots with, so their bounds would bound nothing).
  // Forks and prefix forks keep the selection and the bounds.
  Status SetPageSelection(const PageSelection& selection);
  const PageSelection& page_selection() const { return selection_; }
  // Bytes the page bounds take (heap, beside the tables; not pool pages).
  size_t PageBoundsBytes() const;
  // Every byte the sequence keeps outside the pool: the page bounds (Quest),
  // the key-channel masks of pruned pages (ThinK) and the per-entry scales
  // of cross-layer merged pages (MiniCache's norms). KVManager::SideBytes
  // adds what the policies keep per sequence.
  size_t SideBytes() const { return PageBoundsBytes() + KeyChannelBytes() + EntryScaleBytes(); }

  // Decodes the whole chain of (layer, kv_head) page by page: k, v
  // [Length][head_dim] (rotation undone; pre-RoPE keys stay un-roped, others
  // are roped at their stored positions), pos [Length] (kDeadPosition for
  // dead slots). For policies that score or merge by the stored keys
  // (key norm, KVMerger); O(slots * head_dim).
  void ReadChain(int layer, int kv_head, std::vector<float>* k, std::vector<float>* v, std::vector<int32_t>* pos) const;

  // Rewrites the stored positions of live slots of one head (StreamingLLM's
  // re-packed positions): slots[i] gets positions[i]. Only meaningful with
  // pre-RoPE keys (keys_pre_rope(): RoPE is applied at the stored position
  // on read); roped keys would keep their old rotation. Shared pages are
  // copied first. InvalidArgument for a dead or out-of-range slot, a
  // negative or kDeadPosition position, or a position beyond the largest
  // appended one (the RoPE table ends there); ResourceExhausted when a copy
  // cannot be allocated (nothing changed). REQUIRES: no reservation pending.
  Status SetPositions(int layer, int kv_head, const std::vector<int>& slots, const std::vector<int32_t>& positions);

  // Cross-layer sharing (MiniCache, kv/policy/minicache.h; the general
  // mechanism: pages listed by two tables, entry scales in page_table.h).
  // Replaces the chains of (layer_a, kv_head) and (layer_b, kv_head) by
  //   * shared.pos.size() entries stored ONCE, in new pages both chains list
  //     (one pool reference each): rows shared.k, shared.v [n][head_dim] in
  //     ReadChain's form at positions shared.pos, which chain i in {a, b}
  //     reads scaled by its own shared.k_scale[i][j], v_scale[i][j];
  //   * then each layer's own entries: the live slots keep_a (keep_b) of its
  //     old chain as ReadChain reads them (entry scales applied), scale 1.
  // Old entries not listed are gone. The new chains reuse the old pages only
  // these two tables hold (a context that filled the pool leaves no room for
  // a second copy of the pair), new pages are allocated beyond them, and the
  // rest are released. Each chain
  // then holds ceil(n / T) + ceil(keep / T) pages, the last of each run
  // padded with dead slots, so later appends start a page of their own and
  // never write into a shared page. Entries are re-encoded (exact for f16).
  // InvalidArgument when CanShareAcrossLayers rejects the two layers' codecs,
  // page selection (Quest) is on, a kept slot is dead or out of range, or the
  // sizes disagree; ResourceExhausted when the pool cannot supply the pages
  // beyond the reused ones (nothing changed). REQUIRES: layer_a != layer_b, no reservation pending.
  struct SharedEntries {
    std::vector<int32_t> pos;                   // [n]
    std::vector<float> k, v;                    // [n][head_dim]
    std::vector<float> k_scale[2], v_scale[2];  // [2][n]: layer_a's, layer_b's
  };
  Status ShareEntries(int layer_a, int layer_b, int kv_head, const SharedEntries& shared, const std::vector<int>& keep_a,
                      const std::vector<int>& keep_b);
  // Bytes the entry scales take (heap, beside the tables; not pool pages).
  size_t EntryScaleBytes() const;

  const PageTable& table(int layer, int kv_head) const {
    return tables_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  }
  const KVLayout& layout() const { return layout_; }
  const CodecConfig& codec() const { return codec_; }
  const LayerCodec& layer_codec(int layer) const { return layers_[layer]; }
  const BlockPool& pool() const { return *pool_; }

 private:
  PageTable& mutable_table(int layer, int kv_head) {
    return tables_[static_cast<size_t>(layer) * layout_.n_kv_heads + kv_head];
  }
  // Gives each listed page of t (chain indices) that is shared a private
  // copy, all or nothing: ResourceExhausted with t unchanged if the pool is full.
  Status MakePagesPrivate(PageTable& t, const std::vector<int>& pages);
  // Recomputes page p's bounds from its stored keys (live slots only).
  void RefreshBounds(int layer, PageTable& t, int p) const;
  // A sequence with no pages and this one's codec state (size classes, RoPE table).
  std::unique_ptr<SequenceKV> EmptyCopy() const;
  // Registers the pool size classes of every layer's page formats.
  Status EnsureSizeClasses();
  int SizeClass(int layer, bool full) const { return size_class_[2 * static_cast<size_t>(layer) + (full ? 1 : 0)]; }
  int FormatSizeClass(int layer, PageFormat format, int kv_head = -1) const {
    if (format == kPagePruned) return PrunedSizeClass(format_codec(layer, kPagePruned, kv_head).pruned_shape().page_bytes);
    return format == kPageDemoted ? demote_class_ : SizeClass(layer, format == kPageFull);
  }
  // The size class of pruned pages of `bytes` (-1: none yet).
  int PrunedSizeClass(size_t bytes) const {
    for (const auto& [b, cls] : pruned_classes_) {
      if (b == bytes) return cls;
    }
    return -1;
  }
  void ExtendRopeTable(int32_t max_pos);
  // The pages one layer's Append of n tokens takes, in WriteHead's order.
  struct Reservation {
    int n = -1;                     // tokens planned for (-1: none)
    std::vector<PageId> pages;      // allocated, consumed in order
    std::vector<size_t> head_first; // [n_kv_heads + 1]: each head's first page in `pages`
    std::vector<uint8_t> cow;       // [n_kv_heads]: the shared last page is copied
  };
  // Allocates (all or nothing) the pages of layer's Append of n tokens.
  Status PlanLayer(int layer, int n, Reservation* r);
  // AppendBatch's phases for one sequence: checks the rows, takes their
  // pages and rotates them (*k, *v then point at the rows to store); writes
  // head h (any thread, once per head); returns the replaced pages to the
  // pool (the caller's thread, after every head).
  Status PrepareAppend(int layer, int n, const int32_t* pos, const float** k, const float** v);
  void WriteAppendHead(int layer, int h, int n, const int32_t* pos, const float* k, const float* v);
  void FinishAppend(int layer, int n, const int32_t* pos);
  // Writes the new rows of one head: takes the pages the plan allocated for
  // it from r.pages[*next_new...], and adds the pages it replaces to
  // *released (FinishAppend unrefs them after all heads, since the pool is
  // not thread-safe). Touches nothing another head's call does, nor any
  // other sequence's.
  void WriteHead(int layer, int h, int n, const int32_t* pos, const float* k, const float* v, const Reservation& r,
                 size_t* next_new, std::vector<PageId>* released);

  BlockPool* pool_;
  KVLayout layout_;
  CodecConfig codec_;
  std::vector<LayerCodec> layers_;
  std::vector<int> size_class_;     // [n_layers][2]: packed, full; -1 = not registered
  std::vector<PageTable> tables_;   // [n_layers * n_kv_heads]
  std::vector<Reservation> reserved_;  // [n_layers]
  std::vector<std::vector<PageId>> released_;  // [n_kv_heads]: pages each head's writes replaced
  std::vector<float> rot_k_, rot_v_;    // rotated copies of the appended rows
  std::unique_ptr<HadamardRotation> rotation_;
  PageSelection selection_;
  // Demotion codec (MiKV): kF16 = none; its pool size class once registered.
  CodecId demote_id_ = CodecId::kF16;
  CodecParams demote_params_;
  size_t demote_page_bytes_ = 0;
  int demote_class_ = -1;
  // ThinK: [n_layers * n_kv_heads] kept key channels (empty: not pruned),
  // and the pool size class of pruned pages per page size in bytes.
  std::vector<std::vector<int>> kept_channels_;
  std::vector<std::pair<size_t, int>> pruned_classes_;
  ops::RopeParams rope_{};
  bool rope_set_ = false;
  int32_t max_pos_ = -1;            // largest position appended
  int32_t rope_positions_ = 0;      // positions covered by rope_table_
  std::vector<float> rope_table_;   // [rope_positions_][rope_.n_dims]
};

}  // namespace kvx::kv
