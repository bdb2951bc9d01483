// The in-process server fixture of the server tests (server_test.cc,
// chunk_server_test.cc): HTTP on loopback over a scheduler on the tiny
// synthetic model, started per test.
#pragma once

#include "server/server.h"

#include <httplib.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/synthetic_model.h"
#include "support/test_data.h"
#include "support/raw_client.h"

namespace kvx::server {

using nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::SyntheticModelOptions o;
    o.shape = "tiny";
    path_ = ::testing::TempDir() + "/server-tiny.gguf";
    ASSERT_TRUE(model::WriteSyntheticModel(o, path_).ok());
    engine::EngineOptions eo;
    eo.model_path = path_;
    eo.kv_spec = kv::ParseKVSpec(kv_spec_).value();
    eo.n_ctx = 2048;  // room for a long stream: a client leaving must be noticed before it ends
    eo.n_seqs = max_running_;
    eo.n_threads = 2;
    auto e = engine::Engine::Load(eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    engine::SchedulerOptions so;
    so.max_running = max_running_;
    so.max_queue = max_queue_;
    so.chunk_cache_bytes = chunk_cache_bytes_;
    auto s = engine::Scheduler::Create(*engine_, so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    scheduler_ = std::move(s).value();
    ServerOptions opts;
    opts.port = 0;
    opts.model_id = "tiny";
    // A directory of this test's own: session files of earlier runs must not be found.
    opts.session_dir = kvx::testing::TempDir() + "/sessions-" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    opts.shutdown_grace_seconds = 0.5;
    opts.api_keys = api_keys_;
    opts_ = opts;
    auto srv = Server::Create(*scheduler_, opts);
    ASSERT_TRUE(srv.ok()) << srv.status().ToString();
    server_ = std::move(srv).value();
    thread_ = std::thread([this] { server_->Run(); });
    // Until the listener is up, Stop() would find nothing to stop and a test
    // that sends no request would hang in TearDown's join.
    for (int i = 0; i < 500 && !Client().Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
    if (scheduler_) scheduler_->Shutdown(engine::ShutdownMode::kCancel);
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  json Metrics() {
    auto c = Client();
    auto r = c.Get("/metrics");
    json m = json::object();
    if (!r) return m;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
      const size_t sp = line.find(' ');
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
    return m;
  }

  // A raw client (one that can hang up): connects, sends POST
  // /v1/completions with `body`; the socket, or -1.
  int PostRaw(const std::string& body) {
    const int fd = testing::ConnectLoopback(server_->port());
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (fd >= 0 && !testing::SendAll(fd, request)) {
      close(fd);
      return -1;
    }
    return fd;
  }

  std::string kv_spec_;  // set by a derived fixture's constructor
  std::vector<ApiKey> api_keys_;  // likewise
  ServerOptions opts_;   // what the server was created with
  int max_queue_ = 4096;
  int max_running_ = 8;
  uint64_t chunk_cache_bytes_ = 0;  // chunk reuse off
  std::string path_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
};


}  // namespace kvx::server
