#include "support/test_data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "support/run_command.h"

namespace kvx::testing {

static bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string SharedDir() {
  const char* env = std::getenv("KVX_SHARED");
  std::string dir = env != nullptr ? env : KVX_SHARED_DIR_DEFAULT;
  return IsDir(dir + "/models") ? dir : "";
}

std::string SharedPath(const std::string& rel) {
  const std::string dir = SharedDir();
  return dir.empty() ? "" : dir + "/" + rel;
}

std::string BinaryDir() { return KVX_BINARY_DIR; }

std::string TempDir() {
  static std::string dir = [] {
    std::string tmpl = "/tmp/kvx_test_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    return tmpl;
  }();
  return dir;
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

std::string TinyModelFile(const std::string& file) {
  const std::string path = TempDir() + "/" + file;
  if (::access(path.c_str(), R_OK) != 0) {
    RunCommand({BinaryDir() + "/kvx", "gen-model", "--shape", "tiny", "--type", "q8_0", "-o", path});
  }
  return path;
}

}  // namespace kvx::testing
