// kvx batch: an offline batch of requests from a JSONL file through the
// scheduler. Prompts are grouped by shared prefix first (BatchLLM's global
// prefix sharing, engine/prefix_groups.h): each group's common prefix is
// computed once and cached, then the group's requests start from it. With a
// policy that compresses once, --compress-at says where: after each whole
// prompt (each request compresses its own copy-on-write view of the cached
// prefix) or after the shared prefix (compressed once, every request forks
// the compressed cache: engine/compressed_cache.h). One JSON line per
// request on the output (input order), a summary on stderr that says what
// was reused and how.
//
// Input, one JSON object per line (blank lines ignored):
//   {"prompt": "text", "max_tokens": 64, "temperature": 0.8, "top_k": 40,
//    "top_p": 0.95, "min_p": 0.05, "seed": 1, "cache": "default" | "none",
//    "id": <any JSON, echoed>,
//    "chunks": ["text", ...], "chunk_repair": "blend,r=0.15"}
// Only "prompt" is required; the others default to the flags. "chunks" are
// placed in order before the prompt and assembled from the chunk cache
// (docs/kv-reuse.md); such requests are not grouped by prefix (their KV
// never enters the prefix cache).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/prefix_groups.h"
#include "engine/scheduler.h"
#include "kv/tier/tier_store.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/output_file.h"

namespace kvx::tools {

namespace {

using nlohmann::json;

struct BatchFlags {
  EngineFlags runtime;
  CacheFlags cache;
  std::string input;
  std::string output;  // "" = stdout
  int max_tokens = 64;
  model::SamplerOptions sampler;
  int max_step_tokens = 512;
  bool ignore_eos = false;
  bool no_grouping = false;
  ChunkFlags chunks;
  std::string compress_at = "prompt";  // or "prefix"
};

struct Item {
  int line = 0;
  std::string prompt;
  json id;  // echoed when given
  int max_tokens = 0;
  model::SamplerOptions sampling;
  engine::CacheMode cache = engine::CacheMode::kDefault;
  std::vector<int32_t> tokens;
  std::optional<std::vector<std::string>> chunks;
  std::optional<engine::ChunkRepair> chunk_repair;
  std::shared_ptr<const engine::ChunkPrompt> chunk_prompt;
};

// Reads and checks every line before anything runs: a bad line is an error
// naming it, not a half-written output.
Result<std::vector<Item>> ReadItems(const BatchFlags& flags) {
  std::ifstream in(flags.input);
  if (!in) return NotFound("cannot open the batch file '" + flags.input + "'");
  std::vector<Item> items;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = flags.input + ":" + std::to_string(line) + ": ";
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgument(where + "not valid JSON (one JSON object per line)");
    if (!j.is_object()) return InvalidArgument(where + "expected a JSON object like {\"prompt\": \"...\"}");
    Item it;
    it.line = line;
    it.max_tokens = flags.max_tokens;
    it.sampling = flags.sampler;
    for (auto& item : j.items()) {
      // Named references, not a structured binding: the lambda below
      // captures them, which clang before 16 refuses for bindings.
      const std::string& key = item.key();
      json& v = item.value();
      auto want_number = [&](bool integer) -> Status {
        if (!v.is_number() || (integer && !v.is_number_integer())) {
          return InvalidArgument(where + "\"" + key + "\" must be " + (integer ? "an integer" : "a number"));
        }
        return Status::Ok();
      };
      if (key == "prompt") {
        if (!v.is_string()) return InvalidArgument(where + "\"prompt\" must be a string");
        it.prompt = v.get<std::string>();
      } else if (key == "id") {
        it.id = v;
      } else if (key == "max_tokens") {
        KVX_RETURN_IF_ERROR(want_number(true));
        const int64_t n = v.get<int64_t>();
        if (n < 1 || n > 1000000) return InvalidArgument(where + "\"max_tokens\" must be in [1, 1000000]");
        it.max_tokens = static_cast<int>(n);
      } else if (key == "temperature") {
        KVX_RETURN_IF_ERROR(want_number(false));
        it.sampling.temperature = v.get<float>();
      } else if (key == "top_k") {
        KVX_RETURN_IF_ERROR(want_number(true));
        it.sampling.top_k = static_cast<int>(std::clamp<int64_t>(v.get<int64_t>(), -1, 1 << 30));
      } else if (key == "top_p") {
        KVX_RETURN_IF_ERROR(want_number(false));
        it.sampling.top_p = v.get<float>();
      } else if (key == "min_p") {
        KVX_RETURN_IF_ERROR(want_number(false));
        it.sampling.min_p = v.get<float>();
      } else if (key == "cache") {
        if (!v.is_string()) return InvalidArgument(where + "\"cache\" must be a string");
        Result<engine::CacheMode> mode = engine::ParseCacheMode(v.get<std::string>());
        if (!mode.ok()) return InvalidArgument(where + mode.status().message());
        it.cache = *mode;
      } else if (key == "chunks") {
        if (!v.is_array()) return InvalidArgument(where + "\"chunks\" must be an array of strings");
        it.chunks.emplace();
        for (size_t c = 0; c < v.size(); ++c) {
          if (!v[c].is_string()) return InvalidArgument(where + "\"chunks\"[" + std::to_string(c) + "] must be a string");
          it.chunks->push_back(v[c].get<std::string>());
        }
      } else if (key == "chunk_repair") {
        if (!v.is_string()) return InvalidArgument(where + "\"chunk_repair\" must be a string");
        Result<engine::ChunkRepair> repair = engine::ParseChunkRepair(v.get<std::string>());
        if (!repair.ok()) return InvalidArgument(where + repair.status().message());
        it.chunk_repair = *repair;
      } else if (key == "seed") {
        if (!v.is_number_unsigned()) return InvalidArgument(where + "\"seed\" must be a non-negative integer");
        it.sampling.seed = v.get<uint64_t>();
      } else {
        return InvalidArgument(where + "unknown field \"" + key +
                               "\" (known: prompt, max_tokens, temperature, top_k, top_p, min_p, seed, cache, id, chunks, "
                               "chunk_repair)");
      }
    }
    if (!j.contains("prompt")) return InvalidArgument(where + "missing the required field \"prompt\"");
    if (it.chunk_repair && !it.chunks) return InvalidArgument(where + "\"chunk_repair\" needs \"chunks\"");
    if (Status s = it.sampling.Validate(); !s.ok()) return InvalidArgument(where + s.message());
    items.push_back(std::move(it));
  }
  if (items.empty()) return InvalidArgument("the batch file '" + flags.input + "' holds no request");
  return items;
}

// Waits for requests submitted through it.
class Waiter {
 public:
  void Add() {
    std::lock_guard<std::mutex> l(mu_);
    ++open_;
  }
  void Done() {
    std::lock_guard<std::mutex> l(mu_);
    if (--open_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int open_ = 0;
};

struct Outcome {
  engine::RequestEvent finish;
};

Status Batch(const BatchFlags& flags) {
  KVX_ASSIGN_OR_RETURN(std::vector<Item> items, ReadItems(flags));
  KVX_ASSIGN_OR_RETURN(auto eng, LoadEngine(flags.runtime));
  const model::Tokenizer& tok = eng->model().tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  engine::SchedulerOptions so;
  const engine::ChunkRepair default_repair = ApplyChunkFlags(flags.chunks, &so);
  for (Item& it : items) {
    if (it.chunks) {
      Result<engine::ChunkPrompt> c = engine::MakeChunkPrompt(tok, *it.chunks, it.prompt, /*parse_special=*/false,
                                                              it.chunk_repair.value_or(default_repair));
      if (!c.ok()) return c.status().WithContext(flags.input + ":" + std::to_string(it.line));
      it.chunk_prompt = std::make_shared<const engine::ChunkPrompt>(std::move(c).value());
      it.tokens = it.chunk_prompt->Tokens();
    } else {
      KVX_ASSIGN_OR_RETURN(it.tokens, tok.Encode(it.prompt, /*add_special=*/true, /*parse_special=*/false));
    }
    if (it.tokens.empty()) {
      return InvalidArgument(flags.input + ":" + std::to_string(it.line) +
                             ": the prompt is empty and the model adds no BOS token");
    }
    if (static_cast<int64_t>(it.tokens.size()) >= eng->n_ctx()) {
      return InvalidArgument(flags.input + ":" + std::to_string(it.line) + ": the prompt has " +
                             std::to_string(it.tokens.size()) + " tokens, the context holds " +
                             std::to_string(eng->n_ctx()) + "; shorten it or raise -c");
    }
    prompts.push_back(it.tokens);
  }
  std::FILE* out = stdout;
  std::optional<OutputFile> file;  // -o: checked before the work, in place once complete
  if (!flags.output.empty()) {
    KVX_ASSIGN_OR_RETURN(file, OutputFile::Open(flags.output));
    out = file->stream();
  }
  // What the requests' callbacks write to outlives the scheduler: a Submit
  // that fails midway returns, and the scheduler's destructor then cancels
  // the requests already in flight (their callbacks run).
  Waiter warm, all;
  std::vector<Outcome> outcomes(items.size());
  so.max_step_tokens = flags.max_step_tokens;
  so.max_running = std::min(flags.runtime.options.n_seqs, flags.max_step_tokens);
  KVX_RETURN_IF_ERROR(ApplyCacheFlags(flags.cache, *eng, &so));
  KVX_ASSIGN_OR_RETURN(auto sched, engine::Scheduler::Create(*eng, so));
  const auto t0 = std::chrono::steady_clock::now();

  const int block = eng->kv_manager().spec().layout.page_tokens;
  std::vector<engine::PrefixGroup> groups;
  // Chunked prompts in a group of their own, without a shared prefix.
  std::vector<int> plain;
  engine::PrefixGroup chunked;
  for (int i = 0; i < static_cast<int>(items.size()); ++i) (items[i].chunks ? chunked.members : plain).push_back(i);
  if (flags.no_grouping) {
    engine::PrefixGroup all;
    all.members = plain;
    groups.push_back(all);
  } else {
    std::vector<std::vector<int32_t>> plain_prompts;
    for (int i : plain) plain_prompts.push_back(prompts[i]);
    groups = engine::GroupByPrefix(plain_prompts, block);
    for (engine::PrefixGroup& g : groups) {
      for (int& m : g.members) m = plain[m];
    }
  }
  if (!chunked.members.empty()) groups.push_back(chunked);
  // 1. Each shared prefix once: a one-token request whose finished sequence
  //    the prefix cache keeps (its KV is exactly the prefix's whole blocks).
  //    With --compress-at prefix it is compressed at its end and kept so;
  //    else whole, and the requests compress their own views.
  const bool at_prefix = flags.compress_at == "prefix";
  int warmups = 0;
  for (const engine::PrefixGroup& g : groups) {
    if (g.prefix_tokens == 0) continue;
    engine::GenerationRequest r;
    r.prompt.assign(prompts[g.members[0]].begin(), prompts[g.members[0]].begin() + g.prefix_tokens);
    r.max_tokens = 1;
    r.sampling.temperature = 0;
    r.compress = at_prefix;
    r.compress_at = at_prefix ? g.prefix_tokens : 0;
    warm.Add();
    ++warmups;
    KVX_RETURN_IF_ERROR(sched->Submit(std::move(r), [&warm](const engine::RequestEvent& e) {
      if (e.done) warm.Done();
    }).status());
  }
  warm.Wait();
  // 2. The requests, group by group.
  for (const engine::PrefixGroup& g : groups) {
    for (int i : g.members) {
      engine::GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = items[i].max_tokens;
      r.sampling = items[i].sampling;
      r.stop_at_eog = !flags.ignore_eos;
      r.cache = items[i].cache;
      r.chunks = items[i].chunk_prompt;
      if (at_prefix) r.compress_at = g.prefix_tokens;
      all.Add();
      auto id = sched->Submit(std::move(r), [&all, &outcomes, i](const engine::RequestEvent& e) {
        if (e.kind == engine::RequestEvent::Kind::kFinish) {
          outcomes[i].finish = e;
          if (e.done) all.Done();
        }
      });
      if (!id.ok()) return id.status().WithContext(flags.input + ":" + std::to_string(items[i].line));
    }
  }
  all.Wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sched->Shutdown(engine::ShutdownMode::kDrain);
  const engine::SchedulerStats st = sched->Stats();

  uint64_t generated = 0, prompt_tokens = 0, cached = 0;
  int failed = 0, reused = 0;  // reused: requests that started from their group's shared prefix
  std::vector<int> group_prefix(items.size(), 0);
  for (const engine::PrefixGroup& g : groups) {
    for (int i : g.members) group_prefix[i] = g.prefix_tokens;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const engine::RequestEvent& e = outcomes[i].finish;
    json j;
    j["index"] = i;
    j["line"] = items[i].line;
    if (!items[i].id.is_null()) j["id"] = items[i].id;
    if (e.reason == engine::FinishReason::kError) {
      j["error"] = e.status.ToString();
      ++failed;
    } else {
      std::string text;
      for (int32_t t : e.tokens) {
        if (!tok.IsEog(t)) text += tok.TokenToPiece(t, /*special=*/false);
      }
      j["text"] = text;
      j["finish_reason"] = engine::FinishReasonName(e.reason);
    }
    j["prompt_tokens"] = e.timing.prompt_tokens;
    j["cached_tokens"] = e.timing.cached_tokens;
    if (!e.timing.cached_by_tier.empty()) {
      json by_tier = json::object();
      for (const auto& [tier, n] : e.timing.cached_by_tier) by_tier[tier] = n;
      j["cached_by_tier"] = by_tier;
    }
    if (e.timing.chunk_tokens > 0) {
      j["chunk_tokens"] = e.timing.chunk_tokens;
      j["chunk_cache_tokens"] = e.timing.chunk_cached_tokens;
      j["chunk_recomputed_tokens"] = e.timing.chunk_recomputed_tokens;
    }
    j["generated_tokens"] = e.tokens.size();
    // Submitted -> first token, and its two parts: waiting in the queue
    // (for room in the pool, a prefix, a tier load) and admitted -> first token.
    j["ttft_ms"] = e.timing.ttft_seconds * 1e3;
    j["queue_ms"] = e.timing.queue_seconds * 1e3;
    j["admitted_ttft_ms"] = std::max(0.0, e.timing.ttft_seconds - e.timing.queue_seconds) * 1e3;
    const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), out);
    generated += e.tokens.size();
    prompt_tokens += static_cast<uint64_t>(e.timing.prompt_tokens);
    cached += static_cast<uint64_t>(e.timing.cached_tokens);
    if (group_prefix[i] > 0 && e.timing.cached_tokens >= group_prefix[i]) ++reused;
  }
  if (file) {
    KVX_RETURN_IF_ERROR(file->Commit());
  } else {
    std::fflush(out);
  }
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::fprintf(stderr,
               "batch: %zu requests (%d failed) in %.2f s | %zu groups, %d shared prefixes computed, %d requests "
               "started from theirs | prompt %llu tokens, %llu reused (%.1f%%: %llu from the prefix cache, %llu from "
               "%llu compressed-cache hits), %llu computed | %llu compressions | generated %llu tokens, %.1f tok/s | "
               "%llu steps (%.2f s), %llu preemptions (%llu swapped, %.3f s in swaps) | KV pool %.2f / %.2f MiB\n",
               items.size(), failed, seconds, groups.size(), warmups, reused, u(prompt_tokens), u(cached),
               prompt_tokens ? 100.0 * cached / prompt_tokens : 0.0, u(st.prefix_hit_tokens),
               u(st.compressed_hit_tokens), u(st.compressed_hits), u(st.prompt_tokens_computed), u(st.compressions),
               u(generated), seconds > 0 ? generated / seconds : 0.0, u(st.steps), st.busy_seconds, u(st.preemptions),
               u(st.preempt_swaps), st.swap_seconds, st.pool_bytes_used / 1048576.0, st.pool_budget_bytes / 1048576.0);
  if (so.tiers) {
    // CPU seconds, which other work on the machine does not inflate: what
    // the tiers' I/O thread (encoding, writes, loads) took beside the rest
    // of the process (the decode threads, mostly). After the scheduler's
    // last writes (write-back writes what the cache holds at its end).
    sched.reset();
    so.tiers->Flush();
    const kv::tier::TierStoreCounters tc = so.tiers->counters();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double process = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                           1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    const double rest = process - tc.io_cpu_seconds;
    std::fprintf(stderr,
                 "batch: tiers: %llu blocks written, %llu tokens from tiers | CPU: tier I/O thread %.3f s, the rest of "
                 "the process %.3f s (I/O = %.2f%% of the rest)\n",
                 u(tc.blocks_written), u(st.tier_hit_tokens), tc.io_cpu_seconds, rest,
                 rest > 0 ? 100.0 * tc.io_cpu_seconds / rest : 0.0);
  }
  return failed == 0 ? Status::Ok()
                     : ResourceExhausted(std::to_string(failed) + " request(s) failed; see their \"error\" lines");
}

}  // namespace

void RegisterBatch(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<BatchFlags>();
  flags->runtime.options.n_seqs = 8;
  CLI::App* cmd = app.add_subcommand(
      "batch", "Run a JSONL file of requests through the scheduler, shared prefixes first (one JSON line each)");
  cmd->add_option("file", flags->input, "JSONL requests: {\"prompt\": \"...\", \"max_tokens\": N, ...} per line")
      ->required();
  AddEngineFlags(cmd, &flags->runtime,
                 ContextFlag{.help = "Context length per request (0: the model's trained context)"});
  cmd->add_option("-o,--output", flags->output, "Write the results here (default: stdout)");
  cmd->add_option("--parallel", flags->runtime.options.n_seqs,
                  "Sequences running at once (also sizes the KV budget when --kv sets none)")
      ->capture_default_str()
      ->check(IntIn(1, 4096));
  cmd->add_option("--step-tokens", flags->max_step_tokens, "Tokens per forward step (decode rows + prefill chunks)")
      ->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("-n,--max-tokens", flags->max_tokens, "Default max_tokens of a request")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--temp", flags->sampler.temperature, "Default temperature (<= 0: greedy)")->capture_default_str()
      ->check(Finite("<= 0: greedy"));
  cmd->add_option("--seed", flags->sampler.seed, "Default seed")->capture_default_str();
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Do not stop at end-of-text");
  AddCacheFlags(cmd, &flags->cache);
  AddChunkFlags(cmd, &flags->chunks);
  cmd->add_flag("--no-grouping", flags->no_grouping, "Submit in file order without computing shared prefixes first");
  cmd->add_option("--compress-at", flags->compress_at,
                  "With a policy that compresses once: after each whole prompt (prompt: query-aware, each request "
                  "compresses its own view of the cached prefix) or after the shared prefix (prefix: compressed once, "
                  "every request of the group forks it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"prompt", "prefix"}));
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(Batch(*flags)); });
}

}  // namespace kvx::tools
