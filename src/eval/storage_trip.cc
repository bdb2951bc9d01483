#include "eval/storage_trip.h"

#include <algorithm>

#include "kv/tier/block_format.h"
#include "kv/tier/tier_store.h"

namespace kvx::eval {

Result<std::unique_ptr<engine::Session>> ThroughStorage(engine::Session& session, std::span<const int32_t> context,
                                                        StorageTrip* trip) {
  namespace tier = kv::tier;
  kv::KVManager& m = session.engine().kv_manager();
  KVX_ASSIGN_OR_RETURN(tier::BlockSpace space, tier::MakeBlockSpace(m.spec(), 0, kStorageBlockTokens));
  space.transform = trip->transform;
  KVX_ASSIGN_OR_RETURN(const kv::KVManager::SequenceImage image, m.ExportSequence(session.id()));
  const int n = static_cast<int>(context.size()) / kStorageBlockTokens;
  if (n == 0) {
    return InvalidArgument("--storage-codec: the context holds no full block of " +
                           std::to_string(kStorageBlockTokens) + " tokens (use a longer --chunk or prompt)");
  }
  const std::vector<tier::BlockKey> keys = tier::BlockKeys(space, image.salt, image.tokens);
  tier::TierLoad load;  // blocks 0..n-1
  for (int i = 0; i < n; ++i) {
    KVX_ASSIGN_OR_RETURN(const tier::EncodedBlock b, tier::EncodeBlock(space, image.salt, image, i, {.level = trip->level}));
    trip->bytes += b.bytes.size();
    const tier::BlockRequest q{&space, image.salt, image.tokens, i, keys[i], trip->level};
    KVX_ASSIGN_OR_RETURN(tier::ParsedBlock block,
                         tier::DecodeBlock({reinterpret_cast<const uint8_t*>(b.bytes.data()), b.bytes.size()}, q));
    load.blocks.push_back(std::move(block));
  }
  trip->tokens += static_cast<int64_t>(n) * kStorageBlockTokens;
  KVX_ASSIGN_OR_RETURN(const kv::KVManager::SequenceImage prefix, tier::LoadImage(load, image.tokens, space, image.salt));
  session.Reset();  // the blocks hold copies: the pool's pages go back before the import
  KVX_ASSIGN_OR_RETURN(const kv::SeqId seq, m.ImportSequence(prefix));
  std::unique_ptr<engine::Session> restored = session.engine().AdoptSequence(seq);
  const size_t done = static_cast<size_t>(n) * kStorageBlockTokens;
  if (done < context.size()) KVX_RETURN_IF_ERROR(restored->Feed(context.subspan(done)).status());
  return restored;
}

Result<std::vector<int32_t>> TokenizeCalibrationText(const model::Model& model, std::string text, int max_tokens) {
  // Far more bytes than the tokens need are not tokenized: the text is cut
  // at a line end (a UTF-8 boundary) past 16 bytes a token.
  const size_t line_end = text.find('\n', static_cast<size_t>(max_tokens) * 16);
  if (line_end != std::string::npos) text.resize(line_end);
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, model.tokenizer().Encode(text, false, false));
  if (tokens.size() > static_cast<size_t>(max_tokens)) tokens.resize(static_cast<size_t>(max_tokens));
  return tokens;
}

Result<std::shared_ptr<const kv::tier::StorageTransform>> CalibrateStorage(engine::Engine& engine,
                                                                           std::span<const int32_t> tokens, int chunk,
                                                                           const kv::tier::CompactRates& rates) {
  kv::KVManager& m = engine.kv_manager();
  kv::tier::TransformCalibration calibration(m.spec().layout, m.spec().layers);
  const model::Tokenizer& tok = engine.model().tokenizer();
  for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(chunk)) {
    std::vector<int32_t> part(tokens.begin() + static_cast<long>(at),
                              tokens.begin() + static_cast<long>(std::min(tokens.size(), at + chunk)));
    if (tok.add_bos() && tok.bos() >= 0) part[0] = tok.bos();
    KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::Session> session, engine.NewSession());
    KVX_RETURN_IF_ERROR(session->Feed(part).status());
    KVX_ASSIGN_OR_RETURN(const kv::KVManager::SequenceImage image, m.ExportSequence(session->id()));
    KVX_RETURN_IF_ERROR(calibration.Add(image));
  }
  KVX_ASSIGN_OR_RETURN(kv::tier::StorageTransform transform, calibration.Finish(rates));
  return std::make_shared<const kv::tier::StorageTransform>(std::move(transform));
}

}  // namespace kvx::eval
