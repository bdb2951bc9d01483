// The kvx subcommands. Each Register* adds its subcommand to the app; the
// callback runs the command and stores its exit code. Commands are thin: they
// parse flags and call the library.
#pragma once

#include <CLI/CLI.hpp>

#include "util/status.h"

namespace kvx::tools {

void RegisterRun(CLI::App& app, int* exit_code);
void RegisterInspect(CLI::App& app, int* exit_code);
void RegisterPerplexity(CLI::App& app, int* exit_code);
void RegisterGenModel(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
void RegisterPlan(CLI::App& app, int* exit_code);
void RegisterEval(CLI::App& app, int* exit_code);
void RegisterServe(CLI::App& app, int* exit_code);
void RegisterBatch(CLI::App& app, int* exit_code);
void RegisterCalibrateHeads(CLI::App& app, int* exit_code);
void RegisterCalibrateStorage(CLI::App& app, int* exit_code);
void RegisterTune(CLI::App& app, int* exit_code);

// Prints "kvx: error: <message>" to stderr and returns 1 (0 when ok).
int ReportStatus(const Status& status);

}  // namespace kvx::tools
