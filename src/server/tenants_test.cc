#include "server/tenants.h"

#include <gtest/gtest.h>

#include <fstream>

namespace kvx::server {
namespace {

TEST(TenantsTest, WithoutKeysTheUserIsTheTenant) {
  const Tenants open({});
  EXPECT_FALSE(open.keyed());
  const Tenant alice = open.Identify("", "alice").value();
  EXPECT_EQ(alice.name, "alice");
  EXPECT_NE(alice.salt, 0u);
  EXPECT_EQ(open.Identify("Bearer whatever", "alice")->salt, alice.salt);
  EXPECT_NE(open.Identify("", "bob")->salt, alice.salt);
  EXPECT_EQ(open.Identify("", "")->salt, 0u);  // the nameless tenant
}

TEST(TenantsTest, WithKeysTheKeyIsTheTenantWhateverTheUser) {
  const Tenants keyed({{"alice", "key-a"}, {"bob", "key-b"}});
  EXPECT_TRUE(keyed.keyed());
  const Tenant a = keyed.Identify("Bearer key-a", "bob").value();
  EXPECT_EQ(a.name, "alice");
  EXPECT_EQ(a.salt, TenantSalt("alice"));
  EXPECT_EQ(keyed.Identify("Bearer key-b", "alice")->name, "bob");
  for (const char* wrong : {"", "key-a", "Bearer ", "Bearer key-", "Bearer key-aa", "Bearer KEY-A", "bearer key-a"}) {
    EXPECT_FALSE(keyed.Identify(wrong, "alice")) << wrong;
  }
}

TEST(TenantsTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0", 2), "a"));
}

// A key file: name:key lines; malformed lines, empty keys and duplicates are
// refused naming the line, never the key.
TEST(TenantsTest, KeyFile) {
  const std::string path = ::testing::TempDir() + "/tenants-keys.txt";
  auto read = [&](const std::string& text) {
    std::ofstream(path) << text;
    return ReadApiKeys(path);
  };
  auto keys = read("# tenants\nalice:s3cret-a\n\nbob:s3cret:b\r\n");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].tenant, "alice");
  EXPECT_EQ((*keys)[0].key, "s3cret-a");
  EXPECT_EQ((*keys)[1].key, "s3cret:b");  // the first ':' ends the name
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& bad : {Bad{"alice:s3cret-a\nbob-without-key\n", "line 2: expected 'name:key'"},
                         Bad{"alice:\n", "line 1: the API key of tenant 'alice' is empty"},
                         Bad{":s3cret-a\n", "line 1: tenant name '' must be"},
                         Bad{"alice:s3cret-a\nalice:s3cret-b\n", "line 2: tenant 'alice' is given two keys"},
                         Bad{"alice:s3cret-a\nbob:s3cret-a\n", "line 2: tenant 'bob' has the same key"},
                         Bad{"# nothing\n", "holds no 'name:key' line"}}) {
    auto r = read(bad.text);
    ASSERT_FALSE(r.ok()) << bad.text;
    EXPECT_NE(r.status().message().find(bad.says), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << "a key in: " << r.status().message();
  }
  EXPECT_EQ(ReadApiKeys(::testing::TempDir() + "/no-such-keys").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvx::server
