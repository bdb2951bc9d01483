// Chat content parts as chunks (docs/kv-reuse.md, "Chat content parts"): a
// /v1/chat/completions request that names "chunk_repair" makes each text
// part of a message's content list a chunk, assembled from the chunk cache
// like /v1/completions' "chunks".
//
// The chat template still renders the whole conversation (the sandboxed
// interpreter of server/jinja.h, unchanged): each part is replaced by a
// sentinel, "kvxpart" + a 128-bit random nonce drawn per request + "x" +
// the part's index + "x", and the rendered text is cut at the sentinels.
// Each part is then tokenized alone (engine::TokenizeChunks: the chunk's
// tokens and cache key do not depend on the conversation around it), and
// the template text between the parts, with any string content in it,
// becomes the prompt text around the chunks: before the first part the
// prefix, between two parts a gap (engine::ChunkPrompt::gaps, computed in
// context), after the last the suffix, tokenized as the joined prompt is
// (the template's special-token texts parsed, the content's only with
// parse_special).
//
// A sentinel cannot come from user text: the nonce is drawn after the
// messages are known and redrawn if any message or part holds it, and each
// sentinel must then appear exactly once, inside the bytes the template
// took from message content (jinja.h's data marks). A template that
// rewrites content (trims, slices, changes case) breaks a sentinel: that is
// InvalidArgument naming the cause, never a wrong cut.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "engine/chunk_assembly.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "util/status.h"

namespace kvx::server {

// The chunked prompt of `messages` (those with `parts`: each part a chunk;
// the others' content as the template renders it), ending with the
// assistant's turn opening. InvalidArgument for a part that is not valid
// UTF-8, a template that refuses the messages or rewrites their content.
Result<engine::ChunkPrompt> RenderChatChunks(const ChatTemplate& chat, const model::Tokenizer& tokenizer,
                                             const std::vector<ChatMessage>& messages, bool parse_special,
                                             const engine::ChunkRepair& repair);

// As RenderChatChunks with the given nonce (tests): InvalidArgument when a
// message or part already holds it.
Result<engine::ChunkPrompt> RenderChatChunksWithNonce(const ChatTemplate& chat, const model::Tokenizer& tokenizer,
                                                      const std::vector<ChatMessage>& messages, bool parse_special,
                                                      const engine::ChunkRepair& repair, const std::string& nonce);

}  // namespace kvx::server
