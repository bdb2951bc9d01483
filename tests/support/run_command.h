// Runs a program (the kvx binary) with an argument vector, no shell between,
// so arguments may hold any bytes but NUL (quotes, spaces, invalid UTF-8,
// terminal escapes), and tells a clean exit from a death by signal — which a
// shell would report as exit code 128 + signal.
#pragma once

#include <string>
#include <vector>

namespace kvx::testing {

struct CommandOutcome {
  bool exited = false;     // exited normally (not killed by a signal, not timed out)
  int exit_code = -1;      // when exited
  int signal = 0;          // the signal that killed it, else 0
  bool timed_out = false;  // killed after the timeout
  std::string output;      // stdout and stderr, interleaved as written
  // "exit 1", "signal 8 (Floating point exception)", "timed out after 120 s".
  std::string Describe() const;
};

// Runs argv[0] (a path) with argv; stdin is /dev/null. Kills it with SIGKILL
// after `timeout_seconds`.
CommandOutcome RunCommand(const std::vector<std::string>& argv, int timeout_seconds = 120);

}  // namespace kvx::testing
