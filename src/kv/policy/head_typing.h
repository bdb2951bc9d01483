// Head typing: DuoAttention (Xiao et al., 2024) and RazorAttention (Tang et
// al., 2024). Some (layer, kv-head)s are "retrieval" heads and keep their
// whole cache; the others are "streaming" heads and keep only the first
// `sinks` and the last `window` live entries (window = max(window,
// window_fraction * tokens) with window_fraction > 0, RazorAttention's n/5
// rule); the entries between are removed and their pages return to the pool.
//
// Which heads retrieve comes from a HEAD TABLE, a JSON file with one score
// per (layer, kv-head) written by `kvx calibrate-heads`
// (eval/head_calibration.h): DuoAttention trains a gate per head; kvx
// substitutes a calibration pass that measures each head's attention mass on
// the needle of synthetic passkey prompts (method "duo"), and
// RazorAttention's own data-free echo/induction scores on repeated random
// tokens (method "razor"). The top `retrieval` fraction of heads by score
// (ties: lower layer, then lower head) are retrieval heads.
// RazorAttention's compensation token (the mean of the dropped keys and
// values weighted by log|D| in the softmax) is not implemented: attention
// has no per-entry weight; the dropped entries are simply dropped.
//
// Parameters (--kv policy group, e.g. "policy=duo,heads=heads.json,retrieval=0.5"):
//   heads            the head table file (required)
//   retrieval        fraction of (layer, kv-head)s kept whole, 0..1
//                    (default duo 0.5 — the GQA setting of the paper —, razor 0.15)
//   sinks, window    streaming heads' kept entries (duo 128 + 256, razor 4 + 256)
//   window_fraction  razor: window = max(window, f * tokens)  (duo 0, razor 0.2)
//   mode             continuous (after every step, default) | once (on Compress)
//
// Thread-safety: as KVPolicy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kv/policy/policy.h"

namespace kvx::kv {

// Scores per (layer, kv-head), as calibrated.
struct HeadTable {
  std::string method;  // duo | razor
  std::string model;   // what it was calibrated on (informational)
  std::string calib;   // the calibration data, e.g. "copy: prose/jargon-4.4.7.txt" (informational)
  int n_layers = 0, n_kv_heads = 0;
  std::vector<double> scores;  // [n_layers * n_kv_heads]

  // NotFound / InvalidArgument naming the file and what is wrong with it.
  static Result<HeadTable> Load(const std::string& path);
  Status Save(const std::string& path) const;
  // 1 for the top ceil(fraction * heads) heads by score (ties: lower index).
  std::vector<uint8_t> RetrievalMask(double fraction) const;
};

class HeadTypingPolicy : public KVPolicy {
 public:
  static Result<std::unique_ptr<KVPolicy>> CreateDuo(PolicyParamReader& params);
  static Result<std::unique_ptr<KVPolicy>> CreateRazor(PolicyParamReader& params);
  PolicyParams Parameters() const override;
  // Retrieval heads keep every token, streaming heads StreamingKeep.
  double KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const override;

  std::string_view name() const override { return name_; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  Status Compress(KVManager& manager, SeqId seq) override;
  bool compresses_once() const override { return !continuous_; }
  // Once, it reads only the head table and the pages.
  std::optional<int> prompt_window() const override {
    return continuous_ ? std::nullopt : std::optional<int>(0);
  }
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;

  const std::vector<uint8_t>& retrieval() const { return retrieval_; }
  // Entries a streaming head keeps at `tokens` tokens.
  int StreamingKeep(int tokens) const;

 private:
  static Result<std::unique_ptr<KVPolicy>> Create(std::string name, PolicyParamReader& params, double retrieval,
                                                  int sinks, int window, double window_fraction);
  Status Evict(KVManager& manager, SeqId seq);

  std::string name_;
  HeadTable table_;
  std::vector<uint8_t> retrieval_;  // [n_layers * n_kv_heads]
  double retrieval_fraction_ = 0;   // retrieval=
  std::string heads_file_;          // heads=
  int sinks_ = 0, window_ = 0;
  double window_fraction_ = 0;
  bool continuous_ = true;
};

}  // namespace kvx::kv
