// What the engine tests share: a tiny synthetic model and an engine loaded
// on it (scheduler_test.cc, scheduler_kv_test.cc, session_file_test.cc);
// for the scheduler tests, requests and their outcomes collected from their
// callbacks, and the tokens a prompt gives alone (engine::Generate), which
// every request must give whatever its company.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "model/synthetic_model.h"

namespace kvx::engine::scheduler_test {

// Writes the "tiny" synthetic model (2 layers, 512-token vocabulary) with weights of
// `type` drawn from `seed` into the test's temporary directory as `file`;
// returns its path. init_std 0.1: logits with some spread, so differences show.
inline std::string WriteTinyModel(const std::string& file, gguf::TensorType type, uint64_t seed = 1) {
  model::SyntheticModelOptions o;
  o.shape = "tiny";
  o.type = type;
  o.init_std = 0.1f;
  o.seed = seed;
  const std::string path = ::testing::TempDir() + "/" + file;
  EXPECT_TRUE(model::WriteSyntheticModel(o, path).ok());
  return path;
}

// An engine on the model at `model_path` (2 threads).
inline std::unique_ptr<Engine> LoadEngine(const std::string& model_path, const std::string& kv, int n_ctx = 256,
                                          int n_seqs = 4) {
  EngineOptions eo;
  eo.model_path = model_path;
  eo.kv_spec = kv::ParseKVSpec(kv).value();
  eo.n_ctx = n_ctx;
  eo.n_seqs = n_seqs;
  eo.n_threads = 2;
  auto e = Engine::Load(eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// The scheduler tests' model (q8_0) and engines on it.
inline const std::string& ModelPath() {
  static const std::string path = WriteTinyModel("scheduler_tiny.gguf", gguf::TensorType::kQ8_0);
  return path;
}

inline std::unique_ptr<Engine> MakeEngine(const std::string& kv, int n_ctx = 256, int n_seqs = 8) {
  return LoadEngine(ModelPath(), kv, n_ctx, n_seqs);
}

inline std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + seed * 101 + 5) % 500);
  return t;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What one request produced, filled by its callback.
struct Outcome {
  std::map<int, std::vector<int32_t>> streamed;  // per sample, from token events
  std::map<int, RequestEvent> finish;            // per sample
  RequestTiming timing;
  bool done = false;
};

class Collector {
 public:
  EventCallback Callback(int key) {
    return [this, key](const RequestEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      Outcome& o = out_[key];
      EXPECT_FALSE(o.done) << "event after done";
      if (e.kind == RequestEvent::Kind::kToken) {
        EXPECT_EQ(e.index, static_cast<int>(o.streamed[e.sample].size()));
        o.streamed[e.sample].push_back(e.token);
      } else {
        o.finish[e.sample] = e;
        if (e.done) {
          o.done = true;
          o.timing = e.timing;
          cv_.notify_all();
        }
      }
    };
  }
  Outcome Wait(int key) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return out_[key].done; });
    return out_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Outcome> out_;
};

inline model::SamplerOptions Sampling(uint64_t seed) {
  model::SamplerOptions o;
  o.temperature = 0.9f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = seed;
  return o;
}

// The tokens `prompt` gives alone, through engine::Generate on its own engine
// (`compress`: the KV policies compress once the prompt is in, as `kvx run`).
inline std::vector<int32_t> Alone(Engine& e, const std::vector<int32_t>& prompt, int max_tokens, uint64_t seed,
                           bool compress = false) {
  auto s = e.NewSession();
  EXPECT_TRUE(s.ok());
  GenerateOptions go;
  go.n_predict = max_tokens;
  go.sampler = Sampling(seed);
  if (compress) go.compress_at = static_cast<int>(prompt.size());
  std::vector<int32_t> out;
  GenerateStats st;
  EXPECT_TRUE(Generate(s->get(), prompt, go, nullptr, &out, &st).ok());
  return out;
}

inline void ExpectInvariants(Scheduler& s) {
  const Status st = s.RunBetweenSteps([&s](Engine&) { return s.CheckInvariants(); });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A request that generates exactly `max_tokens` tokens (it does not stop at
// end-of-generation), sampled with Sampling(seed).
inline GenerationRequest FixedLengthRequest(std::vector<int32_t> prompt, int max_tokens, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.stop_at_eog = false;
  r.sampling = Sampling(seed);
  return r;
}

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens;
  uint64_t seed;
};

// A job's request: it stops at end-of-generation, as generating alone does.
inline GenerationRequest JobRequest(const Job& job) {
  GenerationRequest r;
  r.prompt = job.prompt;
  r.max_tokens = job.max_tokens;
  r.sampling = Sampling(job.seed);
  r.stop_at_eog = true;
  return r;
}

// Submits every job (JobRequest, callback key = its index) between two
// steps, so they arrive together whatever the machine's load.
inline Status SubmitTogether(Scheduler& sched, const std::vector<Job>& jobs, Collector& c) {
  return sched.RunBetweenSteps([&](Engine&) -> Status {
    for (size_t i = 0; i < jobs.size(); ++i) {
      KVX_RETURN_IF_ERROR(sched.Submit(JobRequest(jobs[i]), c.Callback(static_cast<int>(i))).status());
    }
    return Status::Ok();
  });
}

inline std::vector<Job> MixedJobs() {
  const auto system = Tokens(40, 1);  // shared by several
  return {{Concat(system, Tokens(9, 2)), 12, 1},  {Tokens(3, 3), 20, 2},
          {Concat(system, Tokens(30, 4)), 8, 3},  {Tokens(70, 5), 15, 4},
          {Concat(system, Tokens(1, 6)), 10, 5},  {Tokens(1, 7), 25, 6},
          {Concat(system, Tokens(17, 8)), 14, 7}, {Tokens(33, 9), 5, 8}};
}

}  // namespace kvx::engine::scheduler_test
