// kvx serve with a hostile chat template in the model file (issue 36): a
// template it cannot run stops the start with exit 1 and the reason (a
// template of 5,000 nested parentheses overflowed the stack, exit 139); a
// template that fails on one request's messages fails that request with a
// 500 and the server keeps serving (an INT64_MIN // -1 killed it with
// SIGFPE). Models are the tiny synthetic one with the template written in.
#include <httplib.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "model/synthetic_model.h"
#include "server/server.h"
#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using nlohmann::json;

std::string ModelWithTemplate(const std::string& name, const std::string& chat_template) {
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  model::SyntheticModelOptions o;
  o.shape = "tiny";
  o.type = gguf::TensorType::kF32;
  o.chat_template = chat_template;
  const Status s = model::WriteSyntheticModel(o, path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

TEST(ServeChatTemplateTest, ATemplateItCannotRunStopsTheStart) {
  const std::pair<const char*, std::string> cases[] = {
      {"parentheses", "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"},
      {"endless work", "{% set l = range(3000) %}{% for i in l %}{% if l == l %}{% endif %}{% endfor %}"},
      {"a gigabyte string", "{{ 'x' * 1000000000 }}"},
      {"an unsupported construct", "{% for m in messages %}{{ m.content | wordwrap }}{% endfor %}"},
  };
  for (const auto& [name, src] : cases) {
    SCOPED_TRACE(name);
    const std::string model = ModelWithTemplate("template-start", src);
    const testing::CommandOutcome r =
        testing::RunCommand({testing::BinaryDir() + "/kvx", "serve", "-m", model, "--port", "0"}, 60);
    EXPECT_TRUE(r.exited && r.exit_code == 1) << r.Describe() << "\n" << r.output;
    EXPECT_NE(r.output.find("kvx: error: the model's chat template (tokenizer.chat_template): chat template line 1:"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("listening"), std::string::npos) << r.output;
  }
}

TEST(ServeChatTemplateTest, ARequestTheTemplateFailsOnIsA500AndTheServerKeepsServing) {
  const std::string model = ModelWithTemplate(
      "template-request",
      "{% for m in messages %}{% if m.content == 'boom' %}{{ (-9223372036854775807 - 1) // -1 }}{% endif %}"
      "{% if m.content == 'refuse' %}{{ raise_exception('no refusals please') }}{% endif %}"
      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n");
  engine::EngineOptions eo;
  eo.model_path = model;
  eo.n_ctx = 256;
  eo.n_seqs = 2;
  eo.n_threads = 1;
  auto engine = engine::Engine::Load(eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto scheduler = engine::Scheduler::Create(**engine, engine::SchedulerOptions{});
  ASSERT_TRUE(scheduler.ok()) << scheduler.status().ToString();
  server::ServerOptions so;
  so.port = 0;
  auto srv = server::Server::Create(**scheduler, so);
  ASSERT_TRUE(srv.ok()) << srv.status().ToString();
  std::thread loop([&] { (*srv)->Run(); });
  httplib::Client c("127.0.0.1", (*srv)->port());
  c.set_read_timeout(60, 0);
  auto chat = [&](const std::string& content) {
    const json body = {{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 2}};
    return c.Post("/v1/chat/completions", body.dump(), "application/json");
  };
  for (int round = 0; round < 2; ++round) {
    auto boom = chat("boom");
    ASSERT_TRUE(boom);
    EXPECT_EQ(boom->status, 500);
    const json e = json::parse(boom->body, nullptr, false);
    EXPECT_EQ(e["error"]["type"], "server_error") << boom->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("integer overflow"), std::string::npos) << boom->body;
    auto refused = chat("refuse");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400);
    EXPECT_NE(refused->body.find("no refusals please"), std::string::npos) << refused->body;
    auto fine = chat("hello");
    ASSERT_TRUE(fine);
    EXPECT_EQ(fine->status, 200) << fine->body;
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  (*srv)->Stop();
  loop.join();
  (*scheduler)->Shutdown(engine::ShutdownMode::kCancel);
}

}  // namespace
}  // namespace kvx
