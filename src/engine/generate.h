// Generate: the prompt -> tokens loop on a Session, with streaming output and
// the timing figures `kvx run` prints.
// Thread-safety: as Session.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/session.h"
#include "model/sampler.h"

namespace kvx::engine {

struct GenerateOptions {
  int n_predict = 128;             // tokens to generate at most; -1 = until EOS or context end
  model::SamplerOptions sampler;
  bool stop_at_eog = true;
  // With an empty prompt: the logits the first token is sampled from (a
  // restored session's saved logits, engine/session_file.h).
  std::span<const float> resume_logits;
};

struct GenerateStats {
  int prompt_tokens = 0;
  double prompt_seconds = 0;
  int generated_tokens = 0;
  double generate_seconds = 0;  // the decode steps (the first token comes from the prompt pass)
  size_t kv_bytes_in_use = 0;
  bool hit_eog = false;
  double PromptTokensPerSecond() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  double GenerateTokensPerSecond() const;
  std::string ToString() const;
};

// Called for every generated token with its text piece; return false to stop.
using TokenCallback = std::function<bool(int32_t token, const std::string& piece)>;

// Feeds `prompt` and samples up to n_predict tokens. An empty prompt
// continues a restored session from options.resume_logits (InvalidArgument
// without them). The tokens the session already holds count for the
// repetition penalty. Fills `out_tokens` (generated ids, the EOG token
// included when hit); the last one is not fed to the session.
Status Generate(Session* session, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                const TokenCallback& on_token, std::vector<int32_t>* out_tokens, GenerateStats* stats);

}  // namespace kvx::engine
