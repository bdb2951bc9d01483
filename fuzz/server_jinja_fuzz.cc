// libFuzzer target for the chat-template interpreter (server/jinja.h): a
// GGUF's `tokenizer.chat_template` is code from a file anyone can publish,
// and kvx serve parses it at start and runs it on every chat request.
//
// The input is the template's source. It is parsed, then rendered on a small
// conversation (system, user, assistant, user turns; the generation prompt;
// BOS/EOS texts) under small limits, so one input runs in milliseconds and a
// hostile loop or allocation meets its limit at once.
//
// Properties checked (abort on violation), besides the sanitizers' own:
//   * Parse fails only with InvalidArgument; Render only with InvalidArgument
//     (the template refused, raise_exception) or Internal (a limit, an
//     overflow, what it cannot evaluate); never a crash, a hang or an
//     exception escaping;
//   * a rendered text is within the byte budget (the output is counted);
//   * rendering is deterministic: a second render gives the same result.
//
// Seed corpus: fuzz/corpus/server_jinja/ (real chat templates from
// src/server/testdata/chat_templates.json and the hostile cases of
// src/server/jinja_sandbox_test.cc, small).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/chat_template.h"
#include "server/jinja.h"

namespace {

using kvx::StatusCode;
using kvx::server::jinja::Limits;
using kvx::server::jinja::Template;
using kvx::server::jinja::Value;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "server_jinja_fuzz: %s\n", what);
    std::abort();
  }
}

Value::Object Conversation() {
  return kvx::server::ChatContext({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", " 2 + 2? "}},
                                  /*add_generation_prompt=*/true, "<s>", "</s>");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Value::Object context = Conversation();
  Limits limits;
  limits.max_steps = 20000;
  limits.max_bytes = 256 << 10;
  auto t = Template::Parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) {
    Check(t.status().code() == StatusCode::kInvalidArgument, "Parse failed with a code other than InvalidArgument");
    return 0;
  }
  auto first = (*t)->Render(context, limits);
  auto second = (*t)->Render(context, limits);
  Check(first.ok() == second.ok(), "two renders disagree on success");
  if (first.ok()) {
    Check(first->size() <= limits.max_bytes, "a rendered text is larger than the byte budget");
    Check(*first == *second, "two renders differ");
  } else {
    const StatusCode code = first.status().code();
    Check(code == StatusCode::kInvalidArgument || code == StatusCode::kInternal, "Render failed with an unexpected code");
    Check(first.status().message() == second.status().message(), "two renders fail differently");
  }
  return 0;
}
