#include "kv/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "kv/attention_math.h"
#include "kv/codec/codecs.h"
#include "kv/page_selection.h"
#include "kv/prerope_scores.h"
#include "kv/pruned_keys.h"
#include "util/check.h"

namespace kvx::kv {
namespace {

using namespace attention_math;  // Max, ExpSum, SoftmaxStep, ... and kNegInf

// Per-thread scratch, reused across items and calls.
struct Scratch {
  std::vector<float> q;       // [rows][D] the block's queries (rotated when the cache is)
  std::vector<float> scores;  // [rows][page entries]
  std::vector<float> acc;     // [kMaxQueryRows][D] an item's accumulators when it writes the outputs itself
  std::vector<float> qk;      // [rows][key rows] the queries at the table's kept key channels (pruned pages)
  std::vector<float> tap_w;   // [rows][item entries] an observed item's weights (WeightTap)
  std::vector<float> tap_ref; // [rows][item entries / group] their reference maxima
  std::vector<int> run_off;   // item-local index of each page of a fused run (WeightTap::page_offset)
  pruned::Shape pruned;       // the item's pruned pages (when its table has a channel mask)
};
thread_local Scratch tls_scratch;

// The column sums of one call (AttentionObserver::WantsColumnSums): per
// pool thread, per (column-sum job, kv head), [G][slots] floats in the
// thread's arena, allocated and zeroed when the thread's first item of that
// head adds to them, so the threads never share an accumulator; summed over
// threads once per call (DeliverColumnSums).
struct ColumnSums {
  int heads = 0;                         // (job, kv head) pairs: job.col_index + h
  std::vector<std::vector<float>> arena; // [thread]
  std::vector<int64_t> at;               // [thread * heads + k]: offset in arena[thread], -1 if untouched
};

// Everything one Attention call shares between its work items.
struct Job {
  const SequenceKV* kv = nullptr;
  int seq = 0;  // index of the sequence in the AttentionBatch call
  int layer;
  const LayerCodec* lc;
  const float* q;
  const int32_t* q_pos;
  int n_heads, G, D, T;
  float scale;
  int rows_per_head;    // n_q * G: row r is (query r / G, head h * G + r % G)
  int blocks_per_head;  // ceil(rows_per_head / kMaxQueryRows)
  int chunk_pages;
  const HadamardRotation* rot;  // on V (output rotated back); on K too when keys_rotated
  bool keys_rotated;
  bool pre_rope;
  // Several queries (a prompt's rows) skip the pages after all of a block's
  // rows; each page's smallest position, [h][page], is found once here
  // rather than by every row block (192 per head for 512 tokens on
  // smollm2-135m, where the per-item scans were ~0.7% of kvx bench's
  // samples).
  bool skip_future;
  std::vector<std::vector<int32_t>> page_min;
  // Quest (page_selection.h): sel[h] lists the pages kv head h reads, in
  // chain order; empty (or no sel) = every page. Items walk "visit
  // indices" i, page P(i), so the paths without a selection run exactly as
  // before. The first item of a head to run picks its pages (SelectHeadPages,
  // sel_state[h]: 0 to pick, 1 being picked, 2 picked), so the heads pick
  // in parallel; visits[h], their count, is known before (item layout).
  bool selecting = false;
  std::vector<std::vector<int>> sel;
  std::vector<int> visits;
  std::unique_ptr<std::atomic<int>[]> sel_state;
  // Items (h, block, chunk) are numbered item_base[h] + block * chunks[h] + chunk.
  std::vector<int> chunks;
  std::vector<size_t> item_base;
  size_t part_stride;   // floats per item: acc [kMaxQueryRows][D], max [kMaxQueryRows], sum [kMaxQueryRows]
  float* partials;
  float* out;  // [n_q][n_heads][D]
  // Observer only: masked, scaled scores per (h, row, entry), -inf where never computed.
  AttentionObserver* observer;
  int obs_first_row = 0;  // rows before it are not observed (the observer's query window)
  std::vector<float*> obs_scores;             // [h] -> [(rows_per_head - obs_first_row) * n_h], in tls_obs_scores
  std::vector<size_t> obs_offset;             // [h]: where obs_scores[h] starts in it
  std::vector<std::vector<int32_t>> obs_pos;  // [h][n_h]
  // Column sums instead of per-row probabilities (several queries and an
  // observer that takes them): the observed items tap their kernels'
  // weights (WeightTap) and add them to `cols`. One chunk per head, so that
  // each item ends with its rows' final max and sum.
  bool column_sums = false;
  int col_index = 0;  // this job's kv head h is (job, h) number col_index + h in cols
  ColumnSums* cols = nullptr;
};

// s[r*ss + j] = q_r . K_j for the page's m entries, the page encoded with
// codec C and `params` (the page's format, page_table.h).
template <PageCodec C>
void PageScores(const Job& job, const CodecParams& params, const uint8_t* page, int m, const float* q, int nr, float* s,
                int ss) {
  if (job.pre_rope) return prerope::Scores<C>(*job.kv, params, page, m, q, nr, s, ss);
  C::Scores(params, page + PageDataOffset(job.T), m, q, nr, s, ss);
}

// --- Pages in a format of their own (page_table.h: MiKV's demoted pages) ---
// The layer codec C and f16 are compiled into RunItem; any other format is
// dispatched here at run time, once per page visit, with the format's codec.

// Whether page p is read as f16 (the fused kernel's runs): full pages, and
// packed pages of an f16 layer.
template <PageCodec C>
bool F16Form(const PageTable& t, int p) {
  return t.format(p) == kPageFull || (std::is_same_v<C, F16Codec> && t.format(p) == kPagePacked);
}

// PageScores for a page of `format`, whatever it is. Pruned pages (ThinK,
// pruned_keys.h) dot the queries gathered to the table's kept channels
// (tls_scratch.qk, filled once per item by RunItem, with the pages' shape
// in tls_scratch.pruned) with their short keys, in their block codec.
template <PageCodec C>
void FormatPageScores(const Job& job, PageFormat format, const uint8_t* page, int m, const float* q, int nr,
                      float* s, int ss) {
  if (format == kPagePacked) return PageScores<C>(job, job.lc->params, page, m, q, nr, s, ss);
  if (format == kPageFull) return PageScores<F16Codec>(job, job.lc->params, page, m, q, nr, s, ss);
  if (format == kPagePruned) {
    return pruned::Scores(tls_scratch.pruned, page + PageDataOffset(job.T), m, tls_scratch.qk.data(), nr, s, ss);
  }
  const SequenceKV::FormatCodec fc = job.kv->format_codec(job.layer, format);
  DispatchCodec(fc.id, [&](auto codec) { PageScores<decltype(codec)>(job, *fc.params, page, m, q, nr, s, ss); });
}

// AccumulateValues for a page of `format`, whatever it is.
template <PageCodec C>
void FormatAccumulateValues(const Job& job, PageFormat format, const uint8_t* data, int m, const float* w,
                            int nr, int ws, float* acc) {
  if (format == kPagePacked) return C::AccumulateValues(job.lc->params, data, m, w, nr, ws, acc);
  if (format == kPageFull) return F16Codec::AccumulateValues(job.lc->params, data, m, w, nr, ws, acc);
  if (format == kPagePruned) return pruned::AccumulateValues(tls_scratch.pruned, data, m, w, nr, ws, acc);
  const SequenceKV::FormatCodec fc = job.kv->format_codec(job.layer, format);
  DispatchCodec(fc.id, [&](auto codec) { decltype(codec)::AccumulateValues(*fc.params, data, m, w, nr, ws, acc); });
}

// Asks for the whole of the next page of a chain while this one is computed
// (into L1: a page is 4-17 KB, L1D 32-48 KB), since hardware prefetchers do
// not cross 4 KiB boundaries and need a few misses to start a stream. The
// general path issues them in two bursts per page (before its scores and
// before its values). On the Zen 5 VM this was measured on, one burst's
// effect depended on the machine's state (kv_bench's f16 8k all-layer
// decode, 2 threads: 8.7 -> 5.8 ms in some runs, no change in others, never
// slower); two halves were up to 5% faster again for KIVI (kivi4 p128 8k all
// layers, 1 thread: 7.7-8.0 -> 7.3-7.5 ms; int8 within noise). The fused f16
// kernel spreads the same prefetches over its score steps instead, two
// pages ahead (F16Codec::AttendRun), which gained in every run: 8.0-8.4 ->
// 4.6-4.8 ms with the fusion.
inline void PrefetchPage(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, /*rw=*/0, /*locality=*/3);
}

// Pages kv head h reads (all of its chain without a Quest selection).
int VisitCount(const Job& job, int h) {
  return job.selecting ? job.visits[h] : job.kv->table(job.layer, h).num_pages();
}

// The first page of kv head h's context chunk `chunk` (kNoPage past the end,
// or when the head's pages are not picked yet).
PageId ChunkFirstPage(const Job& job, int h, int chunk) {
  const PageTable& t = job.kv->table(job.layer, h);
  const int first = chunk * job.chunk_pages;
  if (first >= VisitCount(job, h)) return kNoPage;
  if (job.selecting && job.sel_state[h].load(std::memory_order_acquire) != 2) return kNoPage;
  return t.pages()[job.sel.empty() || job.sel[h].empty() ? first : job.sel[h][first]];
}

// Whether kv head h's items write their rows' outputs themselves: a chain
// of one chunk needs no merge (merging one partial is the identity up to
// the same division), so the partials and the merge pass are skipped; the
// observer still goes through the merge, which feeds it.
bool WritesOutputs(const Job& job, int h) {
  return job.chunks[h] == 1 && (job.observer == nullptr || job.column_sums);
}

// Thread `tid`'s accumulator of kv head h's column sums, [G][slots], zeroed
// on first use.
float* ColumnAccumulator(const Job& job, int h, int tid) {
  ColumnSums& c = *job.cols;
  int64_t& at = c.at[static_cast<size_t>(tid) * c.heads + job.col_index + h];
  std::vector<float>& arena = c.arena[tid];
  if (at < 0) {
    at = static_cast<int64_t>(arena.size());
    arena.resize(arena.size() + static_cast<size_t>(job.G) * job.obs_pos[h].size(), 0.0f);
  }
  return arena.data() + at;
}

// Adds the probabilities of an item's observed rows to their heads' column
// sums col [G][slots]: p = w exp(ref - mx) / sum, from the weights the
// kernels tapped (w relative to ref, the row's reference max then; mx and
// sum the row's final ones, the item covering the whole chain). One exp per
// row and group of entries, none per entry.
void AddColumnSums(const Job& job, int h, int row0, int nr, int i0, int i1, const int* sel, const float* mx,
                   const float* sum, const WeightTap& tap, float* col) {
  const PageTable& t = job.kv->table(job.layer, h);
  const int T = job.T, g_stride = tap.stride / tap.group;
  const size_t n_h = job.obs_pos[h].size();
  for (int r = std::max(0, job.obs_first_row - row0); r < nr; ++r) {
    if (mx[r] == kNegInf) continue;  // saw nothing: all 0
    const float inv = 1.0f / sum[r];
    float* c = col + static_cast<size_t>((row0 + r) % job.G) * n_h;
    const float* w = tap.w + static_cast<size_t>(r) * tap.stride;
    const float* ref = tap.ref + static_cast<size_t>(r) * g_stride;
    for (int i = i0; i < i1; ++i) {
      const int p = sel != nullptr ? sel[i] : i, k0 = (i - i0) * T, m = t.EntriesInPage(p, T);
      float* cp = c + static_cast<size_t>(p) * T;
      for (int k = 0; k < m; k += tap.group) {
        const float ref_k = ref[(k0 + k) / tap.group];
        if (ref_k == kNegInf) continue;  // never visited (a skipped page) or nothing visible then
        const float f = std::exp(ref_k - mx[r]) * inv;
        for (int j = k; j < std::min(m, k + tap.group); ++j) cp[j] += f * w[k0 + j];
      }
    }
  }
}

// o = acc / sum, rotated back (0 where nothing was visible: mx = -inf): the
// output of one row from its (acc, mx, sum), as MergeBlock writes it.
void WriteRow(const Job& job, const float* acc, float mx, float sum, float* o) {
  if (mx == kNegInf) {
    std::fill(o, o + job.D, 0.0f);
    return;
  }
  ScaledCopy(acc, job.D, 1.0f / sum, o);
  if (job.rot != nullptr) job.rot->Inverse(o);  // sum_j p_j Q v_j = Q o
}

// One work item: rows [row0, row0 + nr) of kv head h against the pages of one
// context chunk. Writes the partial (acc, max, sum) of each row, or, when
// the chain is one chunk (WritesOutputs), the rows' outputs. `after` is
// the first page of the item this thread runs next (kNoPage if none): it is
// prefetched with the chunk's last page, so that the next item (48 per layer
// at 8k context on smollm2-135m) does not start on a cold miss (kv_bench f16
// 8k all layers: -3.4% on 2 threads, -2% on 1, in alternated pairs).
template <PageCodec C>
void RunItem(Job& job, int h, int block, int chunk, PageId after, int tid) {
  const SequenceKV& kv = *job.kv;
  const PageTable& t = kv.table(job.layer, h);
  const BlockPool& pool = kv.pool();
  const int D = job.D, T = job.T, G = job.G;
  const int row0 = block * kMaxQueryRows, nr = std::min(kMaxQueryRows, job.rows_per_head - row0);
  // Visit indices [i0, i1) of this chunk; page P(i) (i itself without a selection).
  const int* sel = job.sel.empty() || job.sel[h].empty() ? nullptr : job.sel[h].data();
  auto P = [sel](int i) { return sel != nullptr ? sel[i] : i; };
  const int i0 = chunk * job.chunk_pages, i1 = std::min(VisitCount(job, h), i0 + job.chunk_pages);
  Scratch& s = tls_scratch;
  s.q.resize(static_cast<size_t>(nr) * D);
  s.scores.resize(static_cast<size_t>(nr) * T);

  // The queries times the scale, once here rather than every score of every
  // page: bit-identical scores for a power-of-two scale such as 1/sqrt(64),
  // otherwise they differ in the last bits.
  int32_t qp[kMaxQueryRows];
  int32_t q_max = std::numeric_limits<int32_t>::min();
  for (int r = 0; r < nr; ++r) {
    const int row = row0 + r, i = row / G, head = h * G + row % G;
    float* qr = &s.q[static_cast<size_t>(r) * D];
    const float* src = job.q + (static_cast<size_t>(i) * job.n_heads + head) * D;
    if (job.keys_rotated && !job.pre_rope) {
      std::memcpy(qr, src, sizeof(float) * D);
      job.rot->Forward(qr);  // (Q q) . (Q k) = q . k
      Scale(qr, D, job.scale);
    } else {
      ScaledCopy(src, D, job.scale, qr);
    }
    qp[r] = job.q_pos[i];
    q_max = std::max(q_max, qp[r]);
  }
  // A key-channel-pruned table (ThinK): its pruned pages dot the queries'
  // kept channels, gathered once here for every such page of the item.
  const std::vector<int>& kept = kv.kept_channels(job.layer, h);
  if (!kept.empty()) {
    s.pruned = kv.format_codec(job.layer, kPagePruned, h).pruned_shape();
    pruned::GatherQueries(kept, s.pruned.rows, D, s.q.data(), nr, &s.qk);
  }
  // Runs of pages in f16 form go through the fused kernel when it runs here
  // (F16Codec::AttendRun, which masks what a row must not see itself).
  // Rows the observer watches in this block (its query window), if any.
  const bool observe = job.observer != nullptr && row0 + nr > job.obs_first_row;
  // Observed rows of a column-sum job tap the weights of every kernel,
  // fused or general (WeightTap): every row of the item, its whole chain.
  const bool tapped = observe && job.column_sums;
  WeightTap tap;
  if (tapped) {
    tap.stride = (i1 - i0) * T;
    tap.group = std::min(T, 16);
    s.tap_w.resize(static_cast<size_t>(nr) * tap.stride);
    s.tap_ref.assign(static_cast<size_t>(nr) * (tap.stride / tap.group), kNegInf);
    tap.w = s.tap_w.data();
    tap.ref = s.tap_ref.data();
  }
  const bool scaled = t.has_entry_scales();  // see "Entry scales" above
  const bool fused = !job.pre_rope && !scaled &&
                     (tapped ? F16Codec::HasTappedAttendRun(job.lc->params, qp, nr)
                             : !observe && F16Codec::HasAttendRun(job.lc->params));
  // Pruned pages (ThinK) take the same fused kernel with their short keys
  // and the gathered queries: in the general loop the softmax step between
  // the separate kernels cost more than the scores, and an attention step
  // over a pruned cache was slower than over the f16 cache it came from,
  // though it read 25% fewer bytes (docs/kv-think.md, "Decode speed").
  const bool fused_pruned = fused && !observe && !kept.empty() && pruned::HasAttendRun(s.pruned);
  thread_local std::vector<const uint8_t*> run;

  // One pass over the chunk, page by page (online softmax): scores of the
  // page's keys, then its values, so memory is read in page order. Two passes
  // (all keys of the chunk, then all values) read half of each page and skip
  // the other half, which defeats the hardware prefetchers: on a 2-core EPYC
  // decode at 8k context ran at half the speed. Even groups of 2-4 pages
  // (their keys, one softmax step, their values) were 15-35% slower from DRAM
  // on a Zen 5 VM, more than the per-page bookkeeping they save. The
  // reference max only grows; when a page raises it (by more than
  // kSoftmaxSlack), the row's sum and accumulator are rescaled.
  const bool writes_outputs = WritesOutputs(job, h);
  if (writes_outputs) s.acc.resize(static_cast<size_t>(kMaxQueryRows) * D);
  float* part = job.partials + (job.item_base[h] + static_cast<size_t>(block) * job.chunks[h] + chunk) * job.part_stride;
  float* acc = writes_outputs ? s.acc.data() : part;
  std::fill(acc, acc + static_cast<size_t>(nr) * D, 0.0f);
  float mx[kMaxQueryRows], sum[kMaxQueryRows] = {};
  std::fill(mx, mx + nr, kNegInf);
  const std::size_t n_obs = job.observer != nullptr ? static_cast<size_t>(t.length()) : 0;
  const PageId* ids = t.pages().data();
  for (int i = i0; i < i1; ++i) {
    const int p = P(i);
    const bool f16_run = fused && F16Form<C>(t, p);
    if (f16_run || (fused_pruned && t.format(p) == kPagePruned)) {  // the run of pages P([i, e)) in p's form
      auto same_form = [&](int pe) { return f16_run ? F16Form<C>(t, pe) : t.format(pe) == kPagePruned; };
      run.clear();
      s.run_off.clear();
      int m_last = T, e = i;
      for (; e < i1 && same_form(P(e)); ++e) {
        const int pe = P(e);
        const uint8_t* page = pool.PageData(ids[pe]);
        const int m = t.EntriesInPage(pe, T);
        if (job.skip_future && job.page_min[h][pe] > q_max) continue;
        run.push_back(page);
        s.run_off.push_back((e - i0) * T);
        m_last = m;
      }
      if (!run.empty()) {
        const PageId after_run = e < i1 ? ids[P(e)] : after;
        const uint8_t* next = after_run != kNoPage ? pool.PageData(after_run) : nullptr;
        const size_t next_bytes = next != nullptr ? pool.PageBytesOf(after_run) : 0;
        const int n_run = static_cast<int>(run.size());
        if (f16_run) {
          tap.page_offset = s.run_off.data();
          F16Codec::AttendRun(job.lc->params, run.data(), n_run, m_last, pool.PageBytesOf(ids[p]), s.q.data(), qp, nr,
                              mx, sum, acc, next, next_bytes, tapped ? &tap : nullptr);
        } else {
          pruned::AttendRun(static_cast<int>(kept.size()), T, D, run.data(), n_run, m_last, pool.PageBytesOf(ids[p]),
                            s.qk.data(), qp, nr, mx, sum, acc, next, next_bytes);
        }
      }
      i = e - 1;
      continue;
    }
    const uint8_t* page = pool.PageData(ids[p]);
    const PageId next_id = i + 1 < i1 ? ids[P(i + 1)] : after;
    const uint8_t* next = next_id != kNoPage ? pool.PageData(next_id) : nullptr;
    const size_t next_bytes = next != nullptr ? pool.PageBytesOf(next_id) : 0;
    const int m = t.EntriesInPage(p, T);
    const int32_t* pos = PagePositions(page);
    int32_t pos_min, pos_max;
    MinMax(pos, m, &pos_min, &pos_max);
    if (pos_min > q_max) {  // after every row: skip
      if (observe && !tapped) {  // never computed: -inf for the observer (its matrix is not pre-filled)
        for (int r = std::max(0, job.obs_first_row - row0); r < nr; ++r) {
          float* o = &job.obs_scores[h][static_cast<size_t>(row0 + r - job.obs_first_row) * n_obs + static_cast<size_t>(p) * T];
          std::fill(o, o + m, kNegInf);
        }
      }
      continue;
    }
    // The next page's first half now, its second before this page's values:
    // two bursts of half the size stall less on the miss buffers.
    const size_t first_part = next_bytes / 2 / 64 * 64;
    if (next != nullptr) PrefetchPage(next, first_part);
    float* sp = s.scores.data();  // [nr][T]
    FormatPageScores<C>(job, t.format(p), page, m, s.q.data(), nr, sp, T);
    if (scaled) ScaleEntries(t.k_scales(p), m, nr, sp, T);  // q.(a k) = a (q.k)
    for (int r = 0; r < nr; ++r) {
      if (pos_max <= qp[r]) continue;  // the whole page is visible to this row (always, in decode)
      float* row = sp + static_cast<size_t>(r) * T;
      for (int j = 0; j < m; ++j) {
        if (pos[j] > qp[r]) row[j] = kNegInf;
      }
    }
    if (observe && !tapped) {
      float* obs = job.obs_scores[h];
      for (int r = std::max(0, job.obs_first_row - row0); r < nr; ++r) {
        std::memcpy(&obs[static_cast<size_t>(row0 + r - job.obs_first_row) * n_obs + static_cast<size_t>(p) * T],
                    sp + static_cast<size_t>(r) * T, sizeof(float) * m);
      }
    }
    float f[kMaxQueryRows];
    const bool any = SoftmaxStep(sp, T, m, nr, mx, sum, f);
    if (tapped) {  // the weights, relative to each row's reference max
      const int k0 = (i - i0) * T;
      for (int r = 0; r < nr; ++r) {
        std::memcpy(tap.w + static_cast<size_t>(r) * tap.stride + k0, sp + static_cast<size_t>(r) * T, sizeof(float) * m);
        for (int k = 0; k < m; k += tap.group) tap.ref[static_cast<size_t>(r) * (tap.stride / tap.group) + (k0 + k) / tap.group] = mx[r];
      }
    }
    for (int r = 0; r < nr; ++r) {
      if (f[r] != 1.0f) Scale(acc + static_cast<size_t>(r) * D, D, f[r]);  // what the row has so far, to the new max
    }
    if (next != nullptr && first_part < next_bytes) PrefetchPage(next + first_part, next_bytes - first_part);
    if (!any) continue;
    if (scaled) ScaleEntries(t.v_scales(p), m, nr, sp, T);  // weight p on (b v) = weight p b on v, after the sum
    const uint8_t* data = page + PageDataOffset(T);
    FormatAccumulateValues<C>(job, t.format(p), data, m, sp, nr, T, acc);
  }
  if (tapped) AddColumnSums(job, h, row0, nr, i0, i1, sel, mx, sum, tap, ColumnAccumulator(job, h, tid));
  if (writes_outputs) {
    for (int r = 0; r < nr; ++r) {
      const int row = row0 + r, i = row / G, head = h * G + row % G;
      WriteRow(job, acc + static_cast<size_t>(r) * D, mx[r], sum[r],
               job.out + (static_cast<size_t>(i) * job.n_heads + head) * D);
    }
    return;
  }
  float* part_max = part + kMaxQueryRows * D;
  std::copy(mx, mx + nr, part_max);
  std::copy(sum, sum + nr, part_max + kMaxQueryRows);
}

// Merges the chunk partials of one row block into the outputs (log-sum-exp
// rule, chunk order), rotates them back, and feeds the observer.
void MergeBlock(const Job& job, int h, int block, float* out) {
  const int D = job.D, G = job.G;
  const int row0 = block * kMaxQueryRows, nr = std::min(kMaxQueryRows, job.rows_per_head - row0);
  const int n_chunks = job.chunks[h];
  const float* first = job.partials + (job.item_base[h] + static_cast<size_t>(block) * n_chunks) * job.part_stride;
  std::vector<float> probs;
  for (int r = 0; r < nr; ++r) {
    const int row = row0 + r, i = row / G, head = h * G + row % G;
    float* o = out + (static_cast<size_t>(i) * job.n_heads + head) * D;
    float big = kNegInf;
    for (int c = 0; c < n_chunks; ++c) big = std::max(big, first[c * job.part_stride + kMaxQueryRows * D + r]);
    float inv = 0.0f;
    if (big == kNegInf) {
      std::fill(o, o + D, 0.0f);  // nothing visible (or empty cache)
    } else {
      std::fill(o, o + D, 0.0f);
      float total = 0.0f;
      for (int c = 0; c < n_chunks; ++c) {
        const float* part = first + c * job.part_stride;
        const float m = part[kMaxQueryRows * D + r];
        if (m == kNegInf) continue;
        const float e = std::exp(m - big);  // exactly 1 for the chunk holding the max
        total += part[kMaxQueryRows * D + kMaxQueryRows + r] * e;
        AddScaled(o, part + static_cast<size_t>(r) * D, D, e);
      }
      inv = 1.0f / total;
      Scale(o, D, inv);
      if (job.rot != nullptr) job.rot->Inverse(o);  // sum_j p_j Q v_j = Q o
    }
    if (job.observer != nullptr && row >= job.obs_first_row) {
      const int n_h = static_cast<int>(job.obs_pos[h].size());
      const float* sc = job.obs_scores[h] + static_cast<size_t>(row - job.obs_first_row) * n_h;
      probs.assign(n_h, 0.0f);
      if (big != kNegInf) {  // the same weights pass 2 used, normalised
        std::copy(sc, sc + n_h, probs.begin());
        ExpSum(probs.data(), n_h, big);
        for (float& x : probs) x *= inv;
      }
      job.observer->OnProbabilities(job.seq, job.layer, i, head, h, probs.data(), job.obs_pos[h].data(), n_h);
    }
  }
}

// Runs fn(index, next, thread) for index in [0, n) on the pool, one index per claim
// (each index writes only its own outputs, so the order is irrelevant).
// Claims are cheap since each thread claims from its own share of [0, n)
// until shares run out (ThreadPool), so one-item claims balance the threads
// to within an item. `next` is the index the thread most likely runs next
// (index + 1, n past the end), whose first page is prefetched; `thread`
// is the pool's index of the thread running it (0 = the caller).
template <typename Fn>
void RunAll(size_t n, ThreadPool* pool, const Fn& fn) {
  if (pool == nullptr || pool->size() <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, i + 1, 0);
    return;
  }
  pool->ParallelForDynamic(n, 1, [&](size_t begin, size_t end, int thread) {
    for (size_t i = begin; i < end; ++i) fn(i, i + 1, thread);
  });
}

// Hands each column-sum job's sums to the observer: per (kv head, query
// head), the threads' accumulators summed.
void DeliverColumnSums(const std::vector<Job>& jobs, const ColumnSums& cols, int threads) {
  std::vector<float> total;
  for (const Job& job : jobs) {
    if (!job.column_sums) continue;
    const int queries = (job.rows_per_head - job.obs_first_row) / job.G;
    for (int h = 0; h < static_cast<int>(job.obs_pos.size()); ++h) {
      const size_t n = static_cast<size_t>(job.G) * job.obs_pos[h].size();
      const float* sums = nullptr;
      for (int t = 0; t < threads; ++t) {
        const int64_t at = cols.at[static_cast<size_t>(t) * cols.heads + job.col_index + h];
        if (at < 0) continue;
        const float* mine = cols.arena[t].data() + at;
        if (sums == nullptr) {
          sums = mine;
          continue;
        }
        if (sums != total.data()) total.assign(sums, sums + n);
        for (size_t j = 0; j < n; ++j) total[j] += mine[j];
        sums = total.data();
      }
      if (sums == nullptr) total.assign(n, 0.0f), sums = total.data();  // no item ran (no observed row)
      const int n_h = static_cast<int>(job.obs_pos[h].size());
      for (int g = 0; g < job.G; ++g) {
        job.observer->OnColumnSums(job.seq, job.layer, h * job.G + g, sums + static_cast<size_t>(g) * n_h,
                                   job.obs_pos[h].data(), n_h, queries);
      }
    }
  }
}

// Quest: sets `job` up to select the pages of each kv head for its one
// decode query (page_selection.h): how many each head reads; which, the
// heads' first items pick (SelectHeadPages). A head whose budget covers its
// chain reads it all, unselected.
void SelectJobPages(Job& job) {
  const SequenceKV& kv = *job.kv;
  const KVLayout& L = kv.layout();
  const int H = L.n_kv_heads;
  job.selecting = true;
  job.sel.assign(H, {});
  job.visits.resize(H);
  job.sel_state = std::make_unique<std::atomic<int>[]>(H);
  for (int h = 0; h < H; ++h) {
    const int n = kv.table(job.layer, h).num_pages();
    job.visits[h] = SelectedPageCount(kv.table(job.layer, h), kv.page_selection(), L.page_tokens);
    job.sel_state[h].store(job.visits[h] < n ? 0 : 2, std::memory_order_relaxed);
  }
}

// Picks kv head h's pages (once per head and call, by whichever of its
// items runs first; the others wait for it), in the keys' basis (the query
// rotated like them).
void SelectHeadPages(Job& job, int h) {
  std::atomic<int>& state = job.sel_state[h];
  if (state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (!state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    // Another thread picks them now (tens of microseconds): spin, then
    // yield, since on a loaded machine that thread may need this CPU.
    for (int spins = 0; state.load(std::memory_order_acquire) != 2; ++spins) {
      if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
    return;
  }
  const SequenceKV& kv = *job.kv;
  const int G = job.G, D = job.D;
  thread_local std::vector<float> qg;
  qg.assign(job.q + static_cast<size_t>(h) * G * D, job.q + static_cast<size_t>(h + 1) * G * D);
  if (kv.keys_rotated()) {
    for (int g = 0; g < G; ++g) kv.rotation()->Forward(&qg[static_cast<size_t>(g) * D]);
  }
  SelectPages(kv.table(job.layer, h), kv.page_selection(), job.T, qg.data(), G, D, &job.sel[h]);
  KVX_CHECK(static_cast<int>(job.sel[h].size()) == job.visits[h]);
  state.store(2, std::memory_order_release);
}

}  // namespace

std::atomic<bool>& ColumnSumsAllowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

std::string ObserverParticipation::ArithmeticKey() const {
  if (!probabilities) return "none";
  if (column_sums) return "column-sums";
  return "probabilities,window=" + std::to_string(window);
}

ObserverParticipation Participation(const AttentionObserver* observer, int seq, int n_q) {
  ObserverParticipation p;
  p.observed = observer != nullptr && observer->Observes(seq, n_q);
  p.probabilities = p.observed && observer->WantsProbabilities();
  p.column_sums = p.probabilities && n_q > 1 && observer->WantsColumnSums() &&
                  ColumnSumsAllowed().load(std::memory_order_relaxed);
  p.window = p.probabilities ? observer->QueryWindow() : 0;
  return p;
}

void Attention(const SequenceKV& kv, int layer, const float* q, const int32_t* q_pos, int n_q, int n_heads,
               float scale, float* out, ThreadPool* pool, AttentionObserver* observer) {
  const AttentionSeq one{&kv, q, q_pos, n_q, out};
  AttentionBatch(&one, 1, layer, n_heads, scale, pool, observer);
}

void AttentionBatch(const AttentionSeq* seqs, int n_seqs, int layer, int n_heads, float scale, ThreadPool* pool,
                    AttentionObserver* observer) {
  // One Job per sequence; the items of all of them run in one parallel loop,
  // so a decode step over many sequences costs one dispatch per layer, not
  // one per sequence.
  // Reused across calls (per calling thread); the local references are what
  // the pool threads' lambdas see (a thread_local named there would be theirs).
  thread_local std::vector<Job> tls_jobs;
  std::vector<Job>& jobs = tls_jobs;
  jobs.clear();
  jobs.resize(n_seqs);
  // Items: (sequence, kv head, row block, context chunk), h-major per sequence.
  struct Item {
    int seq, h, block, chunk;
  };
  thread_local std::vector<Item> tls_items;
  std::vector<Item>& items = tls_items;
  items.clear();
  std::vector<size_t> part_base(n_seqs, 0);
  size_t n_obs_scores = 0;
  size_t n_parts = 0;
  int n_col_heads = 0;
  for (int si = 0; si < n_seqs; ++si) {
    const AttentionSeq& sq = seqs[si];
    const SequenceKV& kv = *sq.kv;
    const KVLayout& L = kv.layout();
    KVX_CHECK(layer >= 0 && layer < L.n_layers);
    KVX_CHECK(n_heads > 0 && n_heads % L.n_kv_heads == 0 && sq.n_q >= 0);
    Job& job = jobs[si];
    job = Job{};
    if (sq.n_q == 0) continue;
    const int H = L.n_kv_heads;
    job.kv = &kv;
    job.seq = si;
    job.layer = layer;
    job.lc = &kv.layer_codec(layer);
    job.q = sq.q;
    job.q_pos = sq.q_pos;
    job.n_heads = n_heads;
    job.G = n_heads / H;
    job.D = L.head_dim;
    job.T = L.page_tokens;
    job.scale = scale;
    job.rows_per_head = sq.n_q * job.G;
    job.blocks_per_head = (job.rows_per_head + kMaxQueryRows - 1) / kMaxQueryRows;
    const PageSelection& ps = kv.page_selection();
    if (ps.enabled && sq.n_q == 1 && layer >= ps.dense_layers) SelectJobPages(job);
    int max_pages = 0;
    for (int h = 0; h < H; ++h) max_pages = std::max(max_pages, VisitCount(job, h));
    job.chunk_pages = std::max({1, kAttentionChunkTokens / L.page_tokens,
                                (max_pages + kAttentionMaxChunks - 1) / kAttentionMaxChunks});
    job.rot = kv.rotation();
    job.keys_rotated = kv.keys_rotated();
    job.pre_rope = kv.keys_pre_rope();
    const ObserverParticipation part = Participation(observer, si, sq.n_q);
    if (part.observed) observer->OnQueries(si, layer, sq.q, sq.n_q, n_heads, L.head_dim);
    job.observer = part.probabilities ? observer : nullptr;
    job.obs_first_row = part.window > 0 ? std::max(0, sq.n_q - part.window) * job.G : 0;
    job.column_sums = part.column_sums;
    if (job.column_sums) {  // one chunk per head (a prompt's row blocks keep the threads busy)
      job.chunk_pages = std::max(1, max_pages);
      job.col_index = n_col_heads;
      n_col_heads += H;
    }
    job.out = sq.out;
    // Decode's query comes after every entry; a prompt's row blocks skip the
    // pages after all of their rows (half the pages of a causal prompt).
    job.skip_future = job.rows_per_head > job.G;
    if (job.skip_future) {
      job.page_min.resize(H);
      for (int h = 0; h < H; ++h) {
        const PageTable& t = kv.table(layer, h);
        job.page_min[h].resize(t.num_pages());
        for (int p = 0; p < t.num_pages(); ++p) {
          const int32_t* pos = PagePositions(kv.pool().PageData(t.pages()[p]));
          int32_t hi;
          MinMax(pos, t.EntriesInPage(p, L.page_tokens), &job.page_min[h][p], &hi);
        }
      }
    }
    job.part_stride = static_cast<size_t>(kMaxQueryRows) * (job.D + 2);
    job.chunks.resize(H);
    job.item_base.resize(H);
    size_t seq_items = 0;
    for (int h = 0; h < H; ++h) {
      const int pages = VisitCount(job, h);
      job.chunks[h] = std::max(1, (pages + job.chunk_pages - 1) / job.chunk_pages);
      job.item_base[h] = seq_items;
      for (int b = 0; b < job.blocks_per_head; ++b) {
        for (int c = 0; c < job.chunks[h]; ++c) items.push_back({si, h, b, c});
      }
      seq_items += static_cast<size_t>(job.blocks_per_head) * job.chunks[h];
    }
    part_base[si] = n_parts;
    n_parts += seq_items * job.part_stride;
    if (job.observer != nullptr) {
      const int obs_rows = job.rows_per_head - job.obs_first_row;
      job.obs_scores.resize(H);
      job.obs_offset.resize(H);
      job.obs_pos.resize(H);
      for (int h = 0; h < H; ++h) {
        const PageTable& t = kv.table(layer, h);
        job.obs_offset[h] = n_obs_scores;
        if (!job.column_sums) n_obs_scores += static_cast<size_t>(obs_rows) * t.length();
        job.obs_pos[h].resize(t.length());
        for (int p = 0; p < t.num_pages(); ++p) {
          const int32_t* pos = PagePositions(kv.pool().PageData(t.pages()[p]));
          std::copy(pos, pos + t.EntriesInPage(p, L.page_tokens),
                    job.obs_pos[h].data() + static_cast<size_t>(p) * L.page_tokens);
        }
      }
    }
  }
  thread_local std::vector<float> partials;
  partials.resize(n_parts);
  for (int si = 0; si < n_seqs; ++si) jobs[si].partials = partials.data() + part_base[si];
  // The observer's score matrices (rows x entries per head: 128 MB for a
  // 512-query call at 8k context) live in one buffer kept across calls, and
  // are not pre-filled: the items write every entry they visit, -inf for
  // the pages they skip, in parallel. Assigning them -inf afresh each call,
  // on the calling thread, took over half of an H2O prefill (page faults
  // and a scalar fill; H2O prefilled at 1/6 of the speed without a policy).
  // Only a page selection leaves pages unvisited: those matrices are filled.
  thread_local std::vector<float> tls_obs_scores;
  if (tls_obs_scores.size() < n_obs_scores) tls_obs_scores.resize(n_obs_scores);
  for (int si = 0; si < n_seqs; ++si) {
    Job& job = jobs[si];
    if (job.observer == nullptr || job.column_sums) continue;
    for (size_t h = 0; h < job.obs_scores.size(); ++h) {
      job.obs_scores[h] = tls_obs_scores.data() + job.obs_offset[h];
      if (job.selecting) {
        const size_t n = static_cast<size_t>(job.rows_per_head - job.obs_first_row) * job.obs_pos[h].size();
        std::fill(job.obs_scores[h], job.obs_scores[h] + n, kNegInf);
      }
    }
  }

  thread_local ColumnSums tls_cols;
  ColumnSums& cols = tls_cols;
  const int threads = pool != nullptr ? std::max(1, pool->size()) : 1;
  if (n_col_heads > 0) {
    cols.heads = n_col_heads;
    cols.arena.resize(threads);
    for (auto& a : cols.arena) a.clear();
    cols.at.assign(static_cast<size_t>(threads) * n_col_heads, -1);
    for (Job& job : jobs) job.cols = &cols;
  }

  // Consecutive items mostly share a sequence and codec: dispatch per item
  // (one switch, no virtual call per element).
  RunAll(items.size(), pool, [&](size_t it, size_t next, int thread) {
    const Item& item = items[it];
    Job& job = jobs[item.seq];
    if (job.selecting) SelectHeadPages(job, item.h);
    PageId after = kNoPage;
    if (next < items.size() && items[next].seq == item.seq) after = ChunkFirstPage(job, items[next].h, items[next].chunk);
    DispatchCodec(job.lc->id,
                  [&](auto codec) { RunItem<decltype(codec)>(job, item.h, item.block, item.chunk, after, thread); });
  });
  // The row blocks of the heads whose items did not write their outputs.
  struct Block {
    int seq, h, block;
  };
  std::vector<Block> merged;
  size_t merge_work = 0;
  for (int si = 0; si < n_seqs; ++si) {
    const Job& job = jobs[si];
    if (job.kv == nullptr) continue;
    for (int h = 0; h < static_cast<int>(job.chunks.size()); ++h) {
      if (WritesOutputs(job, h)) continue;
      for (int b = 0; b < job.blocks_per_head; ++b) merged.push_back({si, h, b});
      merge_work += static_cast<size_t>(job.blocks_per_head) * job.chunks[h];
    }
  }
  const bool merge_parallel = observer != nullptr || merge_work > 16;
  RunAll(merged.size(), merge_parallel ? pool : nullptr, [&](size_t i, size_t, int) {
    const Block& b = merged[i];
    MergeBlock(jobs[b.seq], b.h, b.block, jobs[b.seq].out);
  });
  if (n_col_heads > 0) DeliverColumnSums(jobs, cols, threads);
}

}  // namespace kvx::kv
