#include "engine/preemption.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace kvx::engine {

Result<PreemptMode> ParsePreemptMode(std::string_view text) {
  if (text == "auto") return PreemptMode::kAuto;
  if (text == "swap") return PreemptMode::kSwap;
  if (text == "recompute") return PreemptMode::kRecompute;
  return InvalidArgument("the preemption mode must be \"auto\" (by cost), \"swap\" (pages to host RAM and back) or "
                         "\"recompute\"");
}

const char* PreemptKindName(PreemptKind kind) { return kind == PreemptKind::kSwap ? "swap" : "recompute"; }

double PreemptCost::SwapSeconds() const { return 2.0 * static_cast<double>(bytes) / copy_bytes_per_second; }

double PreemptCost::RecomputeSeconds() const { return static_cast<double>(tokens) * prefill_seconds_per_token; }

PreemptKind ChoosePreemption(const PreemptCost& cost) {
  if (!(cost.copy_bytes_per_second > 0) || !(cost.prefill_seconds_per_token > 0)) return PreemptKind::kRecompute;
  return cost.SwapSeconds() < cost.RecomputeSeconds() ? PreemptKind::kSwap : PreemptKind::kRecompute;
}

double MeasureCopyBandwidth(uint64_t bytes) {
  std::vector<uint8_t> from(bytes, 1), to(bytes);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / std::max(s, 1e-9));
    from[i] = to[bytes - 1 - i];  // the copies are used: not optimised away
  }
  return best;
}

}  // namespace kvx::engine
