// kvx serve: the OpenAI-compatible HTTP server (server/server.h) over a
// continuous-batching scheduler (engine/scheduler.h). Prints
// "kvx serve: listening on http://HOST:PORT" on stderr once it accepts
// connections; SIGTERM or SIGINT shut it down cleanly (in-flight requests
// finish within --shutdown-grace seconds, the rest are cancelled).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/server.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvx::tools {

using server::TransportLimits;

namespace {

struct ServeFlags {
  EngineFlags engine;
  CacheFlags cache;
  ChunkFlags chunks;
  engine::SchedulerOptions scheduler;
  server::ServerOptions server;
  int max_seqs = 16;
  std::string api_key;        // --api-key: the tenant "default"
  std::string api_keys_file;  // --api-keys: name:key lines
  std::string chat_template_file;
};

// The keys of --api-key and --api-keys, each a tenant; none: no
// authentication. Messages never hold a key.
Status GatherApiKeys(ServeFlags& flags) {
  if (!flags.api_key.empty()) flags.server.api_keys.push_back({"default", flags.api_key});
  if (!flags.api_keys_file.empty()) {
    KVX_ASSIGN_OR_RETURN(auto keys, server::ReadApiKeys(flags.api_keys_file));
    flags.server.api_keys.insert(flags.server.api_keys.end(), keys.begin(), keys.end());
  }
  if (Status st = server::CheckApiKeys(flags.server.api_keys); !st.ok()) {
    return InvalidArgument("--api-key and --api-keys: " + st.message());
  }
  // Every keyed tenant can keep its quota of sessions: the total never
  // makes one tenant's sessions evict another's.
  const int64_t all = static_cast<int64_t>(flags.server.api_keys.size()) * flags.scheduler.max_sessions;
  flags.scheduler.max_sessions_total = static_cast<int>(std::max<int64_t>(flags.scheduler.max_sessions_total, all));
  return Status::Ok();
}

Status ReadChatTemplate(ServeFlags& flags) {
  if (flags.chat_template_file.empty()) return Status::Ok();
  std::ifstream in(flags.chat_template_file, std::ios::binary);
  std::ostringstream text;
  if (!in) return NotFound("cannot read --chat-template file " + flags.chat_template_file);
  text << in.rdbuf();  // an empty file sets failbit: caught below
  flags.server.chat_template = text.str();
  if (flags.server.chat_template.empty()) {
    return InvalidArgument("--chat-template file " + flags.chat_template_file +
                           " is empty: give a Jinja chat template, or leave the flag out to use the model's");
  }
  return Status::Ok();
}

Status Serve(ServeFlags flags) {
  // Signals go to the watcher thread below, never to a worker: block them
  // before any thread starts (threads inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

  KVX_RETURN_IF_ERROR(GatherApiKeys(flags));
  KVX_RETURN_IF_ERROR(ReadChatTemplate(flags));
  if (!flags.server.session_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flags.server.session_dir, ec);
    if (ec) return InvalidArgument("cannot create --session-dir " + flags.server.session_dir + ": " + ec.message());
  }
  flags.engine.options.n_seqs = flags.max_seqs;
  flags.scheduler.max_running = flags.max_seqs;
  KVX_ASSIGN_OR_RETURN(auto engine, LoadEngine(flags.engine));
  KVX_RETURN_IF_ERROR(ApplyCacheFlags(flags.cache, *engine, &flags.scheduler));
  flags.server.chunk_repair = ApplyChunkFlags(flags.chunks, &flags.scheduler);
  KVX_ASSIGN_OR_RETURN(auto scheduler, engine::Scheduler::Create(*engine, flags.scheduler));
  if (flags.server.model_id.empty()) {
    flags.server.model_id = std::filesystem::path(flags.engine.options.model_path).stem().string();
  }
  flags.server.kv_spec = engine->kv_spec().ToString();
  KVX_ASSIGN_OR_RETURN(auto srv, server::Server::Create(*scheduler, flags.server));
  std::fprintf(stderr, "kvx serve: model %s, --kv '%s', context %d, up to %d sequences, pool %.1f MiB\n",
               flags.server.model_id.c_str(), flags.server.kv_spec.c_str(), engine->n_ctx(), flags.max_seqs,
               engine->kv_manager().spec().budget_bytes / (1024.0 * 1024.0));
  if (flags.scheduler.tiers) {
    std::string names;
    for (const auto& m : flags.scheduler.tiers->Metrics()) names += (names.empty() ? "" : " -> ") + m.name;
    std::fprintf(stderr, "kvx serve: KV tiers %s, blocks of %d tokens\n", names.c_str(),
                 flags.scheduler.tiers->block_tokens());
  }
  std::fprintf(stderr, "kvx serve: listening on http://%s:%d\n", flags.server.host.c_str(), srv->port());
  std::fflush(stderr);

  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == 0) return;
    std::fprintf(stderr, "kvx serve: %s: finishing in-flight requests, then stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    srv->Stop();
  });
  srv->Run();
  srv->Stop();
  scheduler->Shutdown(engine::ShutdownMode::kCancel);
  // The watcher waits in sigwait until a signal: when Run ended otherwise,
  // wake it (the mask blocks the signal from every other thread).
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  std::fprintf(stderr, "kvx serve: stopped\n");
  return Status::Ok();
}

}  // namespace

void RegisterServe(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, metrics, sessions)");
  AddEngineFlags(cmd, &flags->engine);
  AddCacheFlags(cmd, &flags->cache);
  cmd->add_option("--host", flags->server.host, "Address to bind (127.0.0.1: this machine only)")->capture_default_str();
  cmd->add_option("--port", flags->server.port, "Port (0: any free port, printed at start)")->capture_default_str()
      ->check(IntIn(0, 65535));
  cmd->add_option("--api-key", flags->api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health; the key is the tenant 'default'")
      ->check([](const std::string& key) {
        return key.empty() ? std::string("an empty key would let every client in: give a key, or leave --api-key "
                                         "out to serve without authentication")
                           : std::string();
      });
  cmd->add_option("--api-keys", flags->api_keys_file,
                  "File of 'name:key' lines: each key is a tenant (its sessions and cached prefixes its own)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-sessions", flags->scheduler.max_sessions,
                  "Named sessions kept per tenant (its least recently used dropped beyond)")
      ->capture_default_str()
      ->check(IntIn(0, 1 << 20));
  cmd->add_option("--chat-template", flags->chat_template_file,
                  "Jinja chat template file to use instead of the model's (checked at start like the model's)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--reuse-port", flags->server.reuse_port,
                "Let other processes listen on the same port (SO_REUSEPORT; off: a port in use is an error)");
  cmd->add_option("--max-seqs", flags->max_seqs,
                  "Sequences running at once; without a budget= in --kv the pool holds this many full contexts")
      ->capture_default_str()
      ->check(IntIn(1, 4096));
  cmd->add_option("--max-step-tokens", flags->scheduler.max_step_tokens, "Tokens per forward step (decode + prefill)")
      ->capture_default_str()
      ->check(IntIn(1, 1 << 16));
  AddChunkFlags(cmd, &flags->chunks);
  cmd->add_option("--session-dir", flags->server.session_dir,
                  "Directory for /v1/sessions/{name}/save and /restore files (off when empty)");
  cmd->add_option("--model-id", flags->server.model_id, "Model name in /v1/models (default: the file name)");
  TransportLimits& limits = flags->server.limits;
  cmd->add_option("--max-body", limits.max_body_bytes,
                  "Largest request body (bytes, or e.g. 8M), counted as it is read (Content-Length or chunked): 413 "
                  "beyond")
      ->capture_default_str()
      ->transform(ByteSizeIn(1, uint64_t{1} << 40));
  cmd->add_option("--max-connections", limits.max_connections,
                  "Client connections open at once, each with its own thread: 503 with Retry-After beyond")
      ->capture_default_str()
      ->check(IntIn(1, 16384));
  cmd->add_option("--header-timeout", limits.header_timeout_seconds,
                  "Seconds from a request's first byte to the end of its headers: 408 beyond")
      ->capture_default_str()
      ->check(NumberIn(0, 3600, true, false));
  cmd->add_option("--request-timeout", limits.request_timeout_seconds,
                  "Seconds from a request's first byte to the end of its body: 408 beyond")
      ->capture_default_str()
      ->check(NumberIn(0, 86400, true, false));
  cmd->add_option("--keep-alive-timeout", limits.keep_alive_timeout_seconds,
                  "Seconds a connection may wait idle for its next request (or its first)")
      ->capture_default_str()
      ->check(NumberIn(0, 3600, true, false));
  cmd->add_option("--shutdown-grace", flags->server.shutdown_grace_seconds,
                  "Seconds in-flight requests may finish after SIGTERM before they are cancelled")
      ->capture_default_str()
      ->check(NumberIn(0, 3600, false, false));
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(Serve(*flags)); });
}

}  // namespace kvx::tools
