// kvx perplexity: llama.cpp's perplexity protocol (see eval/perplexity.h).
#include <cstdio>
#include <memory>
#include <string>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/mmap_file.h"

namespace kvx::tools {

namespace {

struct PerplexityFlags {
  EngineFlags runtime;
  std::string file;
  int max_chunks = -1;
  bool force = false;
};

Status RunPerplexity(PerplexityFlags flags) {
  KVX_RETURN_IF_ERROR(CheckTrainedContext(flags.runtime.options.model_path, flags.runtime.options.n_ctx, flags.force,
                                          "the chunk (-c)"));
  KVX_ASSIGN_OR_RETURN(std::string text, ReadNonEmptyTextFile(flags.file));
  // As llama.cpp's -f: one trailing newline is dropped.
  if (!text.empty() && text.back() == '\n') text.pop_back();
  eval::PerplexityOptions po;
  po.n_ctx = flags.runtime.options.n_ctx;
  po.max_chunks = flags.max_chunks;
  flags.runtime.options.n_batch = po.n_ctx;
  KVX_ASSIGN_OR_RETURN(auto rt, LoadEngine(flags.runtime));
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                       rt->model().tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false));
  std::fprintf(stderr, "perplexity: %zu tokens, %d-token chunks, KV spec '%s'\n", tokens.size(), po.n_ctx,
               rt->kv_spec().ToString().c_str());
  KVX_ASSIGN_OR_RETURN(auto session, rt->NewSession());
  KVX_ASSIGN_OR_RETURN(eval::PerplexityResult r,
                       eval::Perplexity(session.get(), tokens, po, [](int c, int, double ppl) {
                         std::printf("[%d]%.4f,", c + 1, ppl);
                         std::fflush(stdout);
                       }));
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f (%d chunks, %d scored tokens)\n", r.ppl, r.ppl_stderr,
              r.n_chunks, r.n_scored);
  return Status::Ok();
}

}  // namespace

void RegisterPerplexity(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<PerplexityFlags>();
  flags->runtime.options.n_ctx = 512;
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp's protocol)");
  AddEngineFlags(cmd, &flags->runtime,
                 ContextFlag{.help = "Chunk length in tokens", .min = 4, .max = 1 << 20, .hint = ""});
  cmd->add_option("-f,--file", flags->file, "Text file")->required();
  cmd->add_option("--chunks", flags->max_chunks, "Score at most this many chunks (-1: all)")->capture_default_str()
      ->check(AllOrAtLeastOne());
  AddForceFlag(cmd, &flags->force);
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunPerplexity(*flags)); });
}

}  // namespace kvx::tools
