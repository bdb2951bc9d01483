#include "kv/policy/observations.h"

#include <algorithm>
#include <cmath>

namespace kvx::kv {
namespace {

void Grow(std::vector<float>* v, size_t n) {
  if (v->size() < n) v->resize(n, 0.0f);
}

// dst = dst * keep + sign * src, elementwise over the longer of the two.
void Blend(std::vector<float>* dst, const std::vector<float>& src, float keep, float sign = 1.0f) {
  Grow(dst, src.size());
  if (keep != 1.0f) {
    for (float& x : *dst) x *= keep;
  }
  for (size_t i = 0; i < src.size(); ++i) (*dst)[i] += sign * src[i];
}

void BlendStats(HeadStats* d, const HeadStats& s, const ObservationNeeds& needs, float keep, float sign = 1.0f) {
  Blend(&d->sum, s.sum, keep, sign);
  if (needs.squares) Blend(&d->sq, s.sq, keep, sign);
  if (needs.low_hits) Blend(&d->low, s.low, keep, sign);
  d->entropy = d->entropy * keep + sign * s.entropy;
  d->queries = d->queries * keep + sign * s.queries;
}

// The exact window: `ring` holds the newest steps whose queries cover the
// window (a step of at least that many alone) and `d` their sum; the oldest
// step leaves once the others cover the window without it. Low hits are
// whole counts, so adding and subtracting them stays exact.
void FoldIntoRing(std::deque<HeadStats>* ring, HeadStats* d, const HeadStats& s, const ObservationNeeds& needs) {
  if (s.queries >= needs.fold_window) {
    ring->clear();
    *d = HeadStats{};
  }
  ring->push_back(s);
  BlendStats(d, s, needs, 1.0f);
  while (ring->size() > 1 && d->queries - ring->front().queries >= needs.fold_window) {
    BlendStats(d, ring->front(), needs, 1.0f, -1.0f);
    ring->pop_front();
  }
}

size_t StatsBytes(const HeadStats& h) { return (h.sum.size() + h.sq.size() + h.low.size()) * sizeof(float) + sizeof(HeadStats); }

}  // namespace

const HeadStats* SequenceObservations::head(int layer, int head) const {
  auto it = heads_.find({layer, head});
  return it == heads_.end() ? nullptr : &it->second;
}

void SequenceObservations::Fold(const SequenceObservations& step, const ObservationNeeds& needs) {
  n_heads_ = std::max(n_heads_, step.n_heads_);
  for (const auto& [key, s] : step.heads_) {
    HeadStats& d = heads_[key];
    if (needs.fold_window > 0 && needs.exact_window) {
      FoldIntoRing(&rings_[key], &d, s, needs);
      continue;
    }
    float keep = 1.0f;  // accumulate
    if (needs.fold_window > 0) {
      keep = s.queries >= needs.fold_window ? 0.0f : 1.0f - static_cast<float>(s.queries / needs.fold_window);
    }
    BlendStats(&d, s, needs, keep);
  }
}

HeadStats* ProbabilityRecorder::StepHead(int seq, int layer, int head) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& obs = step_[seq];
  if (obs == nullptr) obs = std::make_unique<SequenceObservations>();
  obs->NoteHead(head);
  return &obs->mutable_head(layer, head);  // map nodes stay put
}

namespace {

// A prompt's chain before any eviction holds positions p0, p0 + 1, ...:
// then sums are one vectorizable add per entry up to the last one attended
// (a masked entry adds 0, which changes no sum), not a scattered add behind
// a branch (a fifth of an H2O prefill). Whether positions[0..last] are such
// a run, `top` the largest position of a value > 0.
bool ContiguousUpTo(const int32_t* positions, int last, int32_t top) {
  if (last < 0 || positions[0] < 0 || positions[last] != positions[0] + last || top != positions[last]) return false;
  for (int j = 1; j <= last; ++j) {
    if (positions[j] != positions[0] + j) return false;
  }
  return true;
}

// The largest position whose value is > 0 (-1: none), and the last such slot.
void LastPositive(const float* x, const int32_t* positions, int n, int32_t* top, int* last, int* count) {
  *top = -1, *last = -1, *count = 0;
  for (int j = 0; j < n; ++j) {
    if (x[j] > 0.0f) {
      *top = std::max(*top, positions[j]);
      ++*count;
      *last = j;
    }
  }
}

}  // namespace

void ProbabilityRecorder::OnProbabilities(int seq, int layer, int /*query_index*/, int head, int /*kv_head*/,
                                          const float* probs, const int32_t* positions, int n) {
  HeadStats* hs = StepHead(seq, layer, head);
  int32_t top;
  int visible, last;
  LastPositive(probs, positions, n, &top, &last, &visible);
  const float low_threshold = visible > 0 ? 1.0f / static_cast<float>(visible) : 0.0f;
  std::lock_guard<std::mutex> lock(Stripe(seq, layer, head));
  // Low hits and entropy must skip the zeros, so they keep the general loop.
  if (!needs_.low_hits && !needs_.entropy && ContiguousUpTo(positions, last, top)) {
    Grow(&hs->sum, static_cast<size_t>(top) + 1);
    float* sum = hs->sum.data() + positions[0];
    for (int j = 0; j <= last; ++j) sum[j] += probs[j];
    if (needs_.squares) {
      Grow(&hs->sq, static_cast<size_t>(top) + 1);
      float* sq = hs->sq.data() + positions[0];
      for (int j = 0; j <= last; ++j) sq[j] += probs[j] * probs[j];
    }
    hs->queries += 1.0;
    return;
  }
  const size_t need = static_cast<size_t>(top) + 1;
  Grow(&hs->sum, need);
  if (needs_.squares) Grow(&hs->sq, need);
  if (needs_.low_hits) Grow(&hs->low, need);
  double entropy = 0.0;
  for (int j = 0; j < n; ++j) {
    const float p = probs[j];
    if (!(p > 0.0f)) continue;  // masked, dead, or underflowed: never attended
    const int32_t pos = positions[j];
    hs->sum[pos] += p;
    if (needs_.squares) hs->sq[pos] += p * p;
    if (needs_.low_hits && p < low_threshold) hs->low[pos] += 1.0f;
    if (needs_.entropy) entropy -= static_cast<double>(p) * std::log(static_cast<double>(p));
  }
  hs->entropy += entropy;
  hs->queries += 1.0;
}

void ProbabilityRecorder::OnColumnSums(int seq, int layer, int head, const float* sums, const int32_t* positions,
                                       int n, int queries) {
  HeadStats* hs = StepHead(seq, layer, head);
  int32_t top;
  int count, last;
  LastPositive(sums, positions, n, &top, &last, &count);
  std::lock_guard<std::mutex> lock(Stripe(seq, layer, head));
  Grow(&hs->sum, static_cast<size_t>(top) + 1);
  if (ContiguousUpTo(positions, last, top)) {
    float* sum = hs->sum.data() + positions[0];
    for (int j = 0; j <= last; ++j) sum[j] += sums[j];
  } else {
    for (int j = 0; j < n; ++j) {
      if (sums[j] > 0.0f) hs->sum[positions[j]] += sums[j];  // masked, dead or underflowed: never attended
    }
  }
  hs->queries += queries;
}

void ProbabilityRecorder::FoldStep(const KVManager& manager, SeqId seq) {
  const auto reqs = manager.step_requests();
  int index = -1;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].seq == seq) index = static_cast<int>(i);
  }
  if (index < 0) return;
  auto it = step_.find(index);
  if (it == step_.end()) return;
  seqs_[seq].Fold(*it->second, needs_);
  step_.erase(it);
}

const SequenceObservations* ProbabilityRecorder::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

size_t SequenceObservations::Bytes() const {
  size_t n = 0;
  for (const auto& [key, h] : heads_) n += StatsBytes(h);
  for (const auto& [key, ring] : rings_) {
    for (const HeadStats& h : ring) n += StatsBytes(h);
  }
  return n;
}

}  // namespace kvx::kv
