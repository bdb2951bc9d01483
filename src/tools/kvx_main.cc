// kvx: the command line. Thin: parses flags and calls the library.
//
// Errors: every failure ends with one line "kvx: error: <what to fix>" on
// stderr and exit code 1 — a library Status (ReportStatus), a flag CLI11
// rejects, an unknown command, and, as the last line of defence, an
// exception that escapes a command or a thread. The causes are fixed where
// they arise (input is validated before it sizes anything); the guard only
// makes sure a cause that was missed still ends in a message, not an abort.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "tools/commands.h"
#include "util/printable.h"

namespace kvx::tools {

namespace {

// Longest message printed in full: error messages quote file strings through
// Printable() already; this only caps what an exception might carry.
constexpr size_t kMaxMessageBytes = 4096;

void PrintError(std::string_view message) {
  // What the command printed so far comes first (stdout is buffered when
  // piped; without this the error lands in the middle of inspect's table).
  std::fflush(stdout);
  // Printable(): no raw control character from a hostile file reaches the
  // terminal, and a NUL byte inside the message does not cut it short.
  const std::string line = "kvx: error: " + Printable(message, kMaxMessageBytes) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// What an escaped exception becomes: one line, naming the exception.
std::string DescribeException(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of memory: an input asked kvx for more memory than it could get (std::bad_alloc); "
           "please report the command that caused this";
  } catch (const std::exception& x) {
    return std::string("unexpected internal error: ") + x.what() + "; please report the command that caused this";
  } catch (...) {
  }
  return "unexpected internal error (unknown exception); please report the command that caused this";
}

// std::terminate handler: an exception that escapes a pool thread (where no
// try in main can see it) or a noexcept function. Prints one line and exits
// with 1 instead of abort()'s SIGABRT and core dump.
[[noreturn]] void OnTerminate() {
  const std::exception_ptr e = std::current_exception();
  PrintError(e ? DescribeException(e) : "internal error: std::terminate called without an exception");
  std::_Exit(1);
}

constexpr const char* kCommands[] = {"run", "inspect", "perplexity", "gen-model", "bench", "plan", "eval", "serve", "batch", "calibrate-heads", "calibrate-storage", "tune"};

std::string CommandList() {
  std::string out;
  for (const char* c : kCommands) out += std::string(out.empty() ? "" : ", ") + c;
  return out;
}

// The first argument when it should be a command and is not one, else "".
// CLI11 would say "The following argument was not expected", which does
// not tell the user the command is what is wrong.
std::string UnknownCommand(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  const std::string_view arg = argv[1];
  for (const char* c : kCommands) {
    if (arg == c) return "";
  }
  return std::string(arg);
}

int Main(int argc, char** argv) {
  CLI::App app{"kvx: a CPU LLM inference runtime whose KV cache is the product"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  int exit_code = 0;
  RegisterRun(app, &exit_code);
  RegisterInspect(app, &exit_code);
  RegisterPerplexity(app, &exit_code);
  RegisterGenModel(app, &exit_code);
  RegisterBench(app, &exit_code);
  RegisterPlan(app, &exit_code);
  RegisterEval(app, &exit_code);
  RegisterServe(app, &exit_code);
  RegisterBatch(app, &exit_code);
  RegisterCalibrateHeads(app, &exit_code);
  RegisterCalibrateStorage(app, &exit_code);
  RegisterTune(app, &exit_code);
  if (const std::string cmd = UnknownCommand(argc, argv); !cmd.empty()) {
    PrintError("unknown command " + QuotePrintable(cmd, 64) + "; the commands are " + CommandList() +
               " (kvx --help describes them)");
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and friends are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string message = e.what();
    if (argc < 2) message = "give a command: " + CommandList() + " (kvx --help describes them)";
    PrintError(message + "; see --help for the flags");
    return 1;
  }
  return exit_code;
}

}  // namespace

int ReportStatus(const Status& status) {
  if (status.ok()) return 0;
  PrintError(status.message());
  return 1;
}

}  // namespace kvx::tools

int main(int argc, char** argv) {
  std::set_terminate(kvx::tools::OnTerminate);
  try {
    return kvx::tools::Main(argc, argv);
  } catch (...) {
    kvx::tools::PrintError(kvx::tools::DescribeException(std::current_exception()));
    return 1;
  }
}
