// Helpers for the tier tests, benchmark and fuzzer: a manager holding one
// sequence of given tokens with pseudo-random K/V, a temporary directory, a
// redis-server of our own on a free loopback port.
// Not part of the library (header-only, no gtest, so bench/ and fuzz/ use it).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/kv_manager.h"
#include "kv/tier/block_format.h"
#include "kv/tier/redis_tier.h"

extern char** environ;

namespace kvx::kv::tier::testing {

// The smollm2-135m KV shape (30 layers, 3 kv heads, head dim 64).
inline KVLayout SmolLm2Layout() { return KVLayout{30, 3, 64, 16}; }

// A manager of `spec` over `layout`, sized for n_ctx tokens.
inline std::unique_ptr<KVManager> MakeManager(const std::string& spec, const KVLayout& layout, int n_ctx) {
  auto r = ResolveKVSpec(spec, layout, n_ctx, 2);
  if (!r.ok()) return nullptr;
  auto m = KVManager::Create(std::move(*r));
  return m.ok() ? std::move(m).value() : nullptr;
}

// Adds a sequence of tenant `salt` holding `tokens` at positions 0..n-1, in
// one step; K and V are N(0, 1) drawn from `seed` (the same seed gives the
// same cache in any manager of the same spec).
inline Result<SeqId> FillSequence(KVManager& m, uint64_t salt, std::span<const int32_t> tokens, uint32_t seed) {
  const KVLayout& l = m.spec().layout;
  const int n = static_cast<int>(tokens.size());
  const SeqId seq = m.AddSequence(salt);
  std::vector<int32_t> pos(tokens.size());
  std::iota(pos.begin(), pos.end(), 0);
  const StepRequest req{seq, tokens, pos};
  KVX_RETURN_IF_ERROR(m.BeginStep({&req, 1}));
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n) * l.n_kv_heads * l.head_dim), v(k.size());
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (float& x : k) x = g(rng);
    for (float& x : v) x = g(rng);
    Status s = m.kv(seq).Append(layer, n, pos.data(), k.data(), v.data());
    if (!s.ok()) {
      m.AbortStep();
      return s;
    }
  }
  KVX_RETURN_IF_ERROR(m.CommitStep());
  return seq;
}

// Tokens 0..n-1 shifted by `offset` (distinct prompts for distinct offsets).
// `block` (the current format) with the header of format version 1 (96
// bytes: no storage level; checksummed as version 1 wrote it) before its
// payload: what a kvx of version 1 left in a tier.
// `block` (this version's) with the header of format version 1 (96 bytes,
// no storage level) or 2 (104 bytes, no transform digest), checksummed as
// that version did.
inline std::string OlderVersionBlock(const std::string& block, uint32_t version) {
  std::string old = block.substr(0, version == 1 ? 64 : 72);  // magic .. block tokens (.. level, zero)
  std::memcpy(old.data() + 8, &version, 4);
  old += block.substr(80, 24);  // payload bytes, stored bytes, payload checksum
  const uint64_t header = XXH3_64bits(old.data(), old.size());
  old.append(reinterpret_cast<const char*>(&header), 8);
  return old + block.substr(kBlockHeaderBytes);
}
inline std::string VersionOneBlock(const std::string& block) { return OlderVersionBlock(block, 1); }

inline std::vector<int32_t> Tokens(int n, int offset = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 100 + offset);
  return t;
}

// A fresh directory under TMPDIR (or /tmp), removed with its contents when
// the object dies.
class TempDir {
 public:
  // Under `under`, else $TMPDIR, else /tmp.
  explicit TempDir(const std::string& under = "") {
    const char* env = std::getenv("TMPDIR");
    const std::string base = !under.empty() ? under : env != nullptr && *env ? env : "/tmp";
    std::string templ = base + "/kvx-tier-XXXXXX";
    path_ = ::mkdtemp(templ.data()) != nullptr ? templ : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Collects a tier's log lines (the tests count state changes).
struct LogLines {
  std::vector<std::string> lines;
  TierLog log() {
    return [this](const std::string& l) { lines.push_back(l); };
  }
};

// The redis-server on PATH, or "" when it is not installed.
inline std::string FindRedisServer() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/usr/sbin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/redis-server";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// A loopback TCP port nothing listens on right now.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// A redis-server of our own: no persistence, its files in a temporary
// directory; stopped (SIGKILL, it holds nothing) when the object dies.
class RedisServer {
 public:
  explicit RedisServer(int port = FreeLoopbackPort()) : port_(port) {}
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it and waits until it answers (up to 5 s).
  bool Start() {
    const std::string binary = FindRedisServer();
    const std::string port = std::to_string(port_), log = dir_.path() + "/redis.log";
    std::vector<std::string> args = {binary, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                     "--dir", dir_.path(), "--logfile", log, "--daemonize", "no"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
    auto tier = RedisTier::Open({.url = url(), .retry_seconds = 0, .log = [](const std::string&) {}});
    using Clock = std::chrono::steady_clock;
    for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
      (void)(*tier)->Get(BlockKey{});
      if ((*tier)->available()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void Pause() { ::kill(pid_, SIGSTOP); }
  void Resume() { ::kill(pid_, SIGCONT); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int port_;
  TempDir dir_;
  pid_t pid_ = -1;
};

}  // namespace kvx::kv::tier::testing
