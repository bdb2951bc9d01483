#include "kv/kv_spec.h"

#include <gtest/gtest.h>

namespace kvx::kv {
namespace {

KVSpec MustParse(std::string_view s) {
  auto r = ParseKVSpec(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : KVSpec{};
}

void ExpectError(std::string_view s, std::initializer_list<std::string_view> needles) {
  auto r = ParseKVSpec(s);
  ASSERT_FALSE(r.ok()) << "'" << s << "' should fail";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (std::string_view n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos) << "'" << s << "': " << r.status().message()
                                                                << " lacks '" << n << "'";
  }
}

TEST(KVSpecTest, EmptyIsDefaults) {
  EXPECT_EQ(MustParse(""), KVSpec{});
  EXPECT_EQ(MustParse("  ; , "), KVSpec{});
  EXPECT_EQ(KVSpec{}.codec, CodecId::kF16);
  EXPECT_EQ(KVSpec{}.page_tokens, 16);
  EXPECT_EQ(KVSpec{}.budget_bytes, 0u);
  EXPECT_EQ(KVSpec{}.ToString(), "codec=f16,page=16");
}

TEST(KVSpecTest, FullSpecWithGroupsAndWhitespace) {
  KVSpec s = MustParse(" codec = f32 , page=32 ; budget = 256M ");
  EXPECT_EQ(s.codec, CodecId::kF32);
  EXPECT_EQ(s.page_tokens, 32);
  EXPECT_EQ(s.budget_bytes, 256ull << 20);
  EXPECT_EQ(s.ToString(), "codec=f32,page=32,budget=256MiB");
  EXPECT_EQ(MustParse(s.ToString()), s);
  EXPECT_EQ(MustParse("codec=f16,page=16;budget=256M").budget_bytes, 256ull << 20);
}

TEST(KVSpecTest, BudgetSuffixes) {
  EXPECT_EQ(MustParse("budget=0").budget_bytes, 0u);
  EXPECT_EQ(MustParse("budget=1000").budget_bytes, 1000u);
  EXPECT_EQ(MustParse("budget=1000B").budget_bytes, 1000u);
  EXPECT_EQ(MustParse("budget=3K").budget_bytes, 3072u);
  EXPECT_EQ(MustParse("budget=3kib").budget_bytes, 3072u);
  EXPECT_EQ(MustParse("budget=2MiB").budget_bytes, 2ull << 20);
  EXPECT_EQ(MustParse("budget=2m").budget_bytes, 2ull << 20);
  EXPECT_EQ(MustParse("budget=5G").budget_bytes, 5ull << 30);
  EXPECT_EQ(MustParse("budget=5GiB").budget_bytes, 5ull << 30);
  for (uint64_t b : {1000ull, 3072ull, 2ull << 20, 5ull << 30, (5ull << 30) + 1024}) {
    KVSpec s;
    s.budget_bytes = b;
    EXPECT_EQ(MustParse(s.ToString()), s) << s.ToString();
  }
}

TEST(KVSpecTest, PageSizes) {
  for (int p : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    EXPECT_EQ(MustParse("page=" + std::to_string(p)).page_tokens, p);
  }
}

TEST(KVSpecTest, Errors) {
  ExpectError("codec=int8", {"unknown --kv codec 'int8'", "f32, f16"});
  ExpectError("codec=", {"missing value"});
  ExpectError("colour=blue", {"unknown --kv key 'colour'", "codec, page, budget"});
  ExpectError("codec=f16;policy=h2o", {"unknown --kv key 'policy'"});
  ExpectError("codec", {"expected key=value", "codec, page, budget"});
  ExpectError("codec=f16,codec=f32", {"duplicate --kv key 'codec'"});
  ExpectError("page=16;page=16", {"duplicate --kv key 'page'"});
  ExpectError("page=12", {"page=12", "power of two in 1..256"});
  ExpectError("page=0", {"power of two"});
  ExpectError("page=512", {"power of two"});
  ExpectError("page=-4", {"power of two"});
  ExpectError("page=1x", {"power of two"});
  ExpectError("page=99999999999999999999999", {"power of two"});
  ExpectError("budget=12T", {"budget=12T", "K, M, G"});
  ExpectError("budget=M", {"K, M, G"});
  ExpectError("budget=-1", {"K, M, G"});
  ExpectError("budget=1.5G", {"K, M, G"});
  ExpectError("budget=99999999999999999999", {"K, M, G"});
  ExpectError("budget=17179869184G", {"too large"});
}

}  // namespace
}  // namespace kvx::kv
