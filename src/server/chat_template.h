// ChatTemplate: renders an OpenAI `messages` list into the prompt text a
// model was trained on. The template comes from the model's GGUF metadata
// (`tokenizer.chat_template`, a Jinja template as Hugging Face ships it),
// run by kvx's own Jinja-subset interpreter (server/jinja.h: no C++ Jinja
// library is packaged); a model without one gets the documented default,
// ChatML:
//
//   <|im_start|>{role}\n{content}<|im_end|>\n   (per message)
//   <|im_start|>assistant\n                      (the generation prompt)
//
// Thread-safety: Render is const and safe from many threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "server/jinja.h"
#include "util/status.h"

namespace kvx::server {

struct ChatMessage {
  std::string role;     // system, user, assistant, tool, ...
  std::string content;  // content parts joined
  // Content given as a list of text parts, each part's text (chat parts as
  // chunks: server/chat_chunks.h); absent for a content string.
  std::optional<std::vector<std::string>> parts = std::nullopt;  // (initialized: aggregate init may omit it)
};

// The variables a chat template renders with: `messages` (role, content:
// data, jinja::Value::Data), `add_generation_prompt`, `bos_token`,
// `eos_token`.
jinja::Value::Object ChatContext(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos, const std::string& eos);

class ChatTemplate {
 public:
  // What the errors of the model's own template say it is.
  static constexpr const char* kModelTemplate = "the model's chat template (tokenizer.chat_template)";
  // The template `source` (the GGUF's `tokenizer.chat_template`, a
  // --chat-template file; empty for the default), with the tokenizer's
  // BOS/EOS token texts. InvalidArgument naming `origin` and the construct
  // or limit for a template the interpreter cannot parse, or that fails on
  // one user message otherwise than by refusing it (a limit passed, an
  // overflow: jinja.h's sandbox).
  static Result<ChatTemplate> Create(const std::string& source, const model::Tokenizer& tokenizer,
                                     const std::string& origin = kModelTemplate);

  // The prompt for `messages`, ending with the assistant's turn opening when
  // add_generation_prompt, with the bytes that came from message content
  // marked (jinja.h, "Data marks"): the tokenizer reads those as text only,
  // so content cannot open or close a turn (role injection).
  // InvalidArgument for what the template refuses (raise_exception, e.g.
  // roles out of order); Internal when it fails otherwise (a limit, an
  // overflow, a construct it cannot evaluate).
  Result<jinja::MarkedText> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // Whether `rendered` starts with the template's own BOS text (not
  // content's): the tokenizer then adds none.
  bool WroteBos(const jinja::MarkedText& rendered) const;

  bool is_default() const { return source_.empty(); }
  const std::string& source() const { return source_; }
  // Token texts the rendered prompt may hold at its start (BOS) so the
  // caller does not add a second one.
  const std::string& bos_text() const { return bos_; }
  // Tokens that end an assistant turn beyond the model's end-of-generation
  // set (ChatML's <|im_end|> when the vocabulary has it).
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }

 private:
  std::string source_;
  std::string bos_, eos_;
  std::vector<int32_t> stop_tokens_;
  std::shared_ptr<const void> program_;  // the parsed Jinja template (jinja.h), null for the default
};

// Rendered chat text as tokens: the template's special-token texts are
// control tokens, the content's (`data`) text unless parse_special (so
// content cannot open a turn of another role); BOS when add_special.
Result<std::vector<int32_t>> EncodeChatText(const model::Tokenizer& tokenizer, std::string_view text,
                                            const jinja::Spans& data, bool add_special, bool parse_special);

}  // namespace kvx::server
