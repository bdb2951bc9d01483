#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "server/chat_chunks.h"
#include "server/text_stream.h"

namespace kvx::server {
namespace {

using nlohmann::json;

ApiError Bad(const std::string& param, const std::string& message, const std::string& code = "") {
  ApiError e;
  e.param = param;
  e.message = message;
  e.code = code;
  return e;
}

// Type/range helpers: each returns an error naming `key`, or nullopt.
std::optional<ApiError> GetNumber(const json& j, const char* key, double lo, double hi, float* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (!v.is_number()) return Bad(key, std::string("'") + key + "' must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return Bad(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                        " (got " + v.dump() + ")");
  }
  *out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& j, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (!v.is_number_integer()) return Bad(key, std::string("'") + key + "' must be an integer");
  const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (i < lo || i > hi) {
    return Bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                        std::to_string(hi) + " (got " + v.dump() + ")");
  }
  *out = i;
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return Bad(key, std::string("'") + key + "' must be a boolean");
  *out = j[key].get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetString(const json& j, const char* key, std::string* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) return Bad(key, std::string("'") + key + "' must be a string");
  *out = j[key].get<std::string>();
  return std::nullopt;
}

// Message content: a string, or an array of {"type": "text", "text": ...}
// (joined into content, and each kept in parts).
std::optional<ApiError> ContentText(const json& c, const std::string& param, ChatMessage* out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    out->content = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return Bad(param, "'" + param + "' must be a string or an array of text parts");
  out->parts.emplace();
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return Bad(param, "'" + param + "' parts must be {\"type\": \"text\", \"text\": string} (kvx serves text only)");
    }
    out->parts->push_back(part["text"].get<std::string>());
    out->content += out->parts->back();
  }
  return std::nullopt;
}

// "chunks": an array of strings, with a prompt given as text.
std::optional<ApiError> GetChunks(const json& j, CompletionParams* out) {
  if (!j.contains("chunks") || j["chunks"].is_null()) return std::nullopt;
  const json& c = j["chunks"];
  if (!c.is_array()) return Bad("chunks", "'chunks' must be an array of strings (texts placed before the prompt)");
  std::vector<std::string> texts;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!c[i].is_string()) return Bad("chunks", "'chunks[" + std::to_string(i) + "]' must be a string");
    texts.push_back(c[i].get<std::string>());
  }
  if (out->prompt_tokens) return Bad("chunks", "'chunks' needs the prompt as text, not token ids");
  out->chunks = std::move(texts);
  return std::nullopt;
}

}  // namespace

json ApiError::ToJson() const {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ApiError FromStatus(const Status& s, const std::string& param) {
  ApiError e;
  e.message = s.message();
  e.param = param;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: e.status = 400; break;
    case StatusCode::kNotFound: e.status = 404; e.code = "not_found"; break;
    case StatusCode::kDataLoss: e.status = 400; e.code = "invalid_session_file"; break;
    case StatusCode::kUnimplemented: e.status = 400; e.code = "unsupported"; break;
    case StatusCode::kResourceExhausted: e.status = 429; e.type = "rate_limit_error"; break;
    default: e.status = 500; e.type = "server_error"; break;
  }
  return e;
}

ApiError SubmitError(const Status& s, engine::RequestPart part, bool chat) {
  using engine::RequestPart;
  const char* prompt = chat ? "messages" : "prompt";
  auto prompt_error = [&](const char* code) {
    ApiError e = FromStatus(s, prompt);
    e.code = code;
    return e;
  };
  switch (part) {
    case RequestPart::kPrompt: return prompt_error("");
    case RequestPart::kContext: return prompt_error("context_length_exceeded");
    case RequestPart::kKvBudget: return prompt_error("kv_budget_exceeded");
    case RequestPart::kMaxTokens: return FromStatus(s, "max_tokens");
    case RequestPart::kSamples: return FromStatus(s, "n");
    case RequestPart::kSession: return FromStatus(s, "session");
    case RequestPart::kCache: return FromStatus(s, "cache");
    case RequestPart::kChunks: return FromStatus(s, "chunks");
    case RequestPart::kSampling:
    case RequestPart::kNone: break;
  }
  return FromStatus(s);
}

ApiError GenerationError(const Status& s) {
  ApiError e = FromStatus(s);
  if (s.code() == StatusCode::kResourceExhausted) {
    e.status = 400;
    e.type = "invalid_request_error";
    e.code = "kv_budget_exceeded";
  }
  return e;
}

ApiError ShuttingDownError() { return ApiError{503, "the server is shutting down", "server_error", "", ""}; }

std::optional<ApiError> BuildGenerationRequest(const CompletionParams& p, const model::Tokenizer& tok,
                                               const ChatTemplate& chat, int n_ctx, BuiltRequest* out) {
  *out = BuiltRequest();
  engine::GenerationRequest& g = out->request;
  if (p.chat && p.chat_parts_as_chunks) {
    Result<engine::ChunkPrompt> c =
        RenderChatChunks(chat, tok, p.messages, p.parse_special.value_or(false), p.chunk_repair);
    if (!c.ok()) return FromStatus(c.status(), "messages");
    g.chunks = std::make_shared<const engine::ChunkPrompt>(std::move(c).value());
    g.prompt = g.chunks->Tokens();
    g.stop_tokens = chat.stop_tokens();
  } else if (p.chat) {
    auto rendered = chat.Render(p.messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return FromStatus(rendered.status(), "messages");
    // The template's special-token texts are control tokens; the content's
    // are text unless the request asks otherwise (no role injection); no
    // second BOS after the template's own.
    auto ids = EncodeChatText(tok, rendered->text, rendered->data, /*add_special=*/!chat.WroteBos(*rendered),
                              p.parse_special.value_or(false));
    if (!ids.ok()) return FromStatus(ids.status(), "messages");
    g.prompt = std::move(ids).value();
    g.stop_tokens = chat.stop_tokens();
  } else if (p.prompt_tokens) {
    g.prompt = *p.prompt_tokens;
  } else if (p.chunks) {
    Result<engine::ChunkPrompt> c =
        engine::MakeChunkPrompt(tok, *p.chunks, p.prompt, p.parse_special.value_or(true), p.chunk_repair);
    if (!c.ok()) return FromStatus(c.status(), "chunks");
    g.chunks = std::make_shared<const engine::ChunkPrompt>(std::move(c).value());
    g.prompt = g.chunks->Tokens();
    if (p.echo) {
      for (const std::string& text : *p.chunks) out->echo += text;
      out->echo += p.prompt;
    }
  } else {
    // A raw prompt is the caller's own text (it could send token ids as
    // well): its special-token texts are control tokens unless it asks not.
    auto ids = tok.Encode(p.prompt, /*add_special=*/true, /*parse_special=*/p.parse_special.value_or(true));
    if (!ids.ok()) return FromStatus(ids.status(), "prompt");
    g.prompt = std::move(ids).value();
    g.drop_bos_when_resuming = true;  // the text continues the session: no second BOS
    if (p.echo) out->echo = p.prompt;
  }
  out->prompt_tokens = static_cast<int>(g.prompt.size());
  const int room = n_ctx - out->prompt_tokens;  // <= 0: Submit refuses the prompt first
  g.max_tokens = std::min(room, p.max_tokens.value_or(p.chat ? room : 16));
  g.sampling.temperature = p.temperature;
  g.sampling.top_p = p.top_p;
  g.sampling.top_k = p.top_k;
  g.sampling.min_p = p.min_p;
  g.sampling.repeat_penalty = p.repeat_penalty;
  g.sampling.seed = p.seed ? *p.seed : std::random_device{}();
  g.n = p.n;
  g.stop_at_eog = !p.ignore_eos;
  g.cache = p.cache;
  g.continue_session = p.session;
  return std::nullopt;
}

bool ValidSessionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

std::optional<ApiError> ParseCompletionRequest(const std::string& body, bool chat, const ParseLimits& limits,
                                               CompletionParams* out) {
  *out = CompletionParams();
  out->chat = chat;
  if (!IsValidUtf8(body)) return Bad("", "the request body is not valid UTF-8");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("", "the request body is not valid JSON");
  if (!j.is_object()) return Bad("", "the request body must be a JSON object");

  if (auto e = GetString(j, "model", &out->model)) return e;
  if (chat) {
    if (!j.contains("messages")) return Bad("messages", "'messages' is required");
    const json& m = j["messages"];
    if (!m.is_array() || m.empty()) return Bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m[i].is_object()) return Bad(p, "'" + p + "' must be an object");
      if (!m[i].contains("role") || !m[i]["role"].is_string()) return Bad(p + ".role", "'" + p + ".role' must be a string");
      ChatMessage msg;
      msg.role = m[i]["role"].get<std::string>();
      static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
      bool known = false;
      for (const char* r : kRoles) known |= msg.role == r;
      if (!known) return Bad(p + ".role", "'" + p + ".role' must be one of system, developer, user, assistant, tool");
      if (!m[i].contains("content")) return Bad(p + ".content", "'" + p + ".content' is required");
      if (auto e = ContentText(m[i]["content"], p + ".content", &msg)) return e;
      out->messages.push_back(std::move(msg));
    }
  } else {
    if (!j.contains("prompt")) return Bad("prompt", "'prompt' is required");
    const json& p = j["prompt"];
    if (p.is_string()) {
      out->prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      out->prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      std::vector<int32_t> ids;
      for (const json& t : p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          return Bad("prompt", "'prompt' token arrays must hold non-negative integers");
        }
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      out->prompt_tokens = std::move(ids);
    } else if (p.is_array() && p.size() > 1 && p[0].is_string()) {
      return Bad("prompt", "kvx serves one prompt per request; send one request per prompt (they are batched)");
    } else {
      return Bad("prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
    }
    if (auto e = GetBool(j, "echo", &out->echo)) return e;
    if (auto e = GetChunks(j, out)) return e;
  }
  out->chunk_repair = limits.chunk_repair;
  if (j.contains("chunk_repair") && !j["chunk_repair"].is_null()) {
    // Chat: naming a repair makes content parts chunks (opt-in: reuse
    // changes the answer's logits, so the joined prompt stays the default).
    out->chat_parts_as_chunks = chat;
    if (!j["chunk_repair"].is_string()) return Bad("chunk_repair", "'chunk_repair' must be a string");
    Result<engine::ChunkRepair> repair = engine::ParseChunkRepair(j["chunk_repair"].get<std::string>());
    if (!repair.ok()) return Bad("chunk_repair", repair.status().message());
    out->chunk_repair = *repair;
  }

  int64_t v = 0;
  const char* max_key = j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(max_key) && !j[max_key].is_null()) {
    if (auto e = GetInt(j, max_key, 1, INT32_MAX, &v)) return e;
    out->max_tokens = static_cast<int>(v);
  }
  if (auto e = GetNumber(j, "temperature", 0, 2, &out->temperature)) return e;
  if (auto e = GetNumber(j, "top_p", 0, 1, &out->top_p)) return e;
  if (j.contains("top_p") && out->top_p <= 0) return Bad("top_p", "'top_p' must be greater than 0");
  if (j.contains("top_k")) {
    if (auto e = GetInt(j, "top_k", 0, 1 << 20, &v)) return e;
    out->top_k = static_cast<int>(v);
  }
  if (auto e = GetNumber(j, "min_p", 0, 1, &out->min_p)) return e;
  if (auto e = GetNumber(j, "repeat_penalty", 0.01, 100, &out->repeat_penalty)) return e;
  if (j.contains("n") && !j["n"].is_null()) {
    if (auto e = GetInt(j, "n", 1, limits.max_n, &v)) return e;
    out->n = static_cast<int>(v);
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return Bad("seed", "'seed' must be an integer");
    out->seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>()
                                               : static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  if (auto e = GetBool(j, "stream", &out->stream)) return e;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) return Bad("stream_options", "'stream_options' must be an object");
    if (auto e = GetBool(j["stream_options"], "include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      out->stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) return Bad("stop", "'stop' must be a string or an array of up to 4 strings");
        out->stop.push_back(x.get<std::string>());
      }
    } else {
      return Bad("stop", "'stop' must be a string or an array of up to 4 strings");
    }
  }
  if (auto e = GetString(j, "user", &out->user)) return e;
  if (auto e = GetString(j, "session", &out->session)) return e;
  if (auto e = GetBool(j, "ignore_eos", &out->ignore_eos)) return e;
  std::string cache = "default";
  if (auto e = GetString(j, "cache", &cache)) return e;
  Result<engine::CacheMode> mode = engine::ParseCacheMode(cache);
  if (!mode.ok()) return Bad("cache", mode.status().message());
  out->cache = *mode;  // pin / unpin: checked by the scheduler's gate (RequestPart::kCache)
  if (j.contains("parse_special") && !j["parse_special"].is_null()) {
    bool parse = false;
    if (auto e = GetBool(j, "parse_special", &parse)) return e;
    out->parse_special = parse;
  }
  if (!out->session.empty() && !ValidSessionName(out->session)) {
    return Bad("session", "'session' must be 1-64 characters of A-Z, a-z, 0-9, _ and -");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    float x = 0;
    if (auto e = GetNumber(j, key, -2, 2, &x)) return e;
    if (x != 0) return Bad(key, std::string("'") + key + "' is not supported by kvx (use repeat_penalty)");
  }
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() && !(j["logit_bias"].is_object() && j["logit_bias"].empty())) {
    return Bad("logit_bias", "'logit_bias' is not supported by kvx");
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false) {
    return Bad("logprobs", "'logprobs' is not supported by kvx");
  }
  return std::nullopt;
}

}  // namespace kvx::server
