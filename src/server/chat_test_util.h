// Test helper of the server layer's tests: the one real chat model in
// ../shared (Phi-3's vocabulary GGUF, which ships its chat template).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synthetic_model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "support/test_data.h"

namespace kvx::server {

// Phi-3's tokenizer and chat template into *tok and *chat; both left null
// when ../shared is absent (the caller skips), a test failure when the file
// does not load.
inline void LoadPhi3Chat(std::unique_ptr<model::Tokenizer>* tok, std::unique_ptr<ChatTemplate>* chat) {
  const std::string path = kvx::testing::SharedPath("models/vocab/ggml-vocab-phi-3.gguf");
  if (path.empty()) return;
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto t = model::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto source = (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto c = ChatTemplate::Create(*source, **t);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  *tok = std::move(t).value();
  *chat = std::make_unique<ChatTemplate>(std::move(c).value());
}

// The tiny synthetic model (a ChatML vocabulary), written to the test's
// temporary folder as `file` and loaded: a suite's shared model (released
// into a static by SetUpTestSuite, deleted by TearDownTestSuite).
inline model::Model* NewTinyModel(const std::string& file) {
  model::SyntheticModelOptions o;
  o.shape = "tiny";
  const std::string path = ::testing::TempDir() + "/" + file;
  EXPECT_TRUE(model::WriteSyntheticModel(o, path).ok());
  auto m = model::Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value().release() : nullptr;
}

#define KVX_SKIP_WITHOUT_PHI3(tok) \
  if ((tok) == nullptr) GTEST_SKIP() << "shared test data not found (set KVX_SHARED or place ../shared beside the repository)"

}  // namespace kvx::server
