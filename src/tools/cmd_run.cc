// kvx run: generate text from a prompt, streaming it to stdout, and print one
// stats line on stderr.
#include <cstdio>
#include <memory>
#include <string>

#include "engine/generate.h"
#include "engine/session.h"
#include "engine/session_file.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/mmap_file.h"
#include "util/output_file.h"

namespace kvx::tools {

namespace {

struct RunFlags {
  EngineFlags runtime;
  std::string prompt;
  std::string prompt_file;
  engine::GenerateOptions gen;
  bool parse_special = false;
  std::string save_session;
  std::string load_session;
};

Status Run(const RunFlags& flags) {
  if (!flags.save_session.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.save_session));
  std::string prompt = flags.prompt;
  if (!flags.prompt_file.empty()) {
    KVX_ASSIGN_OR_RETURN(prompt, ReadNonEmptyTextFile(flags.prompt_file));
  }
  KVX_ASSIGN_OR_RETURN(auto rt, LoadEngine(flags.runtime));
  const model::Tokenizer& tok = rt->model().tokenizer();
  std::unique_ptr<engine::Session> session;
  std::vector<float> resume_logits;
  std::vector<int32_t> ids;
  if (!flags.load_session.empty()) {
    // Continue a saved session: the prompt (if any) is appended as text that
    // follows it, without a new BOS.
    KVX_ASSIGN_OR_RETURN(engine::RestoredSession restored, engine::LoadSessionFile(*rt, flags.load_session));
    session = rt->AdoptSequence(restored.seq);
    resume_logits = std::move(restored.logits);
    KVX_ASSIGN_OR_RETURN(ids, tok.Encode(prompt, /*add_special=*/false, flags.parse_special));
    if (ids.empty() && resume_logits.empty()) {
      return InvalidArgument(flags.load_session + " holds no logits to continue from; give a prompt with -p");
    }
  } else {
    KVX_ASSIGN_OR_RETURN(ids, tok.Encode(prompt, /*add_special=*/true, flags.parse_special));
    if (ids.empty()) return InvalidArgument("the prompt is empty and the model adds no BOS token; give a prompt with -p");
    KVX_ASSIGN_OR_RETURN(session, rt->NewSession());
  }
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  std::vector<int32_t> out;
  engine::GenerateStats stats;
  // KV policies that compress once (snapkv, ...) do it after the prompt
  // (the question included); without such policies this does nothing.
  engine::GenerateOptions gen = flags.gen;
  gen.resume_logits = resume_logits;
  gen.compress_at = static_cast<int>(ids.size());
  KVX_RETURN_IF_ERROR(engine::Generate(
      session.get(), ids, gen,
      [](int32_t, const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      },
      &out, &stats));
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", stats.ToString().c_str());
  if (!flags.save_session.empty()) {
    // The session holds everything printed but the last generated token
    // (sampled, not yet fed): feed it, so the file holds the whole text and
    // the logits its continuation starts from. An end-of-text token that
    // stopped generation was not printed and is not kept.
    std::vector<float> logits;
    const bool printed_last = !out.empty() && !(stats.hit_eog && gen.stop_at_eog);
    if (printed_last && session->n_past() < session->n_ctx()) {
      KVX_ASSIGN_OR_RETURN(const float* l, session->Feed({out.back()}));
      logits.assign(l, l + rt->model().config().n_vocab);
    } else if (printed_last) {
      std::fprintf(stderr, "warning: the context is full; the saved session ends before the last token\n");
    }
    KVX_RETURN_IF_ERROR(engine::SaveSessionFile(*rt, session->id(), flags.save_session, {.logits = logits, .pending = {}}));
    std::fprintf(stderr, "saved the session (%d tokens) to %s\n", session->n_past(), flags.save_session.c_str());
  }
  return Status::Ok();
}

}  // namespace

void RegisterRun(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout, stats on stderr)");
  AddEngineFlags(cmd, &flags->runtime, ContextFlag{.help = "Context length (0: the model's trained context)"});
  auto* p = cmd->add_option("-p,--prompt", flags->prompt, "Prompt text");
  cmd->add_option("-f,--file", flags->prompt_file, "Read the prompt from a file")->excludes(p);
  cmd->add_option("-n,--n-predict", flags->gen.n_predict, "Tokens to generate (-1: until EOS or context end)")
      ->capture_default_str()
      ->check(IntIn(-1, kMaxCount, "-1: until end of text or the context is full"));
  cmd->add_option("-b,--batch-size", flags->runtime.options.n_batch, "Prompt tokens per forward pass")->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  // The sampler's ranges (model/sampler.h SamplerOptions::Validate), checked
  // here too so a bad value fails before the model loads.
  cmd->add_option("--temp", flags->gen.sampler.temperature, "Temperature (<= 0: greedy)")->capture_default_str()
      ->check(Finite("<= 0: greedy"));
  cmd->add_option("--top-k", flags->gen.sampler.top_k, "Top-k (0: off)")->capture_default_str()
      ->check(IntIn(0, kMaxCount, "0: off"));
  cmd->add_option("--top-p", flags->gen.sampler.top_p, "Top-p (1: off)")->capture_default_str()
      ->check(Probability("1: off"));
  cmd->add_option("--min-p", flags->gen.sampler.min_p, "Min-p (0: off)")->capture_default_str()
      ->check(NumberIn(0, 1, false, false, "0: off"));
  cmd->add_option("--repeat-penalty", flags->gen.sampler.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str()
      ->check(NumberIn(0, 1e6, true, false, "1: off"));
  cmd->add_option("--repeat-last-n", flags->gen.sampler.repeat_last_n, "Tokens the penalty looks back over")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext));
  cmd->add_option("--seed", flags->gen.sampler.seed, "Random seed (same seed, same text)")->capture_default_str();
  cmd->add_option("--save-session", flags->save_session,
                  "After generating, save the session (KV pages, tokens, next-token logits) to this file");
  cmd->add_option("--load-session", flags->load_session,
                  "Continue a session saved with --save-session (same model and --kv); -p text is appended");
  cmd->add_flag("--special", flags->parse_special, "Parse special-token text (e.g. <s>) in the prompt");
  cmd->add_flag("--ignore-eos", [flags](int64_t) { flags->gen.stop_at_eog = false; }, "Do not stop at end-of-text");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(Run(*flags)); });
}

}  // namespace kvx::tools
