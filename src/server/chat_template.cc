#include "server/chat_template.h"

namespace kvx::server {

Result<ChatTemplate> ChatTemplate::Create(const std::string& source, const model::Tokenizer& tokenizer) {
  ChatTemplate t;
  if (!source.empty()) {
    return Unimplemented("the model's chat template cannot be run yet (no Jinja interpreter); ChatML is used");
  }
  if (tokenizer.bos() >= 0) t.bos_ = tokenizer.TokenText(tokenizer.bos());
  if (tokenizer.eos() >= 0) t.eos_ = tokenizer.TokenText(tokenizer.eos());
  // Turn-end tokens of common formats that are not the vocabulary's EOS.
  for (const char* text : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"}) {
    const int32_t id = tokenizer.TextToToken(text);
    if (id >= 0) t.stop_tokens_.push_back(id);
  }
  return t;
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kvx::server
