#include "server/chat_template.h"

#include "server/jinja.h"

namespace kvx::server {
Result<ChatTemplate> ChatTemplate::Create(const std::string& source, const model::Tokenizer& tokenizer,
                                          const std::string& origin) {
  ChatTemplate t;
  t.source_ = source;
  if (tokenizer.bos() >= 0) t.bos_ = tokenizer.TokenText(tokenizer.bos());
  if (tokenizer.eos() >= 0) t.eos_ = tokenizer.TokenText(tokenizer.eos());
  if (!source.empty()) {
    auto program = jinja::Template::Parse(source);
    if (!program.ok()) return program.status().WithContext(origin);
    t.program_ = *program;
    // A template that cannot render one user message (beyond refusing it, as
    // raise_exception does) would fail every chat request: fail the load.
    auto probe = t.Render({{"user", "Hi"}}, /*add_generation_prompt=*/true);
    if (!probe.ok() && probe.status().code() != StatusCode::kInvalidArgument) {
      return InvalidArgument(probe.status().WithContext(origin).message() + " (rendering one user message)");
    }
  }
  // Turn-end tokens of common formats that are not the vocabulary's EOS.
  for (const char* text : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"}) {
    const int32_t id = tokenizer.TextToToken(text);
    if (id >= 0) t.stop_tokens_.push_back(id);
  }
  return t;
}

Result<jinja::MarkedText> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                               bool add_generation_prompt) const {
  if (program_ == nullptr) {
    jinja::MarkedText out;
    for (const ChatMessage& m : messages) {
      out.Append("<|im_start|>" + m.role + "\n", nullptr);
      const jinja::Spans all = {{0, m.content.size()}};
      out.Append(m.content, &all);
      out.Append("<|im_end|>\n", nullptr);
    }
    if (add_generation_prompt) out.Append("<|im_start|>assistant\n", nullptr);
    return out;
  }
  return static_cast<const jinja::Template*>(program_.get())
      ->RenderMarked(ChatContext(messages, add_generation_prompt, bos_, eos_));
}

bool ChatTemplate::WroteBos(const jinja::MarkedText& rendered) const {
  return !bos_.empty() && rendered.text.rfind(bos_, 0) == 0 &&
         (rendered.data.empty() || rendered.data.front().first >= bos_.size());
}

Result<std::vector<int32_t>> EncodeChatText(const model::Tokenizer& tokenizer, std::string_view text,
                                            const jinja::Spans& data, bool add_special, bool parse_special) {
  static const model::Tokenizer::ByteRanges kNone;
  return tokenizer.Encode(text, add_special, /*parse_special=*/true, parse_special ? kNone : data);
}

jinja::Value::Object ChatContext(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos, const std::string& eos) {
  jinja::Value::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Value::Object o;
    o["role"] = jinja::Value(m.role);
    o["content"] = jinja::Value::Data(m.content);  // marked: tokenized as text
    list.push_back(jinja::Value(std::move(o)));
  }
  jinja::Value::Object context;
  context["messages"] = jinja::Value(std::move(list));
  context["add_generation_prompt"] = jinja::Value(add_generation_prompt);
  context["bos_token"] = jinja::Value(bos);
  context["eos_token"] = jinja::Value(eos);
  return context;
}

}  // namespace kvx::server
