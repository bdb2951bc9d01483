// kvx: the command line. Thin: parses flags and calls the library.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"kvx: a CPU LLM inference runtime whose KV cache is the product"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
