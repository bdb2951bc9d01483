#include "kv/kv_spec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <utility>

#include "kv/resolved_spec.h"
#include "kv/sequence_kv.h"
#include "support/test_data.h"

namespace kvx::kv {

// Readable gtest failure messages.
void PrintTo(const CodecConfig& c, std::ostream* os) { *os << c.ToString(); }
void PrintTo(const KVSpec& s, std::ostream* os) { *os << s.ToString(); }

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

// A codec named alone takes its setting (DefaultsOf) for every key it does
// not name; a spec naming any of page, group, residual, rotate or prerope
// keeps the per-key defaults, so every canonical form (it names page) means
// what it meant when written.
TEST(KVSpecTest, CodecDefaultsApplyToACodecNamedAlone) {
  EXPECT_EQ(MustParse("codec=kivi2").ToString(), "codec=kivi2,page=128,group=64,residual=0,rotate=hadamard,prerope=1");
  EXPECT_EQ(MustParse("codec=kivi4;policy=snapkv,ratio=0.5").ToString(),
            "codec=kivi4,page=128,group=64,residual=0,rotate=hadamard,prerope=1;policy=snapkv,ratio=0.5");
  for (const char* named : {"codec=kivi2,page=16", "codec=kivi2,rotate=none", "codec=kivi2,prerope=0",
                            "codec=kivi2,residual=32", "codec=kivi2,group=32"}) {
    const KVSpec s = MustParse(named);
    EXPECT_EQ(s.page_tokens, 16) << named;
    EXPECT_EQ(s.codec.EffectiveGroup(), 32) << named;
    EXPECT_EQ(s.codec.EffectiveResidual(), 32) << named;
    EXPECT_EQ(s.codec.rotation, Rotation::kNone) << named;
    EXPECT_FALSE(s.codec.pre_rope) << named;
  }
  EXPECT_EQ(MustParse("codec=int4").ToString(), "codec=int4,page=16,rotate=hadamard");
  EXPECT_EQ(MustParse("codec=int2").ToString(), "codec=int2,page=16,clip=1");
  for (const char* other : {"codec=int8", "codec=f16"}) {
    EXPECT_EQ(MustParse(other).ToString(), std::string(other) + ",page=16") << other;
  }
  // Keys outside the five keep the setting (codec=int4,sym=1 is rotated).
  EXPECT_EQ(MustParse("codec=int4,sym=1").ToString(), "codec=int4,page=16,sym=1,rotate=hadamard");
  EXPECT_EQ(MustParse("codec=int2,outliers=0.01").ToString(), "codec=int2,page=16,clip=1,outliers=0.01");
  for (const char* s : {"codec=kivi2", "codec=kivi4", "codec=int4", "codec=int2", "codec=kivi2,page=16",
                        "codec=kivi2,rotate=none"}) {
    EXPECT_EQ(MustParse(MustParse(s).ToString()), MustParse(s)) << s;
  }
  // Issue 41: kivi2 at its defaults is at least 6x smaller than f16 (the
  // recall model's shape, 4096 tokens).
  const KVLayout recall{.n_layers = 8, .n_kv_heads = 2, .head_dim = 64, .page_tokens = 16};
  auto bytes = [&](const char* spec) {
    const ResolvedKVSpec r = ResolveKVSpec(MustParse(spec), recall, 4096, 1).value();
    return static_cast<double>(BytesForContext(r.layout, r.layers, 4096));
  };
  EXPECT_GE(bytes("codec=f16") / bytes("codec=kivi2"), 6.0);
}

// The settings a bare codec meant before its defaults changed stay
// expressible, and their canonical forms are the ones stored reports hold
// (scripts/pin_default_specs.py rewrites bare strings into these).
TEST(KVSpecTest, ExplicitOldSettingsRoundTrip) {
  const std::pair<const char*, const char*> old_settings[] = {
      {"codec=int4,rotate=none", "codec=int4,page=16"},
      {"codec=int2,clip=0", "codec=int2,page=16"},
      {"codec=int2,sym=1,clip=0", "codec=int2,page=16,sym=1"},
      {"codec=int4,sym=1,rotate=none;policy=snapkv,ratio=0.5", "codec=int4,page=16,sym=1;policy=snapkv,ratio=0.5"},
      {"codec=kivi4,page=128,group=64,residual=0,prerope=1", "codec=kivi4,page=128,group=64,residual=0,prerope=1"},
  };
  for (const auto& [pinned, canonical] : old_settings) {
    const KVSpec s = MustParse(pinned);
    EXPECT_EQ(s.ToString(), canonical) << pinned;
    EXPECT_EQ(MustParse(s.ToString()), s) << pinned;
    EXPECT_EQ(MustParse(canonical), s) << pinned;
  }
}

// A policy that prunes key channels (think) takes a codec's defaults without
// the ones that mix key channels; named explicitly they stay (and ThinK's
// CheckSpec refuses them: think_test.cc).
TEST(KVSpecTest, KeyChannelPruningDropsDefaultKeyMixing) {
  const KVSpec int4 = MustParse("codec=int4;policy=think,lambda=0.5");
  EXPECT_EQ(int4.codec.rotation, Rotation::kNone);
  EXPECT_EQ(int4.ToString(), "codec=int4,page=16;policy=think,lambda=0.5");
  EXPECT_EQ(MustParse(int4.ToString()), int4);
  const KVSpec kivi2 = MustParse("codec=kivi2;policy=snapkv,ratio=0.5;policy=think");
  EXPECT_EQ(kivi2.codec.rotation, Rotation::kNone);
  EXPECT_FALSE(kivi2.codec.pre_rope);
  EXPECT_EQ(kivi2.page_tokens, 128);  // the rest of the setting stays
  EXPECT_EQ(MustParse("codec=int4;policy=snapkv,ratio=0.5").codec.rotation, Rotation::kHadamard);
  EXPECT_EQ(MustParse("codec=int4,rotate=hadamard;policy=think").codec.rotation, Rotation::kHadamard);
  EXPECT_TRUE(MustParse("codec=kivi4,page=128,prerope=1;policy=think").codec.pre_rope);
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

TEST(KVSpecTest, QuantizationKeys) {
  KVSpec s = MustParse("codec=kivi2,page=128,group=64,residual=64,sinks=4,outliers=1%,rotate=hadamard,prerope=1");
  EXPECT_EQ(s.codec.id, CodecId::kKivi2);
  EXPECT_EQ(s.page_tokens, 128);
  EXPECT_EQ(s.codec.group, 64);
  EXPECT_EQ(s.codec.residual, 64);
  EXPECT_EQ(s.codec.sinks, 4);
  EXPECT_DOUBLE_EQ(s.codec.outliers, 0.01);
  EXPECT_EQ(s.codec.rotation, Rotation::kHadamard);
  EXPECT_TRUE(s.codec.pre_rope);
  EXPECT_EQ(s.ToString(),
            "codec=kivi2,page=128,group=64,residual=64,sinks=4,rotate=hadamard,prerope=1,outliers=0.01");
  EXPECT_EQ(MustParse(s.ToString()), s);

  KVSpec b = MustParse("codec=int4,bits=k8v4,bits.0=k16v16,bits.2-3=2,rotate=none;budget=1M");
  EXPECT_EQ(b.codec.k_bits, 8);
  EXPECT_EQ(b.codec.v_bits, 4);
  ASSERT_EQ(b.codec.layer_bits.size(), 2u);
  EXPECT_EQ(b.codec.layer_bits[0], (LayerBits{0, 0, 16, 16}));
  EXPECT_EQ(b.codec.layer_bits[1], (LayerBits{2, 3, 2, 2}));
  EXPECT_EQ(b.ToString(), "codec=int4,page=16,bits=k8v4,bits.0=k16v16,bits.2-3=k2v2,budget=1MiB");
  EXPECT_EQ(MustParse(b.ToString()), b);

  // Any codec may rotate or cache pre-RoPE keys; defaults print nothing.
  EXPECT_EQ(MustParse("codec=f16,rotate=none,prerope=0").ToString(), "codec=f16,page=16");
  EXPECT_TRUE(MustParse("codec=f32,prerope=true").codec.pre_rope);
  EXPECT_EQ(MustParse("codec=int8").ToString(), "codec=int8,page=16");  // others: CodecDefaultsApply...
  EXPECT_EQ(KVSpec{}.codec, CodecId::kF16);  // a CodecId is a complete config
  EXPECT_EQ(MustParse("codec=kivi4,page=32").codec.EffectiveResidual(), CodecConfig::kDefaultKiviResidual);
  EXPECT_EQ(MustParse("codec=int4").codec.EffectiveResidual(), 0);
  EXPECT_EQ(MustParse("codec=int4,outliers=0.005,page=16").codec.ToString(), "codec=int4,outliers=0.005");
  EXPECT_EQ(MustParse("codec=int4,sym=1,group=64").ToString(), "codec=int4,page=16,group=64,sym=1");
  ExpectError("codec=f16,sym=1", {"'sym' needs a quantized codec"});
}

TEST(KVSpecTest, ValidateAgainstLayout) {
  const KVLayout probe{6, 2, 64, 16};
  EXPECT_TRUE(ValidateKVSpec(MustParse("codec=kivi2,bits.5=k4v4"), probe).ok());
  Status s = ValidateKVSpec(MustParse("codec=int4,bits.6=k8v8"), probe);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("6 layers"), std::string::npos) << s.message();
  s = ValidateKVSpec(MustParse("codec=int8"), KVLayout{2, 2, 12, 16});
  EXPECT_NE(s.message().find("head_dim % 8"), std::string::npos) << s.message();
  EXPECT_TRUE(ValidateKVSpec(MustParse("codec=f16"), KVLayout{2, 2, 12, 16}).ok());
  // KIVI packs each key channel's codes over the page into whole bytes.
  s = ValidateKVSpec(MustParse("codec=kivi2,page=2"), KVLayout{2, 2, 64, 2});
  EXPECT_NE(s.message().find("at least 4 tokens per page"), std::string::npos) << s.message();
  EXPECT_TRUE(ValidateKVSpec(MustParse("codec=kivi2,page=4"), KVLayout{2, 2, 64, 4}).ok());
}

TEST(KVSpecTest, Errors) {
  ExpectError("codec=int3", {"unknown --kv codec 'int3'", "f32, f16, int8, int4, int2, kivi4, kivi2"});
  ExpectError("codec=", {"missing value"});
  ExpectError("colour=blue", {"unknown --kv key 'colour'", "codec, page, budget, bits"});
  ExpectError("codec=f16,policy=h2o,ratio=0.5,policy=tova", {"a second policy="});  // unknown names: ResolveKVSpec
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
  ExpectError("codec=f16,residual=32", {"'residual' needs a quantized codec"});
  ExpectError("bits=k4v4", {"'bits' needs a quantized codec", "codec is f16"});
  ExpectError("codec=int4,bits=k3v4", {"kXvY"});
  ExpectError("codec=int4,bits=16", {"kXvY"});
  ExpectError("codec=int4,bits.x=k4v4", {"bits.3=k8v4"});
  ExpectError("codec=int4,bits.3-1=k4v4", {"layer or range"});
  ExpectError("codec=int4,bits.2=k16v4", {"k16v16"});
  ExpectError("codec=int4,bits.0-3=k8v8,bits.3=k2v2", {"overlap at layer 3"});
  ExpectError("codec=int4,bits.1=k8v8,bits.1=k8v8", {"duplicate"});
  ExpectError("codec=int4,group=12", {"power of two in 8..1024"});
  ExpectError("codec=int4,group=4", {"power of two"});
  ExpectError("codec=int4,outliers=0.6", {"[0, 0.5)"});
  ExpectError("codec=int4,outliers=-1", {"[0, 0.5)"});
  ExpectError("codec=int4,outliers=abc", {"fraction"});
  ExpectError("codec=int4,residual=-3", {"token count"});
  ExpectError("rotate=walsh", {"none, hadamard or values"});
  EXPECT_EQ(MustParse("codec=int4,rotate=values").codec.rotation, Rotation::kValues);
  EXPECT_EQ(MustParse("rotate=values").ToString(), "codec=f16,page=16,rotate=values");
  ExpectError("prerope=maybe", {"0 or 1"});
}

}  // namespace
}  // namespace kvx::kv

namespace kvx::kv {
namespace {

TEST(KVSpecPolicyTest, PolicyGroupsKeepTheirOwnKeys) {
  auto s = ParseKVSpec("codec=int8,budget=64M; policy=StreamingLLM, sinks=4, window=1020 ;policy=other,budget=512");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->policies.size(), 2u);
  EXPECT_EQ(s->policies[0].name, "streamingllm");
  EXPECT_EQ(s->policies[0].params.at("window"), "1020");
  EXPECT_EQ(s->policies[1].params.at("budget"), "512");  // the policy's budget, not the pool's
  EXPECT_EQ(s->budget_bytes, 64u << 20);
  auto again = ParseKVSpec(s->ToString());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *s);
  EXPECT_FALSE(ParseKVSpec("codec=f16,policy=snapkv,ratio=0.5,policy=h2o").ok());  // one policy per group
  EXPECT_FALSE(ParseKVSpec("policy=").ok());
  EXPECT_FALSE(ParseKVSpec("policy=x,window").ok());
  EXPECT_FALSE(ParseKVSpec("policy=x,a=1,a=2").ok());
}

TEST(KVSpecPolicyTest, PolicyInsideAGroupOpensThePolicyGroup) {
  // The issue's example: policy= inside the codec group takes every key after it.
  auto s = ParseKVSpec("codec=kivi4,policy=snapkv,ratio=0.75,window=32");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->codec.id, CodecId::kKivi4);
  ASSERT_EQ(s->policies.size(), 1u);
  EXPECT_EQ(s->policies[0].name, "snapkv");
  EXPECT_EQ(s->policies[0].params, (std::map<std::string, std::string, std::less<>>{{"ratio", "0.75"}, {"window", "32"}}));
  // Keys before policy= stay the codec's; sinks after it are the policy's.
  auto t = ParseKVSpec("codec=int4,sinks=16,policy=h2o,sinks=4;page=32");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->codec.sinks, 16);
  EXPECT_EQ(t->page_tokens, 32);
  EXPECT_EQ(t->policies[0].params.at("sinks"), "4");
  // Same as the ';' form, and the canonical form round-trips.
  EXPECT_EQ(*s, *ParseKVSpec("codec=kivi4;policy=snapkv,ratio=0.75,window=32"));
  EXPECT_EQ(*ParseKVSpec(s->ToString()), *s);
}

// --kv @FILE: the spec a kvx tune file holds, checked; every bad file is an
// error naming it.
class KVSpecFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = testing::TempDir() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  void ExpectError(const std::string& arg, std::initializer_list<std::string_view> needles) {
    const Result<std::string> r = ExpandKVSpecArg(arg);
    ASSERT_FALSE(r.ok()) << arg;
    for (std::string_view n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
  }
};

TEST_F(KVSpecFileTest, AFileGivesItsSpecAndTextStaysText) {
  EXPECT_EQ(ExpandKVSpecArg("codec=kivi2,page=128").value(), "codec=kivi2,page=128");
  EXPECT_EQ(ExpandKVSpecArg("").value(), "");
  const std::string spec = "codec=kivi4,page=32;policy=snapkv,pool=max,ratio=0.5";
  const std::string path = Write("tuned.json", R"({"spec": ")" + spec + R"(", "about": {"model": "m.gguf"}})");
  const Result<std::string> r = ExpandKVSpecArg("@" + path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, spec);
}

TEST_F(KVSpecFileTest, BadFilesAreErrorsNamingTheFile) {
  ExpectError("@", {"needs a file name"});
  ExpectError("@" + testing::TempDir() + "/no_such_tune.json", {"no_such_tune.json", "No such file"});
  ExpectError("@" + Write("malformed.json", "{\"spec\": "), {"malformed.json", "not valid JSON"});
  ExpectError("@" + Write("nospec.json", "{\"kvx_tune\": 1}"), {"nospec.json", "no string member \"spec\""});
  ExpectError("@" + Write("array.json", "[\"codec=f16\"]"), {"array.json", "no string member"});
  ExpectError("@" + Write("number.json", "{\"spec\": 3}"), {"number.json", "no string member"});
  ExpectError("@" + Write("badspec.json", "{\"spec\": \"codec=zz\"}"), {"badspec.json", "does not parse", "zz"});
  ExpectError("@" + Write("chain.json", "{\"spec\": \"@other.json\"}"), {"chain.json", "another file"});
}

}  // namespace
}  // namespace kvx::kv
