#include "eval/rag.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/chunk_assembly.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "eval/ruler.h"
#include "eval/stats.h"
#include "eval/text_score.h"

namespace kvx::eval {
namespace {

constexpr std::string_view kInstruction =
    "A pass key is hidden in one of the documents below. Find it and remember it, I will ask you about it.";
constexpr std::string_view kQuestion = "\nWhat is the pass key? The pass key is";

// A run of essay sentences of at most chunk_tokens tokens (at least one
// sentence) from a random start; with `value`, the pass-key needle at a
// random sentence boundary. One text, or with `split` two: the document cut
// inside the needle, "... The pass key is" | " N. Remember it. ...", so the
// number's KV, computed alone, never saw what it is (the answer needs
// attention across the chunk boundary).
Result<std::vector<std::string>> MakeDocument(const model::Tokenizer& tok, const Haystack& hay, int chunk_tokens,
                                              const std::string& value, bool split, std::mt19937_64& rng) {
  std::vector<std::string> sentences;
  const size_t n_sent = hay.sentences.size();
  size_t at = rng() % n_sent;
  int tokens = 0;
  while (true) {
    KVX_ASSIGN_OR_RETURN(std::vector<int32_t> t, tok.Encode(hay.sentences[at], false, false));
    if (!sentences.empty() && tokens + static_cast<int>(t.size()) > chunk_tokens) break;
    sentences.push_back(hay.sentences[at]);
    tokens += static_cast<int>(t.size());
    at = (at + 1) % n_sent;
  }
  constexpr std::string_view kCut = "\x01";  // where a split needle is cut
  if (!value.empty()) {
    sentences.insert(sentences.begin() + static_cast<std::ptrdiff_t>(rng() % (sentences.size() + 1)),
                     split ? "The pass key is" + std::string(kCut) + " " + value + ". Remember it."
                           : "The pass key is " + value + ". Remember it. " + value + " is the pass key.");
  }
  std::string text;  // a document starts with the space that separates it from what precedes it
  for (const std::string& s : sentences) text += " " + s;
  const size_t cut = text.find(kCut);
  if (cut == std::string::npos) return std::vector<std::string>{text};
  return std::vector<std::string>{text.substr(0, cut), text.substr(cut + kCut.size())};
}

int ArgMax(const float* logits, int n) { return static_cast<int>(std::max_element(logits, logits + n) - logits); }

double Kld(const float* reference, const float* other, int n) {
  std::vector<double> lp(n), lq(n);
  LogSoftmax(reference, n, lp.data());
  LogSoftmax(other, n, lq.data());
  return KlDivergence(lp.data(), lq.data(), n);
}

// One repair's run of one question.
struct Answer {
  std::vector<int32_t> tokens;        // greedy
  std::vector<std::vector<float>> logits;  // at each answer position, teacher-forced on the reference's answer
  double ttft_ms = 0;
  double recomputed = 0;
};

class RagRunner {
 public:
  RagRunner(engine::Engine* engine, engine::ChunkAssembler* assembler, int n_gen)
      : engine_(engine), assembler_(assembler), n_gen_(n_gen) {}

  // Assembles, then (reference == nullptr) generates greedily recording the
  // logits, or teacher-forces `reference` on a fork and generates greedily.
  Result<Answer> Run(const std::vector<int32_t>& prefix, const std::vector<std::vector<int32_t>>& chunks,
                     const std::vector<int32_t>& suffix, const engine::ChunkRepair& repair,
                     const std::vector<int32_t>* reference) {
    const int n_vocab = engine_->model().config().n_vocab;
    Answer a;
    KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::Session> s, engine_->NewSession());
    engine::ChunkUsage usage;
    const auto t0 = std::chrono::steady_clock::now();
    KVX_ASSIGN_OR_RETURN(const float* logits, assembler_->Assemble(s.get(), prefix, chunks, suffix, repair, &usage));
    a.ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    a.recomputed = usage.RecomputedFraction();
    std::vector<float> first(logits, logits + n_vocab);
    if (reference != nullptr) {
      a.logits.push_back(first);
      if (reference->size() > 1) {
        KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::Session> fork, engine_->ForkSession(*s, s->n_past()));
        std::vector<float> rows;
        const std::vector<int32_t> forced(reference->begin(), reference->end() - 1);
        KVX_RETURN_IF_ERROR(fork->FeedWithLogits(forced, 0, &rows));
        for (size_t r = 0; r < forced.size(); ++r) {
          a.logits.emplace_back(rows.begin() + static_cast<std::ptrdiff_t>(r * n_vocab),
                                rows.begin() + static_cast<std::ptrdiff_t>((r + 1) * n_vocab));
        }
      }
    }
    const int32_t eos = engine_->model().tokenizer().eos();
    std::vector<float> current = std::move(first);
    for (int i = 0; i < n_gen_; ++i) {
      if (reference == nullptr) a.logits.push_back(current);
      const int32_t t = ArgMax(current.data(), n_vocab);
      a.tokens.push_back(t);
      if (t == eos || i + 1 == n_gen_) break;
      KVX_ASSIGN_OR_RETURN(const float* next, s->Feed(std::vector<int32_t>{t}));
      current.assign(next, next + n_vocab);
    }
    return a;
  }

 private:
  engine::Engine* engine_;
  engine::ChunkAssembler* assembler_;
  int n_gen_;
};

// Each row's McNemar verdict against the `full` row of its size, on the
// same questions.
void PairWithFull(std::vector<RagRow>* rows) {
  const RagRow* full = nullptr;
  for (const RagRow& r : *rows) {
    if (r.repair == "full") full = &r;
  }
  if (full == nullptr) return;
  for (RagRow& r : *rows) {
    r.only_full = r.only_this = 0;
    for (size_t q = 0; q < r.answered.size() && q < full->answered.size(); ++q) {
      r.only_full += full->answered[q] && !r.answered[q];
      r.only_this += r.answered[q] && !full->answered[q];
    }
    r.mcnemar_p = McNemarExactP(r.only_full, r.only_this);
    r.verdict = VerdictName(McNemarVerdict(r.only_full, r.only_this));
  }
}

Result<std::vector<RagRow>> RunSize(const model::Model& model, ThreadPool* threads, const RagOptions& o, const Haystack& hay,
                                    int size, const std::vector<engine::ChunkRepair>& repairs, std::mt19937_64& rng) {
  const model::Tokenizer& tok = model.tokenizer();
  // D - 1 plain documents every question shares, and one document with a
  // pass key per question.
  const int n_docs = std::max(2, size / o.chunk_tokens);
  // Document d's chunks (one, or two for a split needle) in the list of all.
  std::vector<std::string> texts, values;
  std::vector<std::vector<int>> doc_chunks;
  auto add = [&](const std::vector<std::string>& parts) {
    doc_chunks.emplace_back();
    for (const std::string& p : parts) {
      doc_chunks.back().push_back(static_cast<int>(texts.size()));
      texts.push_back(p);
    }
  };
  for (int d = 0; d + 1 < n_docs; ++d) {
    KVX_ASSIGN_OR_RETURN(std::vector<std::string> parts, MakeDocument(tok, hay, o.chunk_tokens, "", false, rng));
    add(parts);
  }
  for (int q = 0; q < o.questions; ++q) {
    values.push_back(std::to_string(1 + rng() % 50000));
    KVX_ASSIGN_OR_RETURN(std::vector<std::string> parts,
                         MakeDocument(tok, hay, o.chunk_tokens, values.back(), o.split_needle, rng));
    add(parts);
  }
  // Every chunk follows the instructions: tokenized as in the running text.
  KVX_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> chunks, engine::TokenizeChunks(tok, texts, /*after_text=*/true));
  auto doc_tokens = [&](int d) {
    size_t n = 0;
    for (int c : doc_chunks[d]) n += chunks[c].size();
    return n;
  };
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> prefix, tok.Encode(std::string(kInstruction) + "\n", true, false));
  KVX_ASSIGN_OR_RETURN(std::vector<int32_t> suffix, tok.EncodeContinuation(kQuestion, false));
  // The longest prompt: the plain documents and the longest needle document.
  size_t longest_needle = 0;
  for (int q = 0; q < o.questions; ++q) longest_needle = std::max(longest_needle, doc_tokens(n_docs - 1 + q));
  int64_t chunk_total = static_cast<int64_t>(longest_needle);
  for (int d = 0; d + 1 < n_docs; ++d) chunk_total += static_cast<int64_t>(doc_tokens(d));
  // The chunks of documents in `order`.
  auto prompt_chunks = [&](const std::vector<int>& order) {
    std::vector<std::vector<int32_t>> out;
    for (int d : order) {
      for (int c : doc_chunks[d]) out.push_back(chunks[c]);
    }
    return out;
  };
  engine::EngineOptions eo;
  KVX_ASSIGN_OR_RETURN(eo.kv_spec, kv::ParseKVSpec(o.kv_spec));
  eo.n_ctx = static_cast<int>(prefix.size() + chunk_total + suffix.size()) + o.n_gen;
  eo.n_batch = o.n_batch;
  eo.n_seqs = 2;  // the question's sequence and its teacher-forced fork
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(&model, threads, eo));
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::ChunkAssembler> assembler,
                       engine::ChunkAssembler::Create(engine.get(), uint64_t{8} << 30));
  RagRunner runner(engine.get(), assembler.get(), o.n_gen);
  engine::ChunkRepair none;
  none.mode = engine::ChunkRepairMode::kNone;
  engine::ChunkRepair full;
  full.mode = engine::ChunkRepairMode::kFull;
  // The documents were seen before: every chunk in the cache.
  for (int q = 0; q < o.questions; ++q) {
    std::vector<int> docs;
    for (int d = 0; d + 1 < n_docs; ++d) docs.push_back(d);
    docs.push_back(n_docs - 1 + q);
    KVX_RETURN_IF_ERROR(runner.Run(prefix, prompt_chunks(docs), suffix, none, nullptr).status());
  }

  struct Acc {
    int n = 0, hits = 0;
    std::vector<bool> answered;
    MeanAccumulator kld, recomputed;
    std::vector<double> ttft;
  };
  std::vector<Acc> acc(repairs.size());
  int64_t prompt_tokens = 0;
  for (int q = 0; q < o.questions; ++q) {
    std::vector<int> order(n_docs);
    for (int i = 0; i + 1 < n_docs; ++i) order[i] = i;
    order[n_docs - 1] = n_docs - 1 + q;
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<std::vector<int32_t>> shuffled = prompt_chunks(order);
    int64_t prompt_chunk_tokens = 0;
    for (const auto& c : shuffled) prompt_chunk_tokens += static_cast<int64_t>(c.size());
    prompt_tokens = static_cast<int64_t>(prefix.size() + suffix.size()) + prompt_chunk_tokens;
    KVX_ASSIGN_OR_RETURN(Answer reference, runner.Run(prefix, shuffled, suffix, full, nullptr));
    for (size_t r = 0; r < repairs.size(); ++r) {
      Answer a = reference;
      if (repairs[r].mode != engine::ChunkRepairMode::kFull) {
        KVX_ASSIGN_OR_RETURN(a, runner.Run(prefix, shuffled, suffix, repairs[r], &reference.tokens));
      }
      Acc& x = acc[r];
      ++x.n;
      x.answered.push_back(ValuesFound(tok.Decode(a.tokens, false), {values[q]}) >= 1.0);
      if (x.answered.back()) ++x.hits;
      for (size_t i = 0; i < reference.logits.size() && i < a.logits.size(); ++i) {
        x.kld.Add(Kld(reference.logits[i].data(), a.logits[i].data(), model.config().n_vocab));
      }
      x.ttft.push_back(a.ttft_ms);
      x.recomputed.Add(a.recomputed);
    }
  }
  std::vector<RagRow> rows;
  for (size_t r = 0; r < repairs.size(); ++r) {
    RagRow row;
    row.size = static_cast<int>(chunk_total);
    row.repair = repairs[r].ToString();
    row.n = acc[r].n;
    row.hits = acc[r].hits;
    const Interval ci = WilsonInterval(row.hits, row.n);
    row.acc_lo = ci.lo;
    row.acc_hi = ci.hi;
    row.kld_mean = acc[r].kld.Mean();
    row.ttft_ms_median = Percentile(acc[r].ttft, 0.5);
    row.recomputed_fraction = acc[r].recomputed.Mean();
    row.prompt_tokens = prompt_tokens;
    row.answered = acc[r].answered;
    rows.push_back(row);
  }
  PairWithFull(&rows);
  return rows;
}

}  // namespace

Result<std::vector<RagRow>> RunRagEval(const model::Model& model, ThreadPool* threads, const RagOptions& o) {
  if (o.questions < 1 || o.n_gen < 1 || o.chunk_tokens < 1) {
    return InvalidArgument("rag: questions, answer tokens and chunk tokens must be >= 1");
  }
  std::vector<engine::ChunkRepair> repairs;
  for (const std::string& text : o.repairs) {
    KVX_ASSIGN_OR_RETURN(engine::ChunkRepair r, engine::ParseChunkRepair(text));
    repairs.push_back(r);
  }
  {  // The spec's pages must take chunks (checked before any data is read).
    engine::EngineOptions eo;
    KVX_ASSIGN_OR_RETURN(eo.kv_spec, kv::ParseKVSpec(o.kv_spec));
    eo.n_ctx = 64;
    KVX_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(&model, threads, eo));
    KVX_RETURN_IF_ERROR(engine::ChunkAssembler::Create(engine.get(), 0).status());
  }
  KVX_ASSIGN_OR_RETURN(std::string essays, LoadEssays(o.data_dir + "/paul_graham_essays"));
  const Haystack hay = MakeHaystack(essays);
  std::mt19937_64 rng(o.seed);
  std::vector<RagRow> rows;
  for (int size : o.sizes) {
    KVX_ASSIGN_OR_RETURN(std::vector<RagRow> part, RunSize(model, threads, o, hay, size, repairs, rng));
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

std::string RagTable(const std::vector<RagRow>& rows) {
  std::string out =
      "| chunk tokens | repair | accuracy (95% CI) | vs full (McNemar) | KLD vs full | TTFT ms (median) | TTFT / full | "
      "recomputed |\n"
      "|---:|---|---|---|---:|---:|---:|---:|\n";
  char buf[512];
  for (const RagRow& r : rows) {
    double full_ttft = 0;
    for (const RagRow& f : rows) {
      if (f.size == r.size && f.repair == "full") full_ttft = f.ttft_ms_median;
    }
    const std::string ratio = full_ttft > 0 ? std::to_string(r.ttft_ms_median / full_ttft).substr(0, 4) : "-";
    // "-" for full itself and without a full row; else the verdict, the
    // discordant questions (full only / this only) and the p-value.
    char paired[96] = "-";
    if (!r.verdict.empty() && r.repair != "full") {
      std::snprintf(paired, sizeof paired, "%s (%d/%d, p=%.2g)", r.verdict.c_str(), r.only_full, r.only_this,
                    r.mcnemar_p);
    }
    std::snprintf(buf, sizeof buf, "| %d | %s | %d/%d = %.2f [%.2f, %.2f] | %s | %.4f | %.0f | %s | %.3f |\n", r.size,
                  r.repair.c_str(), r.hits, r.n, r.n > 0 ? static_cast<double>(r.hits) / r.n : 0.0, r.acc_lo, r.acc_hi,
                  paired, r.kld_mean, r.ttft_ms_median, ratio.c_str(), r.recomputed_fraction);
    out += buf;
  }
  return out;
}

std::string RagJson(const std::vector<RagRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const RagRow& r : rows) {
    j.push_back({{"chunk_tokens", r.size}, {"repair", r.repair}, {"n", r.n}, {"hits", r.hits}, {"lo", r.acc_lo},
                 {"hi", r.acc_hi}, {"answered", r.answered}, {"only_full", r.only_full}, {"only_this", r.only_this},
                 {"mcnemar_p", r.mcnemar_p}, {"verdict_vs_full", r.verdict}, {"kld", r.kld_mean},
                 {"ttft_ms_median", r.ttft_ms_median}, {"recomputed_fraction", r.recomputed_fraction},
                 {"prompt_tokens", r.prompt_tokens}});
  }
  return j.dump(1) + "\n";
}

}  // namespace kvx::eval
