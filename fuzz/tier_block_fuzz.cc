// libFuzzer target for the tier block format (kv/tier/block_format.h): a
// block comes from a disk file or a Redis value, so any bytes must decode to
// a block or to DataLoss / Unimplemented, never a crash, and a parsed block
// handed to ImportSequence must import or be refused (DataLoss /
// ResourceExhausted) with the manager's invariants intact.
//
// The first input byte picks the mode: odd — the rest is a whole block
// (header, checksums and all); even — the rest is a payload framed with a
// valid header (FrameBlock), so the fuzzer reaches the payload parser and the
// import behind the checksums it could never forge. Bit 2 picks an int4 or an
// f16 pool (where coded tables, the storage codec's, decode into pages).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kv/tier/block_format.h"
#include "kv/tier/tier_store.h"
#include "kv/tier/tier_test_util.h"

namespace {

using namespace kvx::kv;
using namespace kvx::kv::tier;

struct Fixture {
  explicit Fixture(const char* spec) : m(testing::MakeManager(spec, KVLayout{2, 1, 32, 8}, 64)) {}
  std::unique_ptr<KVManager> m;
  BlockSpace space = *MakeBlockSpace(m->spec(), 1, 8);
};

void Check(bool ok, kvx::StatusCode code, std::initializer_list<kvx::StatusCode> allowed) {
  if (ok) return;
  for (kvx::StatusCode c : allowed) {
    if (code == c) return;
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Bit 2 picks the pool: int4 (pages only) or f16 (the storage codec's
  // coded tables decode into it).
  static Fixture int4("codec=int4,page=8"), f16("codec=f16,page=8");
  Fixture& f = (size > 0 && (data[0] & 4) != 0) ? f16 : int4;
  if (size < 1 || size > (1 << 16)) return 0;
  std::string framed;
  std::span<const uint8_t> bytes(data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const BlockHeader h{{}, 1, f.space.spec_fingerprint, SaltDigest(0), data[0] >> 5, 8};
    framed = *FrameBlock(h, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                         {.compress = (data[0] & 2) != 0});
    bytes = {reinterpret_cast<const uint8_t*>(framed.data()), framed.size()};
  }
  auto parsed = ParseBlock(bytes);
  Check(parsed.ok(), parsed.status().code(), {kvx::StatusCode::kDataLoss, kvx::StatusCode::kUnimplemented});
  if (!parsed.ok() || parsed->index != 0) return 0;
  const kvx::Status decoded = DecodeCodedTables(f.space, *parsed);
  Check(decoded.ok(), decoded.code(), {kvx::StatusCode::kDataLoss});
  if (!decoded.ok()) return 0;
  TierLoad load;
  load.blocks.push_back(std::move(parsed).value());
  auto image = LoadImage(load, load.blocks[0].tokens, f.space, 0);
  Check(image.ok(), image.status().code(), {kvx::StatusCode::kInvalidArgument});
  if (!image.ok()) return 0;
  auto seq = f.m->ImportSequence(*image);
  Check(seq.ok(), seq.status().code(),
        {kvx::StatusCode::kDataLoss, kvx::StatusCode::kInvalidArgument, kvx::StatusCode::kResourceExhausted});
  if (!f.m->CheckInvariants().ok()) std::abort();
  if (seq.ok()) f.m->ReleaseSequence(*seq);
  return 0;
}
