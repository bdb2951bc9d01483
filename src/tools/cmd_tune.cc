// kvx tune: the best KV spec for a model, a text and a memory budget
// (eval/tune.h). Thin: parses flags, loads the model and the text, runs the
// search, and writes the result (the JSON --kv @FILE reads, and the Pareto
// chart) after every pass, so Ctrl-C or --time-budget keeps the best so far.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "eval/ruler.h"
#include "eval/tune.h"
#include "eval/tune_cache.h"
#include "eval/tune_heads.h"
#include "model/fingerprint.h"
#include "model/model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/byte_size.h"
#include "util/mmap_file.h"
#include "util/output_file.h"
#include "util/clock.h"
#include "util/thread_pool.h"

namespace kvx::tools {

namespace {

struct TuneFlags {
  eval::TuneOptions options;
  std::string model_path;
  std::string mem;
  std::string text_file;
  std::string data_dir = "../shared/data";
  std::string quality;
  std::string tasks;
  std::string out_file;
  std::string svg_file;
  // Head typing's tables (default: calibrated once into the tune cache).
  std::string duo_heads, razor_heads, heads_text;
  bool no_head_typing = false;
  double time_budget = 0;
  int n_threads = 0;
  bool quiet = false;
};

std::atomic<bool> g_interrupted{false};

// The first Ctrl-C asks the search to stop after the pass it is in (and keep
// the best spec so far); a second one ends the process at once.
extern "C" void OnInterrupt(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);
}

// "kld<=0.01" -> 0.01.
Result<double> ParseQuality(std::string text) {
  std::erase(text, ' ');
  const std::string prefix = "kld<=";
  const std::string bad = "--quality must be kld<=X with X > 0, e.g. --quality 'kld<=0.01' (got '" + text + "')";
  if (text.rfind(prefix, 0) != 0) return InvalidArgument(bad);
  char* end = nullptr;
  const std::string number = text.substr(prefix.size());
  const double x = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(x > 0) || !std::isfinite(x)) {
    return InvalidArgument(bad);
  }
  return x;
}

// "2026-11-28T22:28:13Z", as kvx eval's reports record their time.
std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::ostringstream s;
  s << std::put_time(std::gmtime(&t), "%FT%TZ");
  return s.str();
}

// The duo and razor tables the space's head-typing specs name: the given
// files, else the tune cache's for this model; each calibrated once when
// missing (duo on the copy task over --heads-text, which must not be the
// text tune scores KLD on).
Result<eval::TuneHeadTables> HeadTables(const TuneFlags& flags, const model::Model& model, ThreadPool* threads) {
  eval::TuneHeadTables tables;
  const std::string dir = eval::TuneCacheDir();
  for (const char* method : {"duo", "razor"}) {
    eval::HeadCalibrationOptions co;
    co.method = method;
    std::string path = co.method == "duo" ? flags.duo_heads : flags.razor_heads;
    if (path.empty()) {
      if (dir.empty()) {
        return InvalidArgument("no tune cache directory for the head tables (set $KVX_TUNE_CACHE or $HOME), "
                               "or name them with --duo-heads/--razor-heads, or give --no-head-typing");
      }
      path = dir + "/" + eval::TuneHeadTableName(model::ModelFingerprint(model.file()), co);
    }
    std::error_code ec;
    if (co.method == "duo" && !std::filesystem::exists(path, ec)) {
      const std::string text = flags.heads_text.empty() ? flags.data_dir + "/prose/jargon-4.4.7.txt" : flags.heads_text;
      if (!flags.text_file.empty() && std::filesystem::equivalent(text, flags.text_file, ec)) {
        return InvalidArgument("--heads-text " + text + " is the text tune scores KLD on (-f): calibrating the " +
                               "head table on it would leak; give another --heads-text");
      }
      KVX_ASSIGN_OR_RETURN(co.text, ReadNonEmptyTextFile(text));
    }
    bool calibrated = false;
    const double t0 = util::MonotonicSeconds();
    KVX_ASSIGN_OR_RETURN(std::string table, eval::EnsureHeadTable(model, threads, path, co, &calibrated));
    if (!flags.quiet) {
      std::fprintf(stderr, "kvx: head table (%s): %s %s\n", method, table.c_str(),
                   calibrated ? ("calibrated in " + std::to_string(static_cast<int>(util::MonotonicSeconds() - t0)) +
                                 " s").c_str()
                              : "(cached)");
    }
    (co.method == "duo" ? tables.duo : tables.razor) = table;
  }
  return tables;
}

Status RunTuneCommand(TuneFlags flags) {
  eval::TuneOptions& o = flags.options;
  KVX_ASSIGN_OR_RETURN(o.mem_bytes, ParseByteSize(flags.mem));
  if (!flags.quality.empty()) {
    KVX_ASSIGN_OR_RETURN(o.max_kld, ParseQuality(flags.quality));
  }
  for (const std::string* f : {&flags.out_file, &flags.svg_file}) {
    if (!f->empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(*f));
  }
  o.retrieval.data_dir = flags.data_dir;
  if (!flags.tasks.empty()) {
    KVX_ASSIGN_OR_RETURN(o.retrieval.tasks, eval::ParseTasks(flags.tasks));
  }
  std::string text, text_name;
  if (!flags.text_file.empty()) {
    KVX_ASSIGN_OR_RETURN(text, ReadNonEmptyTextFile(flags.text_file));
    text_name = flags.text_file;
  } else {
    text_name = flags.data_dir + "/paul_graham_essays";
    KVX_ASSIGN_OR_RETURN(text, eval::LoadEssays(text_name));
  }
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(flags.model_path));
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, model->tokenizer().Encode(text, true, false));
  // Only the tokens the search and the validation read are kept.
  tokens.resize(std::min<size_t>(tokens.size(), static_cast<size_t>(eval::TuneTextTokens(o))));
  ThreadPool threads(flags.n_threads);
  if (!flags.no_head_typing) {
    KVX_ASSIGN_OR_RETURN(o.heads, HeadTables(flags, *model, &threads));
  }

  const std::string about = nlohmann::json{{"model", flags.model_path},
                                           {"model_name", model->config().name},
                                           {"text", text_name},
                                           {"text_tokens", tokens.size()},
                                           {"created_utc", UtcNow()}}
                                .dump();
  eval::ProgressBar::Options po;
  po.enabled = !flags.quiet && isatty(fileno(stderr));
  eval::ProgressBar progress(po);
  Status write_status = Status::Ok();
  auto write = [&](const eval::TuneResult& r) {
    if (r.chosen < 0) return;
    Status s = Status::Ok();
    if (!flags.out_file.empty()) s = WriteFileAtomically(flags.out_file, eval::TuneResultJson(r, o, about));
    if (s.ok() && !flags.svg_file.empty()) s = WriteFileAtomically(flags.svg_file, eval::TuneParetoSvg(r));
    if (!s.ok() && write_status.ok()) {
      write_status = s;
      progress.Message("kvx: warning: " + s.message());
    }
  };
  const auto start = std::chrono::steady_clock::now();
  eval::TuneHooks hooks;
  hooks.progress = &progress;
  hooks.on_update = write;
  hooks.stop = [&]() -> std::string {
    if (g_interrupted.load()) return "interrupted (SIGINT)";
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (flags.time_budget > 0 && elapsed > flags.time_budget) return "--time-budget reached";
    return "";
  };
  g_interrupted.store(false);
  const auto previous = std::signal(SIGINT, OnInterrupt);
  Result<eval::TuneResult> result = eval::RunTune(*model, &threads, tokens, o, hooks);
  std::signal(SIGINT, previous);
  progress.Finish();
  KVX_RETURN_IF_ERROR(result.status());
  if (result->chosen < 0) {
    return InvalidArgument("tune " + result->stop_reason + " before any spec was measured; nothing written");
  }
  std::fputs(eval::TuneSummary(*result, o).c_str(), stdout);
  std::fflush(stdout);
  if (!write_status.ok()) return write_status;
  // The cache --kv auto reads (eval/tune_cache.h); a cache that cannot be
  // written costs only --kv auto, so it is a warning.
  const Result<std::string> cached = eval::StoreTuneResult(
      eval::TuneCacheDir(),
      eval::TuneCacheName(model::ModelFingerprint(model->file()), o.mem_bytes, o.ctx, o.sessions),
      eval::TuneResultJson(*result, o, about));
  if (!cached.ok()) {
    std::fprintf(stderr, "kvx: warning: not cached for --kv auto: %s\n", cached.status().message().c_str());
  } else if (!flags.quiet) {
    std::fprintf(stderr, "cached %s (kvx serve -m %s --kv auto:%llu uses it)\n", cached->c_str(),
                 flags.model_path.c_str(), static_cast<unsigned long long>(o.mem_bytes));
  }
  if (!flags.quiet) {
    if (!flags.out_file.empty()) std::fprintf(stderr, "wrote %s (use it as --kv @%s)\n", flags.out_file.c_str(), flags.out_file.c_str());
    if (!flags.svg_file.empty()) std::fprintf(stderr, "wrote %s\n", flags.svg_file.c_str());
  }
  return Status::Ok();
}

}  // namespace

void RegisterTune(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TuneFlags>();
  eval::TuneOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "tune", "The best KV spec for a model, a text and a memory budget (writes a file for --kv @FILE)");
  cmd->footer(
      "Example:\n  kvx tune -m ../shared/models/recall/recall-llama-8L-d512-f16.gguf --mem 8M --ctx 4096 \\\n"
      "    -f ../shared/golden/recall_val.txt -o /tmp/tuned.json --svg /tmp/tuned.svg\n"
      "  kvx run -m ../shared/models/recall/recall-llama-8L-d512-f16.gguf --kv @/tmp/tuned.json -p \"...\"\n"
      "Ctrl-C stops after the pass in progress and keeps the best spec so far. The search: docs/tune.md.");
  cmd->add_option("-m,--model", flags->model_path, "GGUF model file")->required();
  cmd->add_option("--mem", flags->mem, "KV memory for all sessions (bytes, K/M/G suffixes; not the weights)")
      ->required();
  cmd->add_option("--ctx", o.ctx, "Tokens per session")->required()->check(IntIn(16, kMaxContext));
  cmd->add_option("--sessions", o.sessions, "Sessions held at once")->capture_default_str()
      ->check(IntIn(1, 1 << 20));
  cmd->add_option("-f,--file", flags->text_file, "Text to measure KLD on (default: the essays in --data)");
  cmd->add_option("--data", flags->data_dir, "Folder with paul_graham_essays/ (the default text; needle and niah_*)")
      ->capture_default_str();
  cmd->add_option("--quality", flags->quality,
                  "A quality floor, kld<=X: the smallest spec whose KLD meets it (default: the best KLD that fits)");
  cmd->add_option("--tasks", flags->tasks,
                  "Retrieval tasks the finalists also answer beside f16, e.g. passkey or passkey,niah_number: a "
                  "finalist worse than f16 (Wilson 95% interval, McNemar) ranks below the others");
  cmd->add_option("--retrieval-length", o.retrieval.length,
                  "Tokens of each retrieval prompt (0: --ctx, at most the model's trained context)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext));
  cmd->add_option("--retrieval-trials", o.retrieval.trials,
                  "Retrieval prompts per depth (5 depths, 0 to 1) and task")
      ->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_flag("--retrieval-compare", o.compare_retrieval,
               "With --tasks: every finalist and the best spec of each single family (codec only, policy only, "
               "defaults) answer every prompt (default: the finalists one at a time, best first, until one is not "
               "worse than f16; each stopped once it is worse whatever its other prompts give)");
  cmd->add_option("-o,--output", flags->out_file, "Write the result here (JSON; --kv @FILE reads it)");
  cmd->add_option("--svg", flags->svg_file, "Write the Pareto chart (bytes vs KLD) here");
  cmd->add_option("--duo-heads", flags->duo_heads,
                  "DuoAttention head table for the space's policy=duo specs (default: calibrated once into the tune "
                  "cache; a missing file is calibrated and written)");
  cmd->add_option("--razor-heads", flags->razor_heads,
                  "RazorAttention head table for the space's policy=razor specs (default: as --duo-heads)");
  cmd->add_option("--heads-text", flags->heads_text,
                  "Natural text duo's copy calibration reads (default: DATA/prose/jargon-4.4.7.txt; not the -f text)");
  cmd->add_flag("--no-head-typing", flags->no_head_typing, "Leave head typing (duo, razor) out of the space");
  cmd->add_option("--time-budget", flags->time_budget,
                  "Seconds; past them no new pass starts and the best spec so far is kept (0: none)")
      ->capture_default_str()
      ->check(NumberIn(0, 1e9, false, false));
  cmd->add_option("--first-chunk", o.first_chunk,
                  "Tokens of the first rung's chunk, doubled until every candidate's policies evict in it")
      ->capture_default_str()
      ->check(IntIn(16, kMaxContext));
  cmd->add_option("--max-chunk", o.max_chunk, "Tokens of the last rung's chunk (0: --ctx)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext));
  cmd->add_option("--finalists", o.finalists, "Specs validated on unseen text")->capture_default_str()
      ->check(IntIn(1, 64));
  cmd->add_option("-t,--threads", flags->n_threads, "Threads (0: all cores)")->capture_default_str()
      ->check(Threads());
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress bar");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunTuneCommand(*flags)); });
}

}  // namespace kvx::tools
