#include "util/step_profile.h"

#include <atomic>
#include <chrono>

namespace kvx::util {

namespace {

std::atomic<bool> g_enabled{false};
std::array<std::atomic<int64_t>, kStepPhases> g_ns{};
std::atomic<int64_t> g_observer_ns{0};

// The phase open on this thread and when it was (re)started.
thread_local int t_phase = -1;
thread_local int64_t t_since = 0;

void Charge(int phase, int64_t now) {
  if (phase >= 0) g_ns[phase].fetch_add(now - t_since, std::memory_order_relaxed);
}

}  // namespace

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kMatmul: return "matmuls";
    case StepPhase::kAttention: return "attention";
    case StepPhase::kKvWrite: return "KV append";
    case StepPhase::kElementwise: return "norms, RoPE, SwiGLU, residuals";
    case StepPhase::kSampling: return "sampling";
    case StepPhase::kPolicy: return "policy hooks";
    case StepPhase::kScheduler: return "step bookkeeping";
    case StepPhase::kCount: break;
  }
  return "?";
}

bool StepProfileEnabled() { return g_enabled.load(std::memory_order_relaxed); }
void EnableStepProfile(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void ResetStepProfile() {
  for (auto& n : g_ns) n.store(0, std::memory_order_relaxed);
  g_observer_ns.store(0, std::memory_order_relaxed);
}

StepProfileTotals TakeStepProfile() {
  StepProfileTotals t;
  for (int i = 0; i < kStepPhases; ++i) t.ns[i] = g_ns[i].load(std::memory_order_relaxed);
  t.observer_thread_ns = g_observer_ns.load(std::memory_order_relaxed);
  return t;
}

void AddThreadTime(int64_t observer_ns) { g_observer_ns.fetch_add(observer_ns, std::memory_order_relaxed); }

ScopedPhase::ScopedPhase(StepPhase phase) : on_(StepProfileEnabled()) {
  if (!on_) return;
  const int64_t now = SteadyNowNs();
  Charge(t_phase, now);
  outer_ = t_phase;
  t_phase = static_cast<int>(phase);
  t_since = now;
}

ScopedPhase::~ScopedPhase() {
  if (!on_) return;
  const int64_t now = SteadyNowNs();
  Charge(t_phase, now);
  t_phase = outer_;
  t_since = now;
}

}  // namespace kvx::util
