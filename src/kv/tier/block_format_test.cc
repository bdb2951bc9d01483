#include "kv/tier/block_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/codec/codecs.h"
#include "kv/tier/storage_transform.h"
#include "kv/tier/tier_store.h"
#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

using testing::FillSequence;
using testing::MakeManager;
using testing::Tokens;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

struct Filled {
  std::unique_ptr<KVManager> m;
  SeqId seq = -1;
  BlockSpace space;
  std::vector<int32_t> tokens;
};

Filled Make(const std::string& spec, int n_tokens, int block_tokens, uint64_t salt, const KVLayout& layout = {3, 2, 64, 16}) {
  Filled s;
  s.m = MakeManager(spec, layout, 1024);
  EXPECT_NE(s.m, nullptr) << spec;
  s.tokens = Tokens(n_tokens);
  auto seq = FillSequence(*s.m, salt, s.tokens, 5);
  EXPECT_TRUE(seq.ok()) << seq.status().ToString();
  s.seq = *seq;
  auto space = MakeBlockSpace(s.m->spec(), 0xabc, block_tokens);
  EXPECT_TRUE(space.ok()) << space.status().ToString();
  s.space = *space;
  return s;
}

BlockRequest Request(const Filled& s, uint64_t salt, int index) {
  return {&s.space, salt, s.tokens, index, BlockKeys(s.space, salt, s.tokens)[index]};
}

// Every codec's pages go out as blocks and come back bit for bit: blocks
// 0..n-1 of one sequence, decoded and imported into another manager of the
// same spec, hold exactly the original's first n blocks (page bytes,
// positions, tokens, hashes), with and without zstd.
class BlockRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(BlockRoundTrip, IsBitExact) {
  const std::string spec = GetParam();
  const uint64_t salt = 99;
  // 256 tokens, blocks of 64: with KIVI's 32-token residual (pages of 32)
  // the last block is still staging, the first three are sealed.
  Filled a = Make(spec, 256, 64, salt);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  const int storable = spec.find("kivi") != std::string::npos ? 3 : 4;
  for (bool compress : {false, true}) {
    TierLoad load;  // blocks 0..storable-1, imported as the scheduler imports a lookup's
    for (int i = 0; i < storable; ++i) {
      auto e = EncodeBlock(a.space, salt, *image, i, {.compress = compress});
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      EXPECT_EQ(e->key, BlockKeys(a.space, salt, a.tokens)[i]);
      auto d = DecodeBlock(Bytes(e->bytes), Request(a, salt, i));
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      load.blocks.push_back(std::move(d).value());
    }
    auto prefix = LoadImage(load, a.tokens, a.space, salt);
    ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
    auto b = MakeManager(spec, a.m->spec().layout, 1024);
    auto imported = b->ImportSequence(*prefix);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    ASSERT_TRUE(b->CheckInvariants().ok()) << b->CheckInvariants().ToString();
    auto back = b->ExportSequence(*imported);
    ASSERT_TRUE(back.ok());
    const size_t n = static_cast<size_t>(storable) * 64;
    EXPECT_EQ(back->tokens, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + n));
    EXPECT_EQ(back->positions, std::vector<int32_t>(image->positions.begin(), image->positions.begin() + n));
    EXPECT_EQ(back->block_hashes, std::vector<uint64_t>(image->block_hashes.begin(),
                                                        image->block_hashes.begin() + n / a.space.layout.page_tokens));
    for (size_t t = 0; t < image->tables.size(); ++t) {
      const auto& orig = image->tables[t];
      const auto& got = back->tables[t];
      ASSERT_EQ(got.pages.size(), n / a.space.layout.page_tokens) << "table " << t;
      for (size_t p = 0; p < got.pages.size(); ++p) {
        EXPECT_EQ(got.full[p], orig.full[p]) << "table " << t << " page " << p;
        ASSERT_EQ(got.pages[p].size(), orig.pages[p].size());
        EXPECT_EQ(std::memcmp(got.pages[p].data(), orig.pages[p].data(), got.pages[p].size()), 0)
            << spec << " table " << t << " page " << p << (compress ? " (zstd)" : "");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, BlockRoundTrip,
                         ::testing::Values("codec=f16", "codec=f16,prerope=1", "codec=f32", "codec=int8", "codec=int4",
                                           "codec=int4,rotate=hadamard,sym=1", "codec=kivi4,page=32",
                                           "codec=kivi2,page=32,prerope=1", "codec=int4,sinks=16"));

TEST(BlockFormatTest, AStagingBlockIsRefused) {
  Filled a = Make("codec=kivi4,page=32", 256, 64, 1);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  auto e = EncodeBlock(a.space, 1, *image, 3);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("staging"), std::string::npos) << e.status().ToString();
  EXPECT_EQ(EncodeBlock(a.space, 1, *image, 4).status().code(), StatusCode::kInvalidArgument);  // past the end
  image->entries_removed = true;
  EXPECT_EQ(EncodeBlock(a.space, 1, *image, 0).status().code(), StatusCode::kInvalidArgument);
}

// A block asked for with anything else (model, spec, tenant, index, tokens)
// is a miss, even when the key is forged to match (a collision).
TEST(BlockFormatTest, AnotherBlockIsNeverAHit) {
  Filled a = Make("codec=int8", 64, 32, 7);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  auto e = EncodeBlock(a.space, 7, *image, 1);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(DecodeBlock(Bytes(e->bytes), Request(a, 7, 1)).ok());
  auto expect_miss = [&](BlockRequest q, const char* what) {
    q.key = e->key;  // as if the keys collided
    auto d = DecodeBlock(Bytes(e->bytes), q);
    EXPECT_EQ(d.status().code(), StatusCode::kNotFound) << what << ": " << d.status().ToString();
  };
  BlockSpace other_model = a.space;
  other_model.model_fingerprint ^= 1;
  expect_miss({&other_model, 7, a.tokens, 1, {}}, "another model");
  BlockSpace other_spec = a.space;
  other_spec.spec_fingerprint ^= 1;
  expect_miss({&other_spec, 7, a.tokens, 1, {}}, "another spec");
  expect_miss({&a.space, 8, a.tokens, 1, {}}, "another tenant");
  expect_miss({&a.space, 7, a.tokens, 0, {}}, "another index");
  std::vector<int32_t> other_tokens = a.tokens;
  other_tokens[3] = 1;  // in block 0: block 1's prefix differs
  expect_miss({&a.space, 7, other_tokens, 1, {}}, "another prefix");
  BlockRequest unforged = Request(a, 7, 1);
  unforged.key.lo ^= 1;
  EXPECT_EQ(DecodeBlock(Bytes(e->bytes), unforged).status().code(), StatusCode::kNotFound);
}

// Every single flipped bit and every truncation is caught (DataLoss, never a
// crash or a block served), with and without compression.
TEST(BlockFormatTest, AnyCorruptionIsDataLoss) {
  Filled a = Make("codec=int4", 32, 16, 3, KVLayout{2, 1, 32, 8});
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  for (bool compress : {false, true}) {
    auto e = EncodeBlock(a.space, 3, *image, 1, {.compress = compress});
    ASSERT_TRUE(e.ok());
    const BlockRequest q = Request(a, 3, 1);
    ASSERT_TRUE(DecodeBlock(Bytes(e->bytes), q).ok());
    for (size_t i = 0; i < e->bytes.size(); ++i) {
      for (int bit : {0, 7}) {
        std::string bad = e->bytes;
        bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
        auto d = DecodeBlock(Bytes(bad), q);
        ASSERT_EQ(d.status().code(), StatusCode::kDataLoss) << "byte " << i << " bit " << bit << ": " << d.status().ToString();
      }
    }
    for (size_t len = 0; len < e->bytes.size(); ++len) {
      auto d = DecodeBlock(Bytes(e->bytes.substr(0, len)), q);
      ASSERT_EQ(d.status().code(), StatusCode::kDataLoss) << "truncated to " << len;
    }
    EXPECT_EQ(DecodeBlock(Bytes(e->bytes + "x"), q).status().code(), StatusCode::kDataLoss);
  }
}

// Block `index` of a's sequence (tenant 0) encoded at `level` and decoded
// by a reader that accepts any level; its size and bytes when asked.
Result<ParsedBlock> RoundTrip(const Filled& a, const KVManager::SequenceImage& image, int index, StorageLevel level,
                              size_t* bytes = nullptr, std::string* encoded = nullptr) {
  KVX_ASSIGN_OR_RETURN(EncodedBlock e, EncodeBlock(a.space, 0, image, index, {.level = level}));
  if (bytes) *bytes = e.bytes.size();
  if (encoded) *encoded = e.bytes;
  BlockRequest q = Request(a, 0, index);
  q.accepts = StorageLevel::kLow;
  return DecodeBlock(Bytes(e.bytes), q);
}

// Each lossy level of an f16 pool: every value within half its layer's
// step (the channel's range over the block / (2^bits - 1)) plus the f16
// rounding of the page it is decoded into; positions exact; the header says
// the level; smaller than the lossless block.
TEST(BlockFormatTest, LossyLevelsStayWithinHalfAStep) {
  const KVLayout layout{3, 2, 64, 16};
  Filled a = Make("codec=f16", 128, 64, 0, layout);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  size_t lossless_bytes = 0;
  ASSERT_TRUE(RoundTrip(a, *image, 1, StorageLevel::kLossless, &lossless_bytes).ok());
  for (StorageLevel level : {StorageLevel::kHigh, StorageLevel::kMedium, StorageLevel::kLow}) {
    size_t bytes = 0;
    auto b = RoundTrip(a, *image, 1, level, &bytes);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->level, level);
    EXPECT_LT(bytes, lossless_bytes / 2) << StorageLevelName(level);
    const int ppb = b->pages_per_table, T = layout.page_tokens, d = layout.head_dim, n = ppb * T;
    for (int t = 0; t < b->tables; ++t) {
      const int layer = t / layout.n_kv_heads;
      const LayerCodec& lc = a.space.layers[layer];
      const auto& ti = image->tables[t];
      const std::vector<float> want = TableFloats(lc, std::span(ti.pages).subspan(ppb, ppb), std::span(ti.full).subspan(ppb, ppb));
      const std::vector<float> got = TableFloats(lc, std::span(b->pages).subspan(t * ppb, ppb), std::span(b->full).subspan(t * ppb, ppb));
      const int bits = LayerBits(level, layer, layout.n_layers).k;
      for (int kv = 0; kv < 2; ++kv) {
        for (int c = 0; c < d; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int j = 0; j < n; ++j) {
            lo = std::min(lo, want[(kv * n + j) * d + c]);
            hi = std::max(hi, want[(kv * n + j) * d + c]);
          }
          const double half_step = 0.5 * (hi - lo + std::fabs(lo) * 0x1p-10) / ((1 << bits) - 1) * (1 + 0x1p-9);
          for (int j = 0; j < n; ++j) {
            const size_t i = (kv * n + j) * d + c;
            ASSERT_LE(std::fabs(got[i] - want[i]), half_step + std::fabs(want[i]) * 0x1p-11 + 1e-7)
                << StorageLevelName(level) << " table " << t << (kv ? " V" : " K") << " channel " << c << " token " << j;
          }
        }
      }
      for (int p = 0; p < ppb; ++p) {
        EXPECT_EQ(std::memcmp(b->pages[t * ppb + p].data(), ti.pages[ppb + p].data(), T * sizeof(int32_t)), 0);
      }
    }
  }
}

// Quantized pools keep their pages byte for byte at every level (a second
// quantization would stack errors), and such a block says it is lossless.
TEST(BlockFormatTest, QuantizedPagesStayExactAtLossyLevels) {
  for (const char* spec : {"codec=int4", "codec=kivi4,page=32"}) {
    Filled a = Make(spec, 256, 64, 0);
    auto image = a.m->ExportSequence(a.seq);
    ASSERT_TRUE(image.ok());
    auto b = RoundTrip(a, *image, 0, StorageLevel::kLow);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->level, StorageLevel::kLossless) << spec;
    for (int t = 0; t < b->tables; ++t) {
      for (int p = 0; p < b->pages_per_table; ++p) {
        const auto& want = image->tables[t].pages[p];
        const auto& got = b->pages[t * b->pages_per_table + p];
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << spec << " table " << t << " page " << p;
      }
    }
  }
}

// A lossy block is a miss (NotFound, a sound block) for a reader that
// accepts only more faithful ones: a lossless reader is never served one.
TEST(BlockFormatTest, ALossyBlockIsAMissForAMoreFaithfulReader) {
  Filled a = Make("codec=f16", 64, 32, 0);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  auto e = EncodeBlock(a.space, 0, *image, 1, {.level = StorageLevel::kMedium});
  ASSERT_TRUE(e.ok());
  BlockRequest q = Request(a, 0, 1);
  for (StorageLevel accepts : kAllStorageLevels) {
    q.accepts = accepts;
    EXPECT_EQ(DecodeBlock(Bytes(e->bytes), q).status().code(),
              AcceptsLevel(accepts, StorageLevel::kMedium) ? StatusCode::kOk : StatusCode::kNotFound)
        << StorageLevelName(accepts);
  }
}

// The header and payload checksums over `bytes` recomputed (a block damaged
// behind valid checksums: what only the payload's own checks can catch).
void Rechecksum(std::string& bytes) {
  const uint64_t payload = XXH3_64bits(bytes.data() + kBlockHeaderBytes, bytes.size() - kBlockHeaderBytes);
  std::memcpy(bytes.data() + kBlockHeaderBytes - 16, &payload, 8);
  const uint64_t header = XXH3_64bits(bytes.data(), kBlockHeaderBytes - 8);
  std::memcpy(bytes.data() + kBlockHeaderBytes - 8, &header, 8);
}

// A damaged lossy block is DataLoss: any flipped bit (the checksums), a
// damaged zstd frame behind valid checksums (zstd's error), a coded table
// off its grid behind valid checksums (the storage codec's checks).
TEST(BlockFormatTest, ADamagedLossyBlockIsDataLoss) {
  Filled a = Make("codec=f16", 32, 16, 0, KVLayout{2, 1, 32, 8});
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  auto e = EncodeBlock(a.space, 0, *image, 1, {.level = StorageLevel::kLow});
  ASSERT_TRUE(e.ok());
  BlockRequest q = Request(a, 0, 1);
  q.accepts = StorageLevel::kLow;
  auto good = DecodeBlock(Bytes(e->bytes), q);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  for (size_t i = 0; i < e->bytes.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string bad = e->bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      ASSERT_EQ(DecodeBlock(Bytes(bad), q).status().code(), StatusCode::kDataLoss) << "byte " << i << " bit " << bit;
    }
  }
  std::string bad = e->bytes;
  for (size_t i = kBlockHeaderBytes + 4; i < bad.size(); i += 7) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  Rechecksum(bad);
  auto zstd_damaged = DecodeBlock(Bytes(bad), q);
  EXPECT_EQ(zstd_damaged.status().code(), StatusCode::kDataLoss) << zstd_damaged.status().ToString();
  // Off the grid: the first coded tensor's bit width set to 0, reframed.
  std::vector<uint8_t> payload = good->payload;
  payload[good->coded[0].data() - good->payload.data()] = 0;
  auto reframed = FrameBlock(*good, std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
                             {.compress = true});
  ASSERT_TRUE(reframed.ok());
  auto off_grid = DecodeBlock(Bytes(*reframed), q);
  EXPECT_EQ(off_grid.status().code(), StatusCode::kDataLoss) << off_grid.status().ToString();
}

// A sound block of format version 1 (96-byte header, no storage level) is
// another version: Unimplemented, which the store takes as a miss.
// A sound block of format version 1 (96-byte header, no storage level) or
// 2 (104 bytes, no transform digest) is another version: Unimplemented,
// which the store takes as a miss.
TEST(BlockFormatTest, OlderVersionBlocksAreAnotherVersion) {
  Filled a = Make("codec=f16", 64, 32, 0);
  size_t unused = 0;
  std::string block;
  ASSERT_TRUE(RoundTrip(a, *a.m->ExportSequence(a.seq), 1, StorageLevel::kLossless, &unused, &block).ok());
  for (uint32_t version : {1u, 2u}) {
    std::string old = testing::OlderVersionBlock(block, version);
    auto d = DecodeBlock(Bytes(old), Request(a, 0, 1));
    EXPECT_EQ(d.status().code(), StatusCode::kUnimplemented) << version << ": " << d.status().ToString();
    old[20] ^= 1;  // an older header that fails its checksum is damaged
    EXPECT_EQ(DecodeBlock(Bytes(old), Request(a, 0, 1)).status().code(), StatusCode::kDataLoss) << version;
  }
}

// The compact level's transform, calibrated on s's sequence.
std::shared_ptr<const StorageTransform> TransformOf(const Filled& s) {
  TransformCalibration calibration(s.space.layout, s.space.layers);
  auto image = s.m->ExportSequence(s.seq);
  EXPECT_TRUE(image.ok() && calibration.Add(*image).ok());
  auto t = calibration.Finish();
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::make_shared<const StorageTransform>(std::move(*t));
}

// A compact block decodes only with the transform that coded it: another
// transform (another calibration, model or layout) or none is a miss
// (NotFound), never a decoding with the wrong basis; writing one needs a
// transform. The block is smaller than at `low`.
TEST(BlockFormatTest, ACompactBlockDecodesOnlyWithItsTransform) {
  Filled a = Make("codec=f16", 128, 64, 0);
  Filled other = Make("codec=f16", 192, 64, 0);  // more tokens: another calibration
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(EncodeBlock(a.space, 0, *image, 0, {.level = StorageLevel::kCompact}).status().code(),
            StatusCode::kInvalidArgument);
  a.space.transform = TransformOf(a);
  auto compact = EncodeBlock(a.space, 0, *image, 0, {.level = StorageLevel::kCompact});
  ASSERT_TRUE(compact.ok()) << compact.status().ToString();
  auto low = EncodeBlock(a.space, 0, *image, 0, {.level = StorageLevel::kLow});
  ASSERT_TRUE(low.ok());
  EXPECT_LT(compact->bytes.size(), low->bytes.size());
  BlockRequest q = Request(a, 0, 0);
  q.accepts = StorageLevel::kCompact;
  auto b = DecodeBlock(Bytes(compact->bytes), q);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->level, StorageLevel::kCompact);
  q.accepts = StorageLevel::kLow;
  EXPECT_EQ(DecodeBlock(Bytes(compact->bytes), q).status().code(), StatusCode::kNotFound) << "a lossier level";
  q.accepts = StorageLevel::kCompact;
  Filled& reader = other;
  reader.space.transform = TransformOf(other);
  BlockRequest other_q = q;
  other_q.space = &reader.space;
  auto mismatch = DecodeBlock(Bytes(compact->bytes), other_q);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kNotFound) << mismatch.status().ToString();
  reader.space.transform = nullptr;
  EXPECT_EQ(DecodeBlock(Bytes(compact->bytes), other_q).status().code(), StatusCode::kNotFound);
}

// A damaged compact block is DataLoss wherever the bit flips.
TEST(BlockFormatTest, ADamagedCompactBlockIsDataLoss) {
  Filled a = Make("codec=f16", 64, 16, 0, KVLayout{2, 1, 32, 8});
  a.space.transform = TransformOf(a);
  auto image = a.m->ExportSequence(a.seq);
  ASSERT_TRUE(image.ok());
  auto e = EncodeBlock(a.space, 0, *image, 1, {.level = StorageLevel::kCompact});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  BlockRequest q = Request(a, 0, 1);
  q.accepts = StorageLevel::kCompact;
  ASSERT_TRUE(DecodeBlock(Bytes(e->bytes), q).ok());
  for (size_t i = 0; i < e->bytes.size(); ++i) {
    std::string bad = e->bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    ASSERT_EQ(DecodeBlock(Bytes(bad), q).status().code(), StatusCode::kDataLoss) << "byte " << i;
  }
}

}  // namespace
}  // namespace kvx::kv::tier
