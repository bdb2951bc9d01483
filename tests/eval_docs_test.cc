// The eval documents are data, rendered: docs/results/eval-*/report.md and
// its SVGs are what `kvx eval --render` draws from the report.json committed
// beside them, and docs/eval.md's results section is what
// scripts/eval_report.py writes from those JSON files. These tests re-render
// (no model runs: about a second) and fail on any difference, so a change to
// the renderer or a hand edit of a document cannot go unnoticed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "eval/report.h"
#include "support/test_data.h"

namespace kvx {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> CommittedReports() {
  std::vector<std::string> out;
  const std::string dir = std::string(KVX_SOURCE_DIR) + "/docs/results";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("eval-", 0) == 0 && std::filesystem::exists(e.path() / "report.json")) {
      out.push_back((e.path() / "report.json").string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ReportFromJson reads back everything ReportToJson wrote, so a committed
// report re-renders from its JSON alone.
TEST(EvalDocsTest, CommittedReportsRoundTripThroughJson) {
  const std::vector<std::string> reports = CommittedReports();
  ASSERT_FALSE(reports.empty());
  for (const std::string& path : reports) {
    SCOPED_TRACE(path);
    const std::string text = ReadAll(path);
    auto report = eval::ReportFromJsonText(text);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    const std::string again = eval::ReportToJsonText(*report);
    if (again != text) {
      const std::string diff = nlohmann::json::diff(nlohmann::json::parse(text), nlohmann::json::parse(again)).dump();
      ADD_FAILURE() << "written back differently (JSON patch from the committed file): " << diff.substr(0, 1500);
    }
  }
  EXPECT_FALSE(eval::ReportFromJsonText("{").ok());
  EXPECT_FALSE(eval::ReportFromJsonText("{\"schema\": \"other\"}").ok());
  auto missing = eval::ReportFromJsonText("{\"schema\": \"kvx.eval/1\", \"complete\": true}");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("malformed"), std::string::npos) << missing.status().message();
}

TEST(EvalDocsTest, DocumentsAreWhatTheirJsonRenders) {
  if (std::system("python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  const std::string cmd = "python3 " + std::string(KVX_SOURCE_DIR) + "/scripts/eval_report.py --check --kvx " +
                          testing::BinaryDir() + "/kvx 2>&1";
  std::string output;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) output.append(buf.data(), n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
}

}  // namespace
}  // namespace kvx
