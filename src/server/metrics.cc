#include "server/metrics.h"

#include <cstdio>
#include <string>
#include <vector>

namespace kvx::server {
namespace {

class Out {
 public:
  void Metric(const char* name, const char* type, const char* help) {
    text_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, double value, const std::string& labels = "") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    text_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  }
  void Gauge(const char* name, const char* help, double value) {
    Metric(name, "gauge", help);
    Sample(name, value);
  }
  void Counter(const char* name, const char* help, double value) {
    Metric(name, "counter", help);
    Sample(name, value);
  }
  void Histogram(const char* name, const char* help, const engine::Histogram& h) {
    Metric(name, "histogram", help);
    HistogramSamples(name, h.bounds, h.counts, h.sum, h.count, "");
  }
  // One histogram's samples; `labels` (may be empty) precede le.
  void HistogramSamples(const std::string& name, const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                        double sum, uint64_t count, const std::string& labels) {
    const std::string first = labels.empty() ? "" : labels + ",";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cumulative += i < counts.size() ? counts[i] : 0;
      char le[32];
      std::snprintf(le, sizeof le, "%g", bounds[i]);
      Sample(name + "_bucket", static_cast<double>(cumulative), first + "le=\"" + le + "\"");
    }
    Sample(name + "_bucket", static_cast<double>(count), first + "le=\"+Inf\"");
    Sample(name + "_sum", sum, labels);
    Sample(name + "_count", static_cast<double>(count), labels);
  }
  std::string& text() { return text_; }

 private:
  std::string text_;
};

// A label value with \ " and newlines escaped.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// The KV tiers: one sample per tier of each counter, labelled by the tier.
void TierMetrics(const engine::SchedulerStats& s, Out& o) {
  if (s.tiers.empty()) return;
  using kv::tier::TierStats;
  struct Field {
    const char* name;
    const char* type;
    const char* help;
    uint64_t TierStats::*value;
  };
  const Field fields[] = {
      {"kvx_tier_hits_total", "counter", "Tier reads that found a block", &TierStats::hits},
      {"kvx_tier_misses_total", "counter", "Tier reads that found none (or could not read)", &TierStats::misses},
      {"kvx_tier_puts_total", "counter", "Blocks written to the tier", &TierStats::puts},
      {"kvx_tier_bytes", "gauge", "Bytes the tier holds (Redis: what this process wrote)", &TierStats::bytes},
      {"kvx_tier_blocks", "gauge", "Blocks the tier holds (Redis: what this process wrote)", &TierStats::blocks},
      {"kvx_tier_evictions_total", "counter", "Blocks evicted to stay within the tier's budget", &TierStats::evictions},
      {"kvx_tier_errors_total", "counter", "Failed reads/writes, refused writes and corrupted blocks dropped",
       &TierStats::errors},
      {"kvx_tier_pinned", "gauge", "Blocks pinned (\"cache\": \"pin\"; the host-RAM tier)", &TierStats::pinned},
      {"kvx_tier_pins_broken_total", "counter", "Pinned blocks evicted because the tier's budget held nothing else",
       &TierStats::pins_broken},
  };
  for (const Field& f : fields) {
    o.Metric(f.name, f.type, f.help);
    for (const auto& t : s.tiers) o.Sample(f.name, static_cast<double>(t.stats.*f.value), "tier=\"" + Escape(t.name) + "\"");
  }
  o.Metric("kvx_tier_load_seconds", "histogram", "Time to read (and check) one block from a tier, hit or miss");
  for (const auto& t : s.tiers) {
    o.HistogramSamples("kvx_tier_load_seconds", t.load_bounds, t.load_counts, t.load_seconds, t.loads,
                       "tier=\"" + Escape(t.name) + "\"");
  }
  const kv::tier::TierStoreCounters& c = s.tier_counters;
  o.Counter("kvx_tier_lookups_total", "Tier lookups of queued requests", static_cast<double>(c.lookups));
  o.Counter("kvx_tier_loads_abandoned_total", "Tier loads stopped because they were slower than recomputing",
            static_cast<double>(c.abandoned));
  o.Counter("kvx_tier_corrupt_blocks_total", "Blocks that failed their checks on load (dropped, recomputed)",
            static_cast<double>(c.corrupt_blocks));
  o.Counter("kvx_tier_blocks_written_total", "Blocks written through to the tiers", static_cast<double>(c.blocks_written));
  o.Counter("kvx_tier_writes_dropped_total", "Blocks not written because the write queue was full",
            static_cast<double>(c.writes_dropped));
  o.Counter("kvx_tier_hit_tokens_total", "Prompt tokens admitted from blocks loaded from a tier",
            static_cast<double>(s.tier_hit_tokens));
  o.Counter("kvx_tier_swapped_in_tokens_total",
            "Tokens of preempted requests loaded back from a tier at readmission instead of recomputed",
            static_cast<double>(s.swapped_in_tokens));
}

// Chunk reuse (docs/kv-reuse.md): where the chunk tokens of assembled
// prompts came from, and the chunk cache.
void ChunkMetrics(const engine::SchedulerStats& s, Out& o) {
  const struct {
    const char* name;
    bool counter;
    const char* help;
    double value;
  } fields[] = {
      {"kvx_chunk_tokens_total", true, "Chunk tokens of assembled prompts (\"chunks\", chat content parts)",
       static_cast<double>(s.chunk_tokens)},
      {"kvx_chunk_cache_tokens_total", true, "Chunk tokens whose KV came from the chunk cache",
       static_cast<double>(s.chunk_cached_tokens)},
      {"kvx_chunk_computed_tokens_total", true, "Chunk tokens computed alone on a chunk cache miss (then cached)",
       static_cast<double>(s.chunk_computed_tokens)},
      {"kvx_chunk_recomputed_tokens_total", true,
       "Chunk tokens recomputed in context through the last layer (the repair; all of them with full)",
       static_cast<double>(s.chunk_recomputed_tokens)},
      {"kvx_chunk_cache_bytes", false, "Bytes of chunk KV held by the chunk cache", static_cast<double>(s.chunk_cache.bytes)},
      {"kvx_chunk_cache_entries", false, "Chunks held by the chunk cache", static_cast<double>(s.chunk_cache.entries)},
      {"kvx_chunk_cache_evictions_total", true, "Chunks evicted from the chunk cache (least recently used)",
       static_cast<double>(s.chunk_cache.evictions)},
  };
  for (const auto& f : fields) {
    if (f.counter) o.Counter(f.name, f.help, f.value);
    else o.Gauge(f.name, f.help, f.value);
  }
}

}  // namespace

std::string RenderMetrics(const engine::SchedulerStats& s, const HttpCounters& http) {
  Out o;
  o.Gauge("kvx_pool_bytes_used", "Bytes of KV pages in use in the pool", static_cast<double>(s.pool_bytes_used));
  o.Gauge("kvx_pool_budget_bytes", "The KV pool's byte budget", static_cast<double>(s.pool_budget_bytes));
  o.Metric("kvx_pages_in_use", "gauge", "KV pages in use per page class (codec and page size)");
  for (const auto& c : s.page_classes) {
    o.Sample("kvx_pages_in_use", static_cast<double>(c.pages_in_use),
             "class=\"" + Escape(c.label) + "\",page_bytes=\"" + std::to_string(c.page_bytes) + "\"");
  }
  o.Gauge("kvx_sequences_running", "Sequences decoding or prefilling", s.running_sequences);
  o.Gauge("kvx_requests_running", "Requests admitted and not finished", s.running_requests);
  o.Gauge("kvx_queue_length", "Requests waiting for admission", s.queued);
  o.Gauge("kvx_sessions", "Named sessions kept in the pool", s.sessions);
  o.Gauge("kvx_prefix_cache_bytes", "Bytes of pages held only by the prefix cache", static_cast<double>(s.cache_bytes));
  o.Gauge("kvx_prefix_cache_blocks", "Token blocks in the prefix cache", static_cast<double>(s.cache_blocks));
  o.Counter("kvx_prefix_cache_lookups_total", "Admissions that looked up the prefix cache",
            static_cast<double>(s.prefix_lookups));
  o.Counter("kvx_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache",
            static_cast<double>(s.prefix_lookup_tokens));
  o.Counter("kvx_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache (not recomputed)",
            static_cast<double>(s.prefix_hit_tokens));
  o.Gauge("kvx_prefix_cache_hit_ratio", "Prompt tokens found cached / looked up, since start",
          s.prefix_lookup_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_lookup_tokens : 0.0);
  o.Counter("kvx_prefix_cache_evicted_blocks_total", "Blocks evicted from the prefix cache",
            static_cast<double>(s.cache_evicted_blocks));
  o.Counter("kvx_prefix_cache_inflight_waits_total",
            "Requests that waited for another request still prefilling their shared prefix, to start from its blocks",
            static_cast<double>(s.prefix_waits));
  o.Counter("kvx_steps_total", "Forward steps run", static_cast<double>(s.steps));
  o.Counter("kvx_prompt_tokens_total", "Prompt tokens computed (cache hits excluded)",
            static_cast<double>(s.prompt_tokens_computed));
  o.Counter("kvx_generated_tokens_total", "Tokens generated", static_cast<double>(s.tokens_generated));
  o.Counter("kvx_preemptions_total", "Requests preempted when the pool ran out (swapped or recomputed)",
            static_cast<double>(s.preemptions));
  o.Metric("kvx_preempt_total", "counter",
           "Preemptions by kind: swap (pages to host RAM and back), recompute (sequences released, computed again)");
  o.Sample("kvx_preempt_total", static_cast<double>(s.preempt_swaps), "kind=\"swap\"");
  o.Sample("kvx_preempt_total", static_cast<double>(s.preempt_recomputes), "kind=\"recompute\"");
  o.Gauge("kvx_swapped_bytes", "Host RAM held by sequences swapped out of the pool (idle named sessions included)",
          static_cast<double>(s.swapped_bytes));
  o.Counter("kvx_sessions_swapped_out_total", "Idle named sessions swapped to host RAM to make room in the pool",
            static_cast<double>(s.sessions_swapped_out));
  o.Gauge("kvx_swap_copy_bytes_per_second", "The host copy bandwidth swap preemption is costed at (measured)",
          s.copy_bytes_per_second);
  o.Counter("kvx_requests_submitted_total", "Requests submitted", static_cast<double>(s.requests_submitted));
  o.Counter("kvx_requests_finished_total", "Requests finished (any reason)", static_cast<double>(s.requests_finished));
  o.Counter("kvx_requests_cancelled_total", "Requests cancelled (client gone, shutdown)",
            static_cast<double>(s.requests_cancelled));
  o.Counter("kvx_requests_failed_total", "Requests that failed", static_cast<double>(s.requests_failed));
  o.Counter("kvx_busy_seconds_total", "Seconds spent in forward steps", s.busy_seconds);
  o.Counter("kvx_decode_rows_total", "Decode rows run (one token of a running sample each)",
            static_cast<double>(s.decode_rows));
  o.Counter("kvx_decode_only_steps_total", "Forward steps without a prefill chunk",
            static_cast<double>(s.decode_only_steps));
  o.Counter("kvx_decode_only_seconds_total", "Seconds spent in forward steps without a prefill chunk",
            s.decode_only_seconds);
  o.Counter("kvx_host_seconds_total",
            "Seconds of the scheduler loop outside forward steps while work ran (admission, sampling, events)",
            s.host_seconds);
  o.Counter("kvx_sample_seconds_total", "Seconds spent sampling tokens and delivering their events", s.sample_seconds);
  o.Gauge("kvx_uptime_seconds", "Seconds since the scheduler started", s.uptime_seconds);
  o.Gauge("kvx_generated_tokens_per_second", "Tokens generated per second of step time, since start",
          s.busy_seconds > 0 ? static_cast<double>(s.tokens_generated) / s.busy_seconds : 0.0);
  o.Histogram("kvx_ttft_seconds", "Time to first token", s.ttft);
  o.Histogram("kvx_inter_token_seconds", "Time between consecutive tokens of a sample", s.inter_token);
  o.Histogram("kvx_queue_seconds", "Time from submission to admission", s.queue_time);
  TierMetrics(s, o);
  ChunkMetrics(s, o);
  o.Metric("kvx_http_responses_total", "counter", "HTTP responses by status code");
  for (const auto& [code, n] : http.responses_by_status) {
    o.Sample("kvx_http_responses_total", static_cast<double>(n), "code=\"" + std::to_string(code) + "\"");
  }
  o.Counter("kvx_client_disconnects_total", "Requests whose client left before the end (request cancelled)",
            static_cast<double>(http.client_disconnects));
  o.Gauge("kvx_http_connections", "Client connections open", static_cast<double>(http.open_connections));
  o.Counter("kvx_http_connections_refused_total", "503s at --max-connections", static_cast<double>(http.refused_connections));
  o.Counter("kvx_http_request_timeouts_total", "Requests not read in time (408)", static_cast<double>(http.request_timeouts));
  return std::move(o.text());
}

}  // namespace kvx::server
