// A per-step profile: where an engine step's time goes (kvx bench
// --profile). Cheap timers around the op groups of the forward pass and the
// step around it; off by default, when each timer costs one relaxed atomic
// load and nothing else.
//
// A phase's time is exclusive on the thread that opens it: opening a phase
// inside another pauses the outer one (the attention call that runs a
// policy's scoring counts as policy, not twice). Phases are opened by the
// stepping thread around whole parallel loops, so the times add up to the
// step's wall time. Observer callbacks run on the pool's workers, inside
// attention: their time is added from every thread (AddThreadTime) and
// reported apart, as a share of attention, not as a phase of its own.
//
// Thread-safety: Enable/Reset/Take from one thread while no step runs;
// ScopedPhase on any thread; AddThreadTime from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace kvx::util {

enum class StepPhase : int {
  kMatmul,      // the weight matrix products (QKV, output, gate/up, down, the logits head)
  kAttention,   // kv::AttentionBatch (scores, softmax, values, merges)
  kKvWrite,     // appending the step's K/V to the caches
  kElementwise, // embeddings, norms, RoPE, biases, SwiGLU, residual adds
  kSampling,    // choosing the next token from the logits
  kPolicy,      // KV policy hooks after a step (OnStepCommitted, compression)
  kScheduler,   // the step around the forward pass: input checks, page reservation, commit, logits copy
  kCount
};
inline constexpr int kStepPhases = static_cast<int>(StepPhase::kCount);

std::string_view StepPhaseName(StepPhase p);

struct StepProfileTotals {
  std::array<int64_t, kStepPhases> ns{};  // exclusive wall time per phase
  int64_t observer_thread_ns = 0;         // observer callbacks, summed over threads (inside kAttention)
};

bool StepProfileEnabled();
void EnableStepProfile(bool on);
void ResetStepProfile();
StepProfileTotals TakeStepProfile();  // the totals since the last reset
void AddThreadTime(int64_t observer_ns);

// Times the enclosing scope as `phase` when profiling is on.
class ScopedPhase {
 public:
  explicit ScopedPhase(StepPhase phase);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  bool on_;
  int outer_ = -1;  // the phase this one paused (-1: none)
};

// Nanoseconds on the steady clock (for AddThreadTime's callers).
int64_t SteadyNowNs();

}  // namespace kvx::util
