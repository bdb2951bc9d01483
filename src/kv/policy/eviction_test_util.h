// A test rig for eviction policies: a KVManager with a policy, sequences
// fed through the step protocol with chosen keys, and attention
// probabilities handed to the policy's observer as the forward pass would
// (so a test plants exactly the attention pattern whose right answer it
// knows). Not part of the library.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/policy/policy.h"
#include "kv/policy/scored_eviction.h"

namespace kvx::kv::testing {

// Probability that query head `head` of layer `layer` (query at `qpos`)
// gives the entry at position `pos` before normalisation (>= 0).
using AttentionPattern = std::function<double(int layer, int head, int32_t qpos, int32_t pos)>;
// Key channel c of the entry at `pos` in (layer, kv_head).
using KeyFn = std::function<float(int layer, int kv_head, int32_t pos, int c)>;

class EvictionRig {
 public:
  // layout {layers, kv_heads, dim, page}; n_heads query heads per layer.
  EvictionRig(const std::string& spec, KVLayout layout, int n_heads, int n_ctx = 4096) : n_heads_(n_heads) {
    auto r = ResolveKVSpec(spec, layout, n_ctx, 1);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    m_ = std::move(KVManager::Create(std::move(*r))).value();
    seq_ = m_->AddSequence();
  }
  KVManager& manager() { return *m_; }
  SeqId seq() const { return seq_; }
  KVPolicy& policy() { return *m_->policies().at(0); }
  ScoredEvictionPolicy& scored() { return dynamic_cast<ScoredEvictionPolicy&>(policy()); }
  const KVLayout& layout() const { return m_->spec().layout; }

  // Appends n tokens (keys from `key`, default constant; values from
  // `value`, default 0.5) in one
  // step; the last `observed` queries of the step "attend" by `pattern`
  // (normalised over the visible live entries), given to the policy's
  // observer. Returns the step's status (the policies' result).
  Status Step(int n, const AttentionPattern& pattern, int observed, const KeyFn& key = nullptr,
              const KeyFn& value = nullptr) {
    const KVLayout& L = layout();
    std::vector<int32_t> toks(n, 1), pos(n);
    for (int i = 0; i < n; ++i) pos[i] = m_->length(seq_) + i;
    const StepRequest req{seq_, toks, pos};
    KVX_RETURN_IF_ERROR(m_->BeginStep({&req, 1}));
    std::vector<float> k(static_cast<size_t>(n) * L.n_kv_heads * L.head_dim), v(k.size(), 0.5f);
    for (int l = 0; l < L.n_layers; ++l) {
      for (int i = 0; i < n; ++i) {
        for (int h = 0; h < L.n_kv_heads; ++h) {
          for (int c = 0; c < L.head_dim; ++c) {
            const size_t at = (static_cast<size_t>(i) * L.n_kv_heads + h) * L.head_dim + c;
            k[at] = key ? key(l, h, pos[i], c) : 0.25f;
            if (value) v[at] = value(l, h, pos[i], c);
          }
        }
      }
      KVX_RETURN_IF_ERROR(m_->kv(seq_).Append(l, n, pos.data(), k.data(), v.data()));
    }
    AttentionObserver* obs = m_->policies().empty() ? nullptr : m_->policies()[0]->observer();
    if (obs != nullptr && pattern) {
      const int window = obs->QueryWindow() == 0 ? n : std::min(n, obs->QueryWindow());
      for (int l = 0; l < L.n_layers; ++l) {
        for (int h = 0; h < n_heads_; ++h) {
          const int kvh = h / (n_heads_ / L.n_kv_heads);
          const SequenceKV& kv = m_->kv(seq_);
          const PageTable& t = kv.table(l, kvh);
          std::vector<int32_t> slot_pos(t.length());
          for (int s = 0; s < t.length(); ++s) {
            slot_pos[s] = PagePositions(kv.pool().PageData(t.pages()[s / L.page_tokens]))[s % L.page_tokens];
          }
          for (int i = std::min(n, std::max(0, n - std::min(n, observed))); i < n; ++i) {
            if (i < n - window) continue;
            std::vector<float> p(t.length(), 0.0f);
            double sum = 0;
            for (int s = 0; s < t.length(); ++s) {
              if (slot_pos[s] == kDeadPosition || slot_pos[s] > pos[i]) continue;
              sum += pattern(l, h, pos[i], slot_pos[s]);
            }
            for (int s = 0; s < t.length(); ++s) {
              if (slot_pos[s] == kDeadPosition || slot_pos[s] > pos[i] || sum <= 0) continue;
              p[s] = static_cast<float>(pattern(l, h, pos[i], slot_pos[s]) / sum);
            }
            obs->OnProbabilities(0, l, i, h, kvh, p.data(), slot_pos.data(), t.length());
          }
        }
      }
    }
    return m_->CommitStep();
  }

  // The positions (layer, kv_head) holds, in chain order.
  std::vector<int32_t> Live(int layer, int kv_head) const {
    std::vector<int32_t> out;
    const SequenceKV& kv = m_->kv(seq_);
    const PageTable& t = kv.table(layer, kv_head);
    for (int s = 0; s < t.length(); ++s) {
      const int32_t p = PagePositions(kv.pool().PageData(t.pages()[s / layout().page_tokens]))[s % layout().page_tokens];
      if (p != kDeadPosition) out.push_back(p);
    }
    return out;
  }
  std::set<int32_t> LiveSet(int layer, int kv_head) const {
    auto v = Live(layer, kv_head);
    return {v.begin(), v.end()};
  }

 private:
  std::unique_ptr<KVManager> m_;
  SeqId seq_ = -1;
  int n_heads_;
};

}  // namespace kvx::kv::testing
