// kvx eval: quality of KV-cache specs against a baseline (see eval/eval.h).
// Thin: parses flags, loads the model once, calls eval::RunEval and writes
// the reports after every finished task. `--render JSON` instead re-renders a
// report folder from a report.json (no model, nothing run).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/chunk_assembly.h"
#include "eval/eval.h"
#include "eval/rag.h"
#include "eval/scbench.h"
#include "eval/report.h"
#include "model/model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/mmap_file.h"
#include "util/output_file.h"
#include "util/thread_pool.h"

namespace kvx::tools {

namespace {

struct EvalFlags {
  eval::EvalOptions options;
  std::string tasks = "ppl,kld,copy";
  std::string text_file;
  std::string json_file;
  std::string report_dir;
  std::string render_json;
  int n_threads = 0;
  bool quiet = false;
  eval::RagOptions rag;
  std::string rag_needle = "whole";
  std::string protocol;               // --protocol: SCBench's instead of --tasks
  eval::SharedContextOptions scbench;
};

// --protocol multi-query|multi-turn: SCBench's shared-context protocols
// (eval/scbench.h) for the baseline and every --kv spec.
Status RunProtocolCommand(EvalFlags& flags) {
  const eval::EvalOptions& o = flags.options;
  eval::SharedContextOptions& p = flags.scbench;
  p.protocol = flags.protocol;
  p.specs = {o.baseline};
  p.specs.insert(p.specs.end(), o.specs.begin(), o.specs.end());
  if (!o.lengths.empty()) p.lengths = o.lengths;
  p.n_gen = o.ruler_gen;
  p.data_dir = o.data_dir;
  p.n_batch = o.n_batch;
  p.seed = o.seed;
  if (!flags.json_file.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.json_file));
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(o.model_path));
  ThreadPool threads(flags.n_threads);
  eval::ProgressBar::Options po;
  po.enabled = !flags.quiet && isatty(fileno(stderr));
  eval::ProgressBar progress(po);
  p.progress = &progress;
  Result<eval::SharedContextResult> run = eval::RunSharedContextEval(*model, &threads, p);
  progress.Finish();
  KVX_ASSIGN_OR_RETURN(eval::SharedContextResult result, std::move(run));
  if (!flags.json_file.empty()) KVX_RETURN_IF_ERROR(WriteFileAtomically(flags.json_file, eval::SharedContextJson(result)));
  std::fputs(eval::SharedContextTable(result).c_str(), stdout);
  std::fflush(stdout);
  return Status::Ok();
}

// --tasks rag: chunk reuse's repairs on RAG prompts (eval/rag.h), one spec.
Status RunRagCommand(EvalFlags& flags) {
  const eval::EvalOptions& o = flags.options;
  if (o.specs.size() > 1) return InvalidArgument("--tasks rag measures one --kv spec at a time");
  if (!o.specs.empty()) flags.rag.kv_spec = o.specs[0];
  for (const std::string& repair : flags.rag.repairs) KVX_RETURN_IF_ERROR(engine::ParseChunkRepair(repair).status());
  flags.rag.data_dir = o.data_dir;
  flags.rag.split_needle = flags.rag_needle == "split";
  flags.rag.seed = o.seed;
  flags.rag.n_batch = o.n_batch;
  if (!flags.json_file.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.json_file));
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(o.model_path));
  ThreadPool threads(flags.n_threads);
  KVX_ASSIGN_OR_RETURN(std::vector<eval::RagRow> rows, eval::RunRagEval(*model, &threads, flags.rag));
  if (!flags.json_file.empty()) KVX_RETURN_IF_ERROR(WriteFileAtomically(flags.json_file, eval::RagJson(rows)));
  std::fputs(eval::RagTable(rows).c_str(), stdout);
  std::fflush(stdout);
  return Status::Ok();
}

// Re-renders report.md and the SVGs (and report.json, rewritten from what was
// read, so a folder stays consistent) from a committed report.json.
Status RenderCommand(const EvalFlags& flags) {
  if (flags.report_dir.empty()) return InvalidArgument("--render needs --report DIR (where to write)");
  KVX_ASSIGN_OR_RETURN(std::string text, ReadFileToString(flags.render_json));
  Result<eval::EvalReport> report = eval::ReportFromJsonText(text);
  if (!report.ok()) return report.status().WithContext(flags.render_json);
  KVX_RETURN_IF_ERROR(eval::WriteReportDir(*report, flags.report_dir));
  if (!flags.quiet) std::fprintf(stderr, "rendered %s into %s\n", flags.render_json.c_str(), flags.report_dir.c_str());
  return Status::Ok();
}

// The result of one (spec, task) cell; null when the task did not run.
const eval::TaskOutcome* OutcomeOf(const eval::SpecResult& s, eval::Task t) {
  switch (t) {
    case eval::Task::kPpl: return s.ppl ? &*s.ppl : nullptr;
    case eval::Task::kKld: return s.kld ? &*s.kld : nullptr;
    case eval::Task::kCopy: return s.copy ? &*s.copy : nullptr;
    default: {
      const auto* r = s.Retrieval(t);
      return r != nullptr && *r ? &**r : nullptr;
    }
  }
}

// A run whose every cell failed measured nothing: an error (exit 1) naming
// the first failure, not a table of errors and exit 0.
Status CheckSomeCellRan(const eval::EvalReport& report) {
  int cells = 0, failed = 0;
  std::string first;
  for (const eval::SpecResult& s : report.specs) {
    for (eval::Task t : report.settings.tasks) {
      const eval::TaskOutcome* o = OutcomeOf(s, t);
      if (s.error.empty() && o == nullptr) continue;
      ++cells;
      const bool ok = s.error.empty() && o->ok;
      if (ok) continue;
      ++failed;
      if (first.empty()) first = s.spec + ", " + std::string(eval::TaskName(t)) + ": " + (s.error.empty() ? o->error : s.error);
    }
  }
  if (cells == 0 || failed < cells) return Status::Ok();
  return InvalidArgument("every cell of the evaluation failed (" + std::to_string(cells) +
                         " cells; the table above has each error); the first: " + first);
}

Status RunEvalCommand(EvalFlags flags) {
  if (!flags.render_json.empty()) return RenderCommand(flags);
  eval::EvalOptions& o = flags.options;
  if (o.model_path.empty()) return InvalidArgument("-m MODEL is required (or --render JSON)");
  if (flags.n_threads < 0) return InvalidArgument("thread count (-t) must be >= 0 (0 = all cores)");
  for (std::string& spec : o.specs) {
    KVX_ASSIGN_OR_RETURN(spec, ResolveAutoKV(spec, o.model_path));
  }
  if (!flags.protocol.empty()) return RunProtocolCommand(flags);
  if (flags.tasks == "rag") return RunRagCommand(flags);
  if (flags.tasks.find("rag") != std::string::npos) {
    return InvalidArgument("--tasks rag runs alone (it compares chunk repairs on one spec, not specs): drop the other "
                           "tasks or run them separately");
  }
  if (!flags.json_file.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.json_file));
  KVX_ASSIGN_OR_RETURN(o.tasks, eval::ParseTasks(flags.tasks));
  if (!flags.text_file.empty()) {
    KVX_ASSIGN_OR_RETURN(o.text, ReadNonEmptyTextFile(flags.text_file));
    // As llama.cpp's -f (and kvx perplexity): one trailing newline is dropped.
    if (!o.text.empty() && o.text.back() == '\n') o.text.pop_back();
    o.text_name = flags.text_file;
  }
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(o.model_path));
  ThreadPool threads(flags.n_threads);

  eval::ProgressBar::Options po;
  po.enabled = !flags.quiet && isatty(fileno(stderr));
  eval::ProgressBar progress(po);
  Status write_status = Status::Ok();
  auto write = [&](const eval::EvalReport& report) {
    Status s = Status::Ok();
    if (!flags.json_file.empty()) {
      s = WriteFileAtomically(flags.json_file, eval::ReportToJsonText(report));
    }
    if (s.ok() && !flags.report_dir.empty()) s = eval::WriteReportDir(report, flags.report_dir);
    if (!s.ok() && write_status.ok()) {
      write_status = s;
      progress.Message("kvx: warning: " + s.message());
    }
  };
  eval::EvalHooks hooks;
  hooks.on_update = write;
  hooks.progress = &progress;
  KVX_ASSIGN_OR_RETURN(eval::EvalReport report, eval::RunEval(*model, &threads, o, hooks));
  progress.Finish();
  std::fputs(eval::SummaryTable(report).c_str(), stdout);
  std::fflush(stdout);
  if (!write_status.ok()) return write_status;
  if (!flags.json_file.empty() && !flags.quiet) std::fprintf(stderr, "wrote %s\n", flags.json_file.c_str());
  if (!flags.report_dir.empty() && !flags.quiet) {
    std::fprintf(stderr, "wrote %s/report.md (+ report.json, SVG plots)\n", flags.report_dir.c_str());
  }
  return CheckSomeCellRan(report);
}

}  // namespace

void RegisterEval(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<EvalFlags>();
  eval::EvalOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "Quality of KV-cache specs against a baseline: ppl, kld, copy, passkey, lines, needle and RULER's niah_*, vt");
  cmd->footer(
      "Example:\n  kvx eval -m ../shared/models/tinystories656K/TinyStories-656K-F32.gguf --kv codec=f16 \\\n"
      "    --tasks ppl,kld,copy -f ../shared/golden/stories_eval.txt --report /tmp/eval\n"
      "Every result carries the KV bytes the spec's pool held (measured) and the compression vs a dense f16 "
      "cache.\nProtocols and the JSON schema: docs/eval.md.");
  cmd->add_option("-m,--model", o.model_path, "GGUF model file (required unless --render)");
  AddKVFlag(cmd, &o.specs, "a spec to judge");
  cmd->add_option("--baseline", o.baseline, "The reference KV spec")->capture_default_str();
  cmd->add_option("--tasks", flags->tasks,
                  "Comma-separated: ppl, kld, copy, passkey, lines, needle, niah_word, niah_number, niah_uuid, "
                  "niah_multikey, niah_multivalue, vt; groups: niah (the three single-needle ones), ruler (niah_* "
                  "and vt), all; or rag alone (chunk reuse: docs/kv-reuse.md)")
      ->capture_default_str();
  cmd->add_option("-f,--file", flags->text_file, "Text for ppl and kld (and copy spans of real text)");
  cmd->add_option("--data", o.data_dir, "Folder with longeval/ and paul_graham_essays/ (lines, needle, niah*)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.n_ctx, "Longest sequence of any task (0: the model's trained context)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext, "0: the model's trained context"));
  cmd->add_option("--chunk", o.chunk, "ppl/kld chunk length (0: the context)")->capture_default_str()
      ->check(IntIn(0, kMaxContext, "0: the context"));
  cmd->add_option("--chunks", o.max_chunks, "ppl/kld: at most this many chunks (-1: all)")->capture_default_str()
      ->check(AllOrAtLeastOne());
  cmd->add_option("--copy-span", o.copy_span, "copy: span length in tokens")->capture_default_str()
      ->check(IntIn(2, kMaxContext));
  cmd->add_option("--copy-skip", o.copy_skip, "copy: leading repeat tokens not scored")->capture_default_str()
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--copy-distances", o.copy_distances,
                  "copy: filler lengths between span and repeat, comma-separated (default: 0, c/32, c/8, c/2, max)")
      ->delimiter(',')
      ->check(IntIn(0, kMaxContext));
  cmd->add_option("--copy-trials", o.copy_trials, "copy: sequences per distance and source")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--lengths", o.lengths,
                  "passkey/needle/niah*/vt: sequence lengths in tokens (prompt + answer), comma-separated "
                  "(default: c/4, c/2, 3c/4, c)")
      ->delimiter(',')
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--depths", o.depths,
                  "passkey/needle/niah*/vt: depths in [0,1], comma-separated (default: 0,.25,.5,.75,1)")
      ->delimiter(',')
      ->check(NumberIn(0, 1, false, false, "a fraction of the sequence"));
  cmd->add_option("--kld-context", o.kld_context,
                  "ppl/kld with a KV policy (and --compress excluded|included): the context of each chunk "
                  "(prefill, then compress), a share below 1 or a token count (e.g. 4096); the rest is scored "
                  "token by token")
      ->capture_default_str();
  cmd->add_option("--kld-score", o.kld_score,
                  "ppl/kld with --kld-context in tokens: score this many tokens after the context, every spec "
                  "(a codec alone too) (the chunk becomes context + score + 1 tokens; 0: the rest of --chunk)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext));
  cmd->add_option("--storage-codec", o.storage_codec,
                  "ppl/kld and retrieval through the KV tiers' storage codec: every spec but the baseline sends "
                  "its context's (a retrieval prompt's: all but its last token) 256-token blocks through the tier "
                  "block format at this level (lossless, high, medium, low, compact) and back, as a tier hit "
                  "serves them, before the rest is scored or answered; its KV bytes are the stored blocks'")
      ->check(CLI::IsMember({"lossless", "high", "medium", "low", "compact"}));
  cmd->add_option("--storage-calib", o.storage_calib,
                  "--storage-codec compact: the text whose KV calibrates the storage transform (PCA per layer, kv "
                  "head, K and V; disjoint from the eval text)")
      ->capture_default_str();
  cmd->add_option("--storage-calib-tokens", o.storage_calib_tokens,
                  "--storage-codec compact: tokens of --storage-calib used (in chunks of --chunk)")
      ->capture_default_str()
      ->check(IntIn(128, kMaxContext));
  AddCompactRatesOption(cmd, "--storage-rates", &o.storage_rates);
  cmd->add_option("--compress", o.compress,
                  "When KV policies compress once (Session::Compress): excluded = after the context, before the "
                  "question (the cache could serve any question); included = after the whole prompt (query-aware); "
                  "none = never (continuous policies only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"excluded", "included", "none"}));
  cmd->add_option("--passkey-trials", o.passkey_trials, "passkey: prompts per cell")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--ruler-trials", o.ruler_trials, "niah*, vt: prompts per cell")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--ruler-gen", o.ruler_gen,
                  "niah*, vt: answer tokens reserved and generated at most (0: 32; niah_uuid, niah_multivalue 64; "
                  "vt 48)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxCount));
  cmd->add_option("--lines", o.line_counts,
                  "lines: record sizes in lines, comma-separated (default: 2..160, those "
                  "that fit)")
      ->delimiter(',')
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--lines-trials", o.lines_trials, "lines: cases per record size")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--chunk-repair", flags->rag.repairs,
                  "rag: the repairs compared (none, full, epic[,k=N], blend[,r=X][,layer=L][,k=N][,dev=kv|k|v]); repeat "
                  "the flag; "
                  "default: none, epic k=1,4,16, blend r=0.05,0.15,0.3, blend r=0.05 with k=16, full");
  cmd->add_option("--rag-sizes", flags->rag.sizes, "rag: tokens of documents per prompt, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--rag-chunk-tokens", flags->rag.chunk_tokens, "rag: tokens per document (whole sentences)")
      ->capture_default_str()
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--rag-needle", flags->rag_needle,
                  "rag: whole (the needle in one document) or split (cut between two adjacent chunks inside the "
                  "needle: the answer needs cross-chunk attention)")
      ->capture_default_str()
      ->check(CLI::IsMember({"whole", "split"}));
  cmd->add_option("--rag-questions", flags->rag.questions, "rag: questions per size")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--protocol", flags->protocol,
                  "SCBench's shared-context protocols instead of --tasks (docs/scbench.md): multi-query (one context "
                  "compressed once with the question excluded, then --questions questions, each a fork of it) or "
                  "multi-turn (each answer joins the context before the next question); the baseline and every "
                  "--kv spec, at --lengths (default 2048)")
      ->check(CLI::IsMember({"multi-query", "multi-turn"}));
  cmd->add_option("--contexts", flags->scbench.contexts, "--protocol: contexts per length")->capture_default_str()
      ->check(IntIn(1, kMaxCount));
  cmd->add_option("--questions", flags->scbench.questions,
                  "--protocol: questions (needles) per context, each about another key")
      ->capture_default_str()
      ->check(IntIn(2, 64));
  cmd->add_option("--seed", o.seed, "Seed of every random choice")->capture_default_str();
  cmd->add_option("-t,--threads", flags->n_threads, "Threads (0: all cores)")->capture_default_str()
      ->check(Threads());
  cmd->add_option("-b,--batch-size", o.n_batch, "Prompt tokens per forward pass")->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("--prefill-cache", o.prefill_cache_mib,
                  "Retrieval tasks: MiB of prompt prefills kept for the other specs of the same codec, whose "
                  "policies then run only the prompt's last calls (same results; 0: every spec prefills every "
                  "prompt)")
      ->capture_default_str()
      ->check(IntIn(0, 1 << 20));
  cmd->add_option("--json", flags->json_file, "Write the JSON report here (rewritten as results arrive)");
  cmd->add_option("--report", flags->report_dir, "Write report.json, report.md and SVG plots into this folder");
  cmd->add_option("--render", flags->render_json,
                  "Run nothing: re-render --report DIR from this report.json (docs are regenerated this way)");
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress bar");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunEvalCommand(*flags)); });
}

}  // namespace kvx::tools
