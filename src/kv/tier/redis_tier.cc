#include "kv/tier/redis_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <cctype>
#include <charconv>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace kvx::kv::tier {
namespace {

// Blocks SIGPIPE in this thread while a command writes to a socket Redis may
// have closed, and swallows the SIGPIPE that write raised (unless one was
// already pending before): the write then fails with EPIPE, which hiredis
// reports as an I/O error, instead of the signal killing the process.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// Runs one command with binary-safe arguments, SIGPIPE blocked; nullptr on
// an I/O error (c->errstr says which).
Reply Run(redisContext* c, std::initializer_list<std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  ScopedSigpipeBlock no_sigpipe;
  return Reply(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

timeval Millis(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

bool ParseInt(std::string_view s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

Result<RedisAddress> ParseRedisUrl(std::string_view url) {
  const std::string expected = " (expected redis://HOST:PORT[/db], e.g. redis://127.0.0.1:6379/0)";
  constexpr std::string_view kScheme = "redis://";
  if (!url.starts_with(kScheme)) return InvalidArgument("'" + std::string(url) + "' is not a redis:// URL" + expected);
  std::string_view rest = url.substr(kScheme.size());
  RedisAddress a;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (!ParseInt(rest.substr(slash + 1), 0, 999999, &a.db)) {
      return InvalidArgument("the database in '" + std::string(url) + "' must be a number" + expected);
    }
    rest = rest.substr(0, slash);
  }
  if (rest.find('@') != std::string_view::npos) {
    return InvalidArgument("credentials in a Redis URL are not supported yet ('" + std::string(url) + "')" + expected);
  }
  std::string_view host = rest, port;
  if (rest.starts_with('[')) {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return InvalidArgument("unclosed '[' in '" + std::string(url) + "'" + expected);
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) return InvalidArgument("junk after ']' in '" + std::string(url) + "'" + expected);
    port = rest.empty() ? std::string_view() : rest.substr(1);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return InvalidArgument("no host in '" + std::string(url) + "'" + expected);
  for (char c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' && c != ':') {
      return InvalidArgument("invalid character in the host of '" + std::string(url) + "'" + expected);
    }
  }
  if (rest.find(':') != std::string_view::npos && !ParseInt(port, 1, 65535, &a.port)) {
    return InvalidArgument("the port in '" + std::string(url) + "' must be 1..65535" + expected);
  }
  a.host = std::string(host);
  return a;
}

Result<std::unique_ptr<RedisTier>> RedisTier::Open(RedisTierOptions options) {
  KVX_ASSIGN_OR_RETURN(RedisAddress address, ParseRedisUrl(options.url));
  if (options.connect_timeout_ms <= 0 || options.command_timeout_ms <= 0 || options.retry_seconds < 0) {
    return InvalidArgument("the Redis tier's timeouts must be positive and its retry interval not negative");
  }
  if (!options.log) options.log = StderrTierLog();
  std::unique_ptr<RedisTier> t(new RedisTier(std::move(options), std::move(address)));
  if (redisContext* c = t->Acquire()) t->Release(c);  // logs when Redis is down; the tier retries later
  return t;
}

RedisTier::RedisTier(RedisTierOptions options, RedisAddress address)
    : options_(std::move(options)), address_(std::move(address)) {}

RedisTier::~RedisTier() {
  for (redisContext* c : idle_) redisFree(c);
}

bool RedisTier::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return available_;
}

redisContext* RedisTier::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      redisContext* c = idle_.back();
      idle_.pop_back();
      return c;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!available_) {
      if (now < retry_at_) return nullptr;
      retry_at_ = now + std::chrono::seconds(options_.retry_seconds);  // one caller tries; the others miss meanwhile
    }
  }
  // Connected with the lock released: a slow connect holds up no other call.
  redisContext* c = redisConnectWithTimeout(address_.host.c_str(), address_.port, Millis(options_.connect_timeout_ms));
  if (c == nullptr || c->err != 0) {
    const std::string reason = c == nullptr ? "out of memory" : c->errstr;
    if (c != nullptr) redisFree(c);
    MarkDown(nullptr, "cannot connect: " + reason);
    return nullptr;
  }
  redisSetTimeout(c, Millis(options_.command_timeout_ms));
  if (address_.db != 0) {
    const std::string db = std::to_string(address_.db);
    Reply r = Run(c, {"SELECT", db});
    if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
      MarkDown(c, "cannot select database " + db + ": " + (r == nullptr ? std::string(c->errstr) : std::string(r->str)));
      return nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (down_logged_) options_.log("redis tier " + options_.url + ": available again");
  down_logged_ = false;
  available_ = true;
  return c;
}

void RedisTier::Release(redisContext* c) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(c);
}

void RedisTier::MarkDown(redisContext* c, const std::string& reason) {
  if (c != nullptr) redisFree(c);
  std::lock_guard<std::mutex> lock(mu_);
  for (redisContext* idle : idle_) redisFree(idle);  // the server went away: they are dead too
  idle_.clear();
  available_ = false;
  retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(options_.retry_seconds);
  if (!down_logged_) {
    options_.log("redis tier " + options_.url + ": unavailable (" + reason + "); local tiers only, retrying every " +
                 std::to_string(options_.retry_seconds) + " s");
  }
  down_logged_ = true;
}

void RedisTier::SetWritesRefused(bool refused, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (refused == writes_refused_) return;
  writes_refused_ = refused;
  options_.log("redis tier " + options_.url + (refused ? ": writes refused (" + reason + ")" : ": writes accepted again"));
}

Status RedisTier::Put(const BlockKey& key, std::string_view bytes) {
  redisContext* c = Acquire();
  if (c == nullptr) {
    Count([](TierStats& s) { ++s.errors; });
    return IoError("the Redis tier " + options_.url + " is unavailable");
  }
  Reply r = Run(c, {"SET", RedisKey(key), bytes});
  if (r == nullptr) {
    const std::string reason = c->errstr;
    MarkDown(c, reason);
    Count([](TierStats& s) { ++s.errors; });
    return IoError("the Redis tier " + options_.url + " failed: " + reason);
  }
  Release(c);
  if (r->type == REDIS_REPLY_ERROR) {  // OOM, READONLY, ...: the connection is fine
    const std::string reason(r->str, r->len);
    SetWritesRefused(true, reason);
    Count([](TierStats& s) { ++s.errors; });
    return ResourceExhausted("Redis refused the block: " + reason);
  }
  SetWritesRefused(false, "");
  Count([&](TierStats& s) {
    ++s.puts;
    ++s.blocks;
    s.bytes += bytes.size();
  });
  return Status::Ok();
}

std::optional<std::string> RedisTier::Get(const BlockKey& key) {
  redisContext* c = Acquire();
  if (c == nullptr) {
    Count([](TierStats& s) { ++s.misses; });
    return std::nullopt;
  }
  Reply r = Run(c, {"GET", RedisKey(key)});
  if (r == nullptr) {
    MarkDown(c, c->errstr);
  } else {
    Release(c);
  }
  if (r == nullptr || r->type != REDIS_REPLY_STRING) {
    const bool error = r == nullptr || r->type == REDIS_REPLY_ERROR;
    Count([&](TierStats& s) {
      ++s.misses;
      if (error) ++s.errors;
    });
    return std::nullopt;
  }
  Count([](TierStats& s) { ++s.hits; });
  return std::string(r->str, r->len);
}

void RedisTier::Erase(const BlockKey& key) {
  redisContext* c = Acquire();
  if (c == nullptr) return;
  Reply r = Run(c, {"DEL", RedisKey(key)});
  if (r == nullptr) {
    MarkDown(c, c->errstr);
  } else {
    Release(c);
  }
}

}  // namespace kvx::kv::tier
