// Helpers for tests that use ../shared (real models, golden outputs).
// Tests call KVX_REQUIRE_SHARED() first: when the folder is absent they are
// skipped with a message saying where kvx looked.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvx::testing {

// The shared folder: $KVX_SHARED if set, else the path configured at build
// time (<repo>/../shared). Empty when it does not exist.
std::string SharedDir();
// SharedDir() + "/" + rel, or "" when the shared folder is absent.
std::string SharedPath(const std::string& rel);
// The build directory (to find the kvx binary).
std::string BinaryDir();
// A fresh temporary directory unique to this test process.
std::string TempDir();
// The "tiny" synthetic model (q8_0) written once per process by `kvx
// gen-model` into TempDir() as `file`; its path.
std::string TinyModelFile(const std::string& file);
// Reads one JSON object per line.
std::vector<nlohmann::json> ReadJsonLines(const std::string& path);

}  // namespace kvx::testing

#define KVX_REQUIRE_SHARED()                                                          \
  do {                                                                                \
    if (::kvx::testing::SharedDir().empty())                                          \
      GTEST_SKIP() << "shared test data not found (set KVX_SHARED or place ../shared " \
                      "beside the repository)";                                       \
  } while (0)
