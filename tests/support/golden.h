// Readers for llama.cpp's golden outputs (../shared/golden and
// tests/data/golden) shared by the golden tests.
#pragma once

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_data.h"

namespace kvx::testing {

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

// The running perplexities "[1]53.9465,[2]64.3953,..." llama-perplexity
// printed, from one of ../shared/golden/perplexity_logs/*.log.
inline std::vector<double> RunningPplFromLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  static const std::regex kChunk(R"(\[(\d+)\]([0-9]+\.[0-9]+),)");
  std::vector<double> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kChunk); it != std::sregex_iterator(); ++it) {
    if (std::stoi((*it)[1]) != static_cast<int>(out.size()) + 1) break;  // only the first run of [i] values
    out.push_back(std::stod((*it)[2]));
  }
  return out;
}

// Golden files committed with the repository (made by scripts/llamacpp_goldens.py).
inline std::string RepoGoldenPath(const std::string& name) {
  return std::string(KVX_SOURCE_DIR) + "/tests/data/golden/" + name;
}

}  // namespace kvx::testing
