// The scheduler's per-request state (engine/scheduler.h is the interface),
// shared by its parts: scheduler.cc (construction, the thread-safe calls,
// sessions, the loop, stats), scheduler_gate.cc (Submit and every check of
// a request), scheduler_admit.cc (admission, in-flight prefix sharing,
// preemption) and scheduler_step.cc (a step, sampling, finishing). Only
// those files include it.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "engine/scheduler.h"
#include "engine/session.h"
#include "kv/radix_cache.h"

namespace kvx::engine {

// One sample of a request: its own sequence once it runs, its sampler and
// what it generated. The sample's full token list is request.base +
// generated; the KV holds all of it but `pending` (its suffix not fed yet:
// the prompt's rest during prefill, the last sampled token when decoding,
// everything after a preemption).
// A swapped-out sequence (scheduler_swap.cc): everything it held, its pages
// copied to host RAM.
struct SwappedSequence {
  kv::KVManager::SequenceImage image;         // page spans point into `storage`
  std::vector<std::vector<uint8_t>> storage;  // the pages
  uint64_t bytes = 0;
  // Leading tokens whose pages it shared with the request's first swapped
  // sample (samples fork its prompt): not copied, shared again at swap-in.
  int shared_tokens = 0;
};

struct Scheduler::Sample {
  int index = 0;
  std::unique_ptr<Session> session;  // null: not running
  kv::RadixCache::NodeId locked = kv::RadixCache::kNoNode;
  std::unique_ptr<model::Sampler> sampler;
  std::vector<int32_t> generated;
  std::vector<int32_t> pending;
  std::vector<float> logits;
  bool finished = false;
  // Samples 1..n-1 start as copy-on-write forks of sample 0 once its
  // prompt is done; until then they have no history of their own.
  bool forked = false;
  double last_token_time = 0;
  // In-flight prefix sharing: full blocks of its KV known to be in the
  // prefix cache (its path locked by `locked` while it runs).
  int published_blocks = 0;
  // Preempted by swap: its sequence, until readmission imports it.
  std::unique_ptr<SwappedSequence> swapped;
};

struct Scheduler::Request {
  RequestId id = 0;
  GenerationRequest req;
  EventCallback on_event;
  std::vector<int32_t> base;  // session tokens + session pending + prompt (set at first admission)
  bool started = false;       // admitted at least once
  bool waited_for_prefix = false;  // counted in prefix_waits
  bool tiers_asked = false;        // a tier lookup was considered
  std::shared_ptr<kv::tier::PendingLoad> tier_load;  // in flight
  std::vector<int> tier_tokens;    // per tier: prompt tokens imported from it
  std::vector<Sample> samples;
  int finished = 0;
  double submit_time = 0;
  RequestTiming timing;
  std::vector<int32_t> Full(const Sample& s) const {
    std::vector<int32_t> t = base;
    t.insert(t.end(), s.generated.begin(), s.generated.end());
    return t;
  }
};

struct Scheduler::Task {
  std::function<Status(Engine&)> fn;
  std::promise<Status> done;
};

}  // namespace kvx::engine
