#include "server/chat_chunks.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>

namespace kvx::server {
namespace {

std::string Sentinel(const std::string& nonce, size_t part) { return "kvxpart" + nonce + "x" + std::to_string(part) + "x"; }

std::string NewNonce() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08" PRIx32 "%08" PRIx32 "%08" PRIx32 "%08" PRIx32, static_cast<uint32_t>(rd()),
                static_cast<uint32_t>(rd()), static_cast<uint32_t>(rd()), static_cast<uint32_t>(rd()));
  return buf;
}

bool AnyHolds(const std::vector<ChatMessage>& messages, const std::string& nonce) {
  for (const ChatMessage& m : messages) {
    if (m.content.find(nonce) != std::string::npos) return true;
    for (const std::string& p : m.parts.value_or(std::vector<std::string>{})) {
      if (p.find(nonce) != std::string::npos) return true;
    }
  }
  return false;
}

// Whether [begin, end) lies inside one span of `data`.
bool InsideData(const jinja::Spans& data, size_t begin, size_t end) {
  return std::any_of(data.begin(), data.end(), [&](const auto& s) { return s.first <= begin && end <= s.second; });
}

// The spans of `data` within [begin, end), relative to begin.
jinja::Spans Clip(const jinja::Spans& data, size_t begin, size_t end) {
  jinja::Spans out;
  for (const auto& [b, e] : data) {
    const size_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) out.push_back({lo - begin, hi - begin});
  }
  return out;
}

}  // namespace

Result<engine::ChunkPrompt> RenderChatChunksWithNonce(const ChatTemplate& chat, const model::Tokenizer& tokenizer,
                                                      const std::vector<ChatMessage>& messages, bool parse_special,
                                                      const engine::ChunkRepair& repair, const std::string& nonce) {
  if (AnyHolds(messages, nonce)) return InvalidArgument("a message holds the part sentinel's nonce: draw another");
  // Each part's content replaced by its sentinel.
  std::vector<ChatMessage> marked = messages;
  std::vector<std::string> parts;
  for (ChatMessage& m : marked) {
    if (!m.parts) continue;
    m.content.clear();
    for (std::string& p : *m.parts) {
      m.content += Sentinel(nonce, parts.size());
      parts.push_back(std::move(p));
    }
    m.parts.reset();
  }
  KVX_ASSIGN_OR_RETURN(jinja::MarkedText rendered, chat.Render(marked, /*add_generation_prompt=*/true));
  // Where each part's sentinel is: once, in content's bytes; in text order
  // (a template may move a message).
  std::vector<std::pair<size_t, size_t>> at;  // (offset, part)
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string s = Sentinel(nonce, i);
    const size_t pos = rendered.text.find(s);
    if (pos == std::string::npos || rendered.text.find(s, pos + 1) != std::string::npos ||
        !InsideData(rendered.data, pos, pos + s.size())) {
      return InvalidArgument("the chat template rewrites message content (content part " + std::to_string(i) +
                             " is not rendered once as given), so its parts cannot be chunks: send the content as one "
                             "string, or the request without chunk_repair");
    }
    at.push_back({pos, i});
  }
  std::sort(at.begin(), at.end());
  // The template text around the parts: prefix, gaps, suffix.
  const size_t sentinel_bytes = Sentinel(nonce, 0).size() - 1;  // without the index's digits
  auto encode = [&](size_t begin, size_t end, bool add_special) {
    return EncodeChatText(tokenizer, std::string_view(rendered.text).substr(begin, end - begin),
                          Clip(rendered.data, begin, end), add_special, parse_special);
  };
  engine::ChunkPrompt c;
  c.repair = repair;
  std::vector<std::string> texts;
  size_t from = 0;
  for (size_t k = 0; k <= at.size(); ++k) {
    const size_t to = k < at.size() ? at[k].first : rendered.text.size();
    KVX_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, encode(from, to, k == 0 && !chat.WroteBos(rendered)));
    if (k == 0) c.prefix = std::move(tokens);
    else if (k < at.size()) c.gaps.push_back(std::move(tokens));
    else c.suffix = std::move(tokens);
    if (k == at.size()) break;
    texts.push_back(std::move(parts[at[k].second]));
    from = to + sentinel_bytes + std::to_string(at[k].second).size();
  }
  Result<std::vector<std::vector<int32_t>>> chunks = engine::TokenizeChunks(tokenizer, texts, /*after_text=*/at.front().first > 0);
  if (!chunks.ok()) return InvalidArgument("content part: " + chunks.status().message());
  c.chunks = std::move(chunks).value();
  return c;
}

Result<engine::ChunkPrompt> RenderChatChunks(const ChatTemplate& chat, const model::Tokenizer& tokenizer,
                                             const std::vector<ChatMessage>& messages, bool parse_special,
                                             const engine::ChunkRepair& repair) {
  std::string nonce = NewNonce();
  while (AnyHolds(messages, nonce)) nonce = NewNonce();  // 2^-128 per draw: users cannot aim at it
  return RenderChatChunksWithNonce(chat, tokenizer, messages, parse_special, repair, nonce);
}

}  // namespace kvx::server
