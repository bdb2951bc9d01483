// RedisTier: tier blocks in a Redis (or Valkey) server shared by several kvx
// processes (`--cache-redis redis://HOST:PORT[/db]`, wired by the next
// session): a block one server wrote is a hit for every other server on the
// same Redis, model and spec. Keys are `<prefix><32 hex digits of the block
// key>` (prefix "kvx:v1:" by default, so a format change can move to v2
// beside v1), values the block format (block_format.h). Plain GET / SET /
// DEL, so a Redis Cluster (which shards by key) works unchanged.
//
// Budget: Redis keeps its own: run it with `maxmemory` and
// `maxmemory-policy allkeys-lru` (docs/tiers.md); the tier's byte and block
// counts are what this process wrote, not what Redis still holds.
//
// Faults never hang or fail the caller: connecting and every command have
// timeouts (a dead or stopped Redis costs at most connect_timeout_ms +
// command_timeout_ms per call); when a connection fails the tier is
// unavailable — Gets miss and Puts are refused at once, without touching the
// network — and reconnects at most every `retry_seconds`. A refused write
// (Redis out of memory, read-only replica) is counted and the connection
// kept. Each state change (unavailable, available again, writes refused,
// writes accepted again) logs one line. SIGPIPE from a dropped connection is
// blocked in the calling thread during commands, so it cannot kill the
// process.
//
// Thread-safety: thread-safe; each call runs its command on a connection of
// its own (taken from the idle ones, or a new one), with no lock held during
// network I/O, so a slow Redis holds up only the calls waiting for it.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kv/tier/tier.h"

struct redisContext;

namespace kvx::kv::tier {

struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
};

// Parses "redis://HOST:PORT[/db]" (HOST a name, an IPv4 address or [IPv6];
// PORT 1..65535; db 0..15 by default in Redis). InvalidArgument naming what
// is wrong and the expected form.
Result<RedisAddress> ParseRedisUrl(std::string_view url);

struct RedisTierOptions {
  std::string url;                 // redis://HOST:PORT[/db]
  int connect_timeout_ms = 200;
  int command_timeout_ms = 500;    // per command; a 5 MB value on loopback takes a few ms
  int retry_seconds = 5;           // reconnect attempts at most this often
  std::string key_prefix = "kvx:v1:";
  TierLog log = StderrTierLog();
};

class RedisTier final : public Tier {
 public:
  // InvalidArgument for a bad URL or timeouts <= 0. Never fails because
  // Redis is down: the tier starts unavailable and logs it.
  static Result<std::unique_ptr<RedisTier>> Open(RedisTierOptions options);
  ~RedisTier() override;

  std::string name() const override { return "redis " + options_.url; }
  Status Put(const BlockKey& key, std::string_view bytes) override;
  std::optional<std::string> Get(const BlockKey& key) override;
  void Erase(const BlockKey& key) override;

  // Whether the tier holds a working connection (after its last call).
  bool available() const;
  // The Redis key of a block.
  std::string RedisKey(const BlockKey& key) const { return options_.key_prefix + key.Hex(); }

 private:
  RedisTier(RedisTierOptions options, RedisAddress address);
  // A connection of this caller's own: an idle one, else a new one
  // (connected with the lock released); nullptr while Redis is unavailable
  // and the retry interval has not passed.
  redisContext* Acquire();
  // Gives back a connection that works, for the next call.
  void Release(redisContext* c);
  // Frees `c` (may be null) after an I/O error, and every idle connection
  // (the server is gone); logs the change once.
  void MarkDown(redisContext* c, const std::string& reason);
  // Logs a change of whether writes are refused.
  void SetWritesRefused(bool refused, const std::string& reason);

  const RedisTierOptions options_;
  const RedisAddress address_;
  mutable std::mutex mu_;  // the state below; never held during a command
  std::vector<redisContext*> idle_;
  bool available_ = false;
  bool down_logged_ = false;      // "unavailable" was logged and not yet "available again"
  bool writes_refused_ = false;
  std::chrono::steady_clock::time_point retry_at_{};
};

}  // namespace kvx::kv::tier
