// The Jinja subset against Jinja2 itself: testdata/chat_templates.json holds
// templates (ChatML, Llama 2 with raise_exception, Llama 3, Zephyr's
// whitespace-heavy one, a Qwen-style namespace() one, Phi-3's from the GGUF
// in ../shared/models/vocab, and a grab bag of filters, tests, slices and
// loop variables) with what Jinja2 3.1.6 renders for three conversations,
// with and without the generation prompt, under Hugging Face's environment
// (trim_blocks, lstrip_blocks). testdata/chat_templates_gen.py regenerates it.
#include "server/jinja.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "model/synthetic_model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "server/chat_test_util.h"
#include "support/char_tokenizer.h"

namespace kvx::server::jinja {
namespace {

Value::Object Context(const nlohmann::json& messages, bool agp) {
  std::vector<ChatMessage> list;
  for (const auto& m : messages) list.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return ChatContext(list, agp, "<s>", "</s>");
}

TEST(JinjaTest, RendersWhatJinja2Renders) {
  std::ifstream f(std::string(KVX_SOURCE_DIR) + "/src/server/testdata/chat_templates.json");
  ASSERT_TRUE(f) << "testdata missing";
  const nlohmann::json data = nlohmann::json::parse(f);
  const nlohmann::json convs = {
      {"sys_user", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "Hi"}}}},
      {"conv",
       {{{"role", "system"}, {"content", "S"}},
        {{"role", "user"}, {"content", "Hi"}},
        {{"role", "assistant"}, {"content", "Yo"}},
        {{"role", "user"}, {"content", "More"}}}},
      {"user", {{{"role", "user"}, {"content", " Hi "}}}},
  };
  int n = 0;
  for (const auto& c : data["cases"]) {
    const std::string name = c[0], conv = c[1], want = c[3];
    const bool agp = c[2];
    SCOPED_TRACE(name + " " + conv + (agp ? " +prompt" : ""));
    auto t = Template::Parse(data["templates"][name].get<std::string>());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto got = (*t)->Render(Context(convs[conv], agp));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want);
    ++n;
  }
  EXPECT_EQ(n, 48);
}

TEST(JinjaTest, RaiseExceptionRefusesWithItsMessage) {
  std::ifstream f(std::string(KVX_SOURCE_DIR) + "/src/server/testdata/chat_templates.json");
  const nlohmann::json data = nlohmann::json::parse(f);
  auto t = Template::Parse(data["templates"]["llama2"].get<std::string>());
  ASSERT_TRUE(t.ok());
  const nlohmann::json two_users = {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}};
  auto r = (*t)->Render(Context(two_users, true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Conversation roles must alternate"), std::string::npos) << r.status().ToString();
}

#define KVX_16_X "xxxxxxxxxxxxxxxx"
#define KVX_256_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X \
    KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X KVX_16_X

TEST(JinjaTest, UnsupportedConstructsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% call f() %}x{% endcall %}", "unsupported construct 'call'"},
      {"{% include 'x' %}", "unsupported construct 'include': a GGUF chat template is one string"},
      {"{% macro f(a %}x{% endmacro %}", "expected ')'"},
      {"{% macro f() %}never closed", "missing {% endmacro %}"},
      {"{{ x | wordwrap }}", "unsupported filter 'wordwrap'"},
      {"{% if x %}never closed", "missing {% endif %}"},
      {"{{ x", "never closed"},
      {"{{ 'abc }}", "never closed"},
      {"{% for x in y recursive %}{% endfor %}", "recursive"},
      {"{% set x %}block{% endset %}", "{% set %}"},
  };
  for (const auto& [src, words] : cases) {
    auto t = Template::Parse(src);
    ASSERT_FALSE(t.ok()) << src;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(words), std::string::npos) << src << ": " << t.status().ToString();
  }
  // Found only when run.
  for (const auto& [src, words] : std::vector<std::pair<const char*, const char*>>{
           {"{{ foo() }}", "unsupported function 'foo'"},
           {"{{ 'a'.zfill(3) }}", "unsupported method 'zfill'"},
           {"{{ x is prime }}", "unsupported test 'prime'"},
           {"{% set y.a = 1 %}", "not a namespace"},
           {"{{ 1 // 0 }}", "division by zero"},
           {"{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", "takes 1 argument(s), given 2"},
           {"{% macro f(a) %}{% endmacro %}{{ f(b=2) }}", "has no parameter 'b'"},
           {"{% macro f(a) %}{% endmacro %}{{ f(1, a=2) }}", "got 'a' twice"},
           {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested more than 64 calls deep"},
           // hostile templates: endless work, a huge range, exponential macro calls
           {"{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
            "its byte budget"},
           {"{% for i in range(2000000000) %}{% endfor %}", "its byte budget"},
           {"{% for i in range(-9223372036854775807, 9223372036854775807) %}{% endfor %}", "its byte budget"},
           {"{% macro a() %}" KVX_256_X "{% endmacro %}{% macro b() %}{{ a() }}{{ a() }}{{ a() }}{{ a() }}"
            "{% endmacro %}{% macro c() %}{{ b() }}{{ b() }}{{ b() }}{{ b() }}{% endmacro %}{% for i in range(1000000) %}"
            "{{ c() }}{% endfor %}", "more than 64 MiB"}}) {
    auto t = Template::Parse(src);
    ASSERT_TRUE(t.ok()) << src << ": " << t.status().ToString();
    auto r = (*t)->Render({});
    ASSERT_FALSE(r.ok()) << src;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << src << ": " << r.status().ToString();
  }
}

TEST(JinjaTest, Macros) {
  const std::pair<const char*, const char*> cases[] = {
      // positional, keyword and default arguments; the default is evaluated at the call
      {"{% macro greet(who, punct='!') %}hi {{ who }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} "
       "{{ greet(punct='.', who='c') }}",
       "hi a! hi b? hi c."},
      // the body reads the caller's variables; its own sets end with it; namespaces are shared
      {"{% set ns = namespace(n=0) %}{% macro bump(x) %}{% set local = x %}{% set ns.n = ns.n + x %}"
       "{{ prefix }}{{ local }}{% endmacro %}{% set prefix = '>' %}{{ bump(2) }}{{ bump(3) }}|{{ ns.n }}|{{ local }}|",
       ">2>3|5||"},
      // a macro's value is a string: filters and concatenation apply; macros call macros
      {"{% macro inner(x) %} {{ x }} {% endmacro %}{% macro outer(x) %}[{{ inner(x) | trim }}]{% endmacro %}"
       "{{ outer('y') ~ outer('z') }}",
       "[y][z]"},
      // defined before use, in the loop that calls it, as chat templates do
      {"{% for m in ['a', 'b'] %}{% macro show(t) %}<{{ t }}>{% endmacro %}{{ show(m) }}{% endfor %}", "<a><b>"},
  };
  for (const auto& [src, want] : cases) {
    auto t = Template::Parse(src);
    ASSERT_TRUE(t.ok()) << src << ": " << t.status().ToString();
    auto r = (*t)->Render({});
    ASSERT_TRUE(r.ok()) << src << ": " << r.status().ToString();
    EXPECT_EQ(*r, want) << src;
  }
}

TEST(JinjaTest, LineNumbersInErrors) {
  auto t = Template::Parse("line one\n{{ ok }}\n{% frobnicate %}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status().ToString();
}

// Data marks: every output byte that came from a message's content is
// marked, whatever the template does with it, and no other byte is. The
// content is made of q and z only and the templates' own text holds
// neither (in either case), so "marked" must be "is q or z".
TEST(JinjaTest, DataMarksFollowContentThroughEveryOperation) {
  const std::vector<ChatMessage> messages = {{"user", "qqzqz"}, {"assistant", "zq"}};
  const char* templates[] = {
      "{% for m in messages %}<a>{{ m.content }}</a>{% endfor %}",
      "{{ '<a>' + messages[0].content + '<b>' ~ 3 ~ messages[1].content }}",
      "{{ messages[0].content.strip('q') }}|{{ messages[0].content.lstrip('q') }}|{{ messages[0].content | trim('q') }}",
      "{{ messages[0].content[1:4] }}|{{ messages[0].content[::2] }}|{{ messages[0].content[-1] }}|{{ messages[0]['content'][::-1] }}",
      "{{ messages[0].content.upper() }}|{{ messages[0].content | capitalize }}|{{ messages[0].content | title }}|{{ messages[0].content | lower }}",
      "{{ messages[0].content.replace('z', '<x>') }}|{{ messages[0].content.replace('q', messages[1].content) }}",
      "{{ messages[0].content.split('z') | join('<j>') }}|{{ messages | length }}",
      "{{ messages[0].content * 3 }}|{{ 'ab' * 2 }}",
      "{% macro f(x) %}[{{ x }}]{% endmacro %}{{ f(messages[0].content) }}{{ f('lit') }}",
      "{% set ns = namespace(acc='') %}{% for m in messages %}{% set ns.acc = ns.acc + m.content + '|' %}{% endfor %}{{ ns.acc }}",
      "{{ messages[0].content | list | join(',') }}|{{ messages[0].content | string }}|{{ (messages[0].content | list) | last }}",
      "{{ messages[1].content if messages[0].content else 'no' }}|{{ messages[7].content | default('dflt') }}",
      "{% for a, b in {'k': messages[1].content}.items() %}{{ a }}={{ b }}{% endfor %}",
  };
  for (const char* src : templates) {
    SCOPED_TRACE(src);
    auto t = Template::Parse(src);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto r = (*t)->RenderMarked(ChatContext(messages, false, "", ""));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::string marked(r->text.size(), '.');
    for (const auto& [b, e] : r->data) {
      ASSERT_LT(b, e);
      for (size_t i = b; i < e; ++i) marked[i] = '^';
    }
    std::string want(r->text.size(), '.');
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::string("qzQZ").find(r->text[i]) != std::string::npos) want[i] = '^';
    }
    EXPECT_EQ(marked, want) << r->text;
    for (size_t k = 1; k < r->data.size(); ++k) EXPECT_LT(r->data[k - 1].second, r->data[k].first) << "touching marks";
  }
  // A list or dict printed whole, or as JSON, is data when it holds any.
  for (const char* whole : {"{{ messages[0] }}", "{{ messages[0].content | tojson }}", "{{ messages | string }}"}) {
    auto t = Template::Parse(whole);
    ASSERT_TRUE(t.ok());
    auto r = (*t)->RenderMarked(ChatContext(messages, false, "", ""));
    ASSERT_TRUE(r.ok()) << whole;
    EXPECT_EQ(r->data, (Spans{{0, r->text.size()}})) << whole << ": " << r->text;
  }
  // Data cannot become a dict key (keys lose marks).
  auto key = Template::Parse("{% set d = {messages[0].content: 1} %}{% for k in d %}{{ k }}{% endfor %}");
  ASSERT_TRUE(key.ok());
  auto r = (*key)->RenderMarked(ChatContext(messages, false, "", ""));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dict key made from message content"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace kvx::server::jinja

namespace kvx::server {
namespace {

// The chat template a real GGUF ships (Phi-3's vocabulary file), through
// ChatTemplate with the vocabulary's own BOS.
TEST(ChatTemplateTest, Phi3TemplateFromTheGguf) {
  std::unique_ptr<model::Tokenizer> tok;
  std::unique_ptr<ChatTemplate> t;
  LoadPhi3Chat(&tok, &t);
  KVX_SKIP_WITHOUT_PHI3(tok);
  EXPECT_FALSE(t->is_default());
  auto r = t->Render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "More"}}, true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "<s><|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n<|user|>\nMore<|end|>\n<|assistant|>\n");
  // <|end|> ends an assistant turn.
  ASSERT_EQ(t->stop_tokens().size(), 1u);
  EXPECT_EQ(tok->TokenText(t->stop_tokens()[0]), "<|end|>");
}

TEST(ChatTemplateTest, DefaultIsChatML) {
  auto tok = kvx::testing::SyntheticBpeTokenizer(512);
  ASSERT_NE(tok, nullptr);
  auto t = ChatTemplate::Create("", *tok);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->is_default());
  // ChatML's turn end stops generation when the vocabulary has it.
  ASSERT_EQ(t->stop_tokens().size(), 1u);
  EXPECT_EQ(tok->TokenText(t->stop_tokens()[0]), "<|im_end|>");
  auto r = t->Render({{"system", "S"}, {"user", "Hi"}}, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto bad = ChatTemplate::Create("{% call x() %}{% endcall %}", *tok);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("call"), std::string::npos);
}

}  // namespace
}  // namespace kvx::server
