// How the scheduler preempts a running request when the KV pool runs out
// (engine/scheduler_swap.cc does it): by RECOMPUTE (its sequences are
// released; readmission computes them again, from whatever the prefix cache
// and the tiers still hold) or by SWAP (its sequences' pages are copied to
// host RAM and the pool pages released; readmission copies them back, byte
// for byte, and nothing is computed again).
//
// The choice is by cost: a swap moves the sequences' bytes twice (out and
// back) at the measured host copy bandwidth; a recompute runs their tokens
// through the model at the measured prefill speed. Both speeds are
// measured, not assumed (the bandwidth by a copy at start-up and then by
// every swap, the prefill speed by the steps).
#pragma once

#include <cstdint>
#include <string_view>

#include "util/status.h"

namespace kvx::engine {

enum class PreemptMode {
  kAuto,       // by cost (ChoosePreemption)
  kSwap,       // always swap (when the sequences can be exported and the swap space holds them)
  kRecompute,  // always recompute (kvx before swap existed)
};
// "auto", "swap" or "recompute" (--preempt); InvalidArgument naming them.
Result<PreemptMode> ParsePreemptMode(std::string_view text);

enum class PreemptKind { kSwap, kRecompute };
const char* PreemptKindName(PreemptKind kind);  // "swap", "recompute"

// What preempting one request would cost each way.
struct PreemptCost {
  uint64_t bytes = 0;                    // KV bytes of its sequences (moved out, then back)
  int64_t tokens = 0;                    // tokens their KV holds (computed again)
  double copy_bytes_per_second = 0;      // measured host copy bandwidth (0: unknown)
  double prefill_seconds_per_token = 0;  // measured prefill cost (0: unknown)
  double SwapSeconds() const;            // 2 * bytes / bandwidth
  double RecomputeSeconds() const;       // tokens * prefill cost
};

// kSwap when swapping is cheaper than recomputing. An unknown speed decides
// for the other way (nothing measured, nothing to compare: recompute, the
// way that needs no memory beside the pool).
PreemptKind ChoosePreemption(const PreemptCost& cost);

// Host memcpy bandwidth in bytes per second: the best of a few copies of
// `bytes` (a start-up measurement; swaps refine it).
double MeasureCopyBandwidth(uint64_t bytes = 16ull << 20);

}  // namespace kvx::engine
