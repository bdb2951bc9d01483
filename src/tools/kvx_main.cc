// kvx: the command line. Thin: parses flags and calls the library.
#include <cstdio>

#include "tools/commands.h"

namespace kvx::tools {

int ReportStatus(const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "kvx: error: %s\n", status.message().c_str());
  return 1;
}

}  // namespace kvx::tools

int main(int argc, char** argv) {
  CLI::App app{"kvx: a CPU LLM inference runtime whose KV cache is the product"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  int exit_code = 0;
  kvx::tools::RegisterRun(app, &exit_code);
  kvx::tools::RegisterInspect(app, &exit_code);
  kvx::tools::RegisterPerplexity(app, &exit_code);
  kvx::tools::RegisterGenModel(app, &exit_code);
  kvx::tools::RegisterBench(app, &exit_code);
  kvx::tools::RegisterPlan(app, &exit_code);
  kvx::tools::RegisterEval(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
