// The OpenAI API's request shapes, as kvx serves them: parsing a
// /v1/completions or /v1/chat/completions body (every field's type and
// range, with OpenAI's error shape naming the parameter), building the
// scheduler's GenerationRequest from it (chat template, tokenizer), and
// mapping the scheduler's statuses (Scheduler::Submit is the one gate that
// checks a request against the model: vocabulary, context, sessions) to
// OpenAI's error codes. Answering is server/completion.h's.
//
// Supported request fields: model, prompt (a string, one-element array of
// strings, or an array of token ids) / messages (role + content string or
// text parts), max_tokens (max_completion_tokens), temperature, top_p, n,
// stream, stream_options.include_usage, stop (string or up to 4 strings),
// seed, user (without API keys, the tenant: server/tenants.h), echo
// (completions). kvx extensions: chunks (completions: a list of texts
// placed before the prompt, their KV reused from the chunk cache:
// docs/kv-reuse.md), chunk_repair (chat: also makes every text part of a
// message's content list a chunk, server/chat_chunks.h), top_k, min_p,
// repeat_penalty, session (a named session to continue and keep),
// ignore_eos (llama-server's name: generate past the end-of-generation
// tokens, e.g. to fill a session to a length), parse_special (below),
// cache ("default" | "none": whether the prefix cache and the KV tiers are
// read and written; "pin" | "unpin": as default, and the prompt's blocks
// pinned in / unpinned from the host-RAM tier, per tenant).
// presence_penalty, frequency_penalty, logit_bias must be 0/empty
// (InvalidArgument otherwise), logprobs is refused: not silently ignored.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "util/status.h"

namespace kvx::server {

// An error response in OpenAI's shape:
// {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
  nlohmann::json ToJson() const;
};

struct CompletionParams {
  bool chat = false;
  std::string model;
  // Completions: the prompt text, or token ids when given as such.
  std::string prompt;
  std::optional<std::vector<int32_t>> prompt_tokens;
  // Chat.
  std::vector<ChatMessage> messages;
  std::optional<int> max_tokens;  // absent: until the context ends (chat) / 16 (completions)
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  std::vector<std::string> stop;
  std::string user;
  std::string session;
  bool ignore_eos = false;
  engine::CacheMode cache = engine::CacheMode::kDefault;
  // Whether special-token texts in the caller's text become control tokens:
  // chat message content (default false: content is text, so it cannot
  // open a turn of another role), a completion's prompt (default true: the
  // caller's own raw prompt).
  std::optional<bool> parse_special;
  // Completions: texts placed in order before the prompt, each assembled
  // from the chunk cache (engine/chunk_assembly.h) with chunk_repair.
  std::optional<std::vector<std::string>> chunks;
  engine::ChunkRepair chunk_repair;
  // Chat: content parts as chunks (the request named chunk_repair).
  bool chat_parts_as_chunks = false;
};

// What parsing takes from the server: limits and defaults.
struct ParseLimits {
  int max_n = 16;  // samples per request
  engine::ChunkRepair chunk_repair;  // when a request names none (--chunk-repair)
};

// Parses a request body. `chat` selects /v1/chat/completions.
// The ApiError names the field (`param`) and what it must be.
std::optional<ApiError> ParseCompletionRequest(const std::string& body, bool chat, const ParseLimits& limits,
                                               CompletionParams* out);

// The scheduler's request for a parsed body, and what the response needs
// besides.
struct BuiltRequest {
  engine::GenerationRequest request;
  int prompt_tokens = 0;  // usage.prompt_tokens
  std::string echo;       // completions with echo: the prompt text
};

// Builds the request: chat messages rendered by `chat` and tokenized (the
// template's special tokens parsed, the content's only with parse_special;
// BOS unless the template wrote it), a prompt text tokenized with BOS
// (dropped when it continues a session; special tokens parsed unless
// parse_special is false), token ids
// taken as given; max_tokens cut to the room the context leaves after the
// prompt (absent: all of it for chat, 16 for completions); no seed: a
// random one. Checks nothing that Scheduler::Submit checks (SubmitError maps
// its rejections). An ApiError when the template or the tokenizer fails.
std::optional<ApiError> BuildGenerationRequest(const CompletionParams& p, const model::Tokenizer& tok,
                                               const ChatTemplate& chat, int n_ctx, BuiltRequest* out);

// A status as an API error: InvalidArgument 400, NotFound 404 (not_found),
// DataLoss 400 (invalid_session_file), Unimplemented 400 (unsupported),
// ResourceExhausted 429 (rate_limit_error), anything else 500.
ApiError FromStatus(const Status& s, const std::string& param = "");
// Scheduler::Submit's rejection: FromStatus, the parameter named by the
// part (prompt / messages for the prompt, the context (code
// context_length_exceeded) and the KV budget (kv_budget_exceeded)).
ApiError SubmitError(const Status& s, engine::RequestPart part, bool chat);
// A request's failure after Submit accepted it. ResourceExhausted there is
// the KV pool that cannot hold the request even with nothing else running
// (at admission or as it grows): retrying cannot help, so 400
// (kv_budget_exceeded, the message gives the budget), not 429, which is
// kept for the retryable full queue.
ApiError GenerationError(const Status& s);
// 503 for requests that arrive (or are cut) while the server shuts down.
ApiError ShuttingDownError();

// A session name usable as a file name: 1-64 of [A-Za-z0-9_-].
bool ValidSessionName(const std::string& name);

}  // namespace kvx::server
