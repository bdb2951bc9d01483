// libFuzzer target for the KV cache end to end, the path a --kv spec takes
// through kvx: spec text -> ParseKVSpec -> ValidateKVSpec against a model's
// layout -> ResolveLayers (the per-layer codecs) -> a SequenceKV on a small
// BlockPool -> Append random K/V (several calls, gaps in positions, across
// page, seal and 512-token attention-chunk boundaries) -> kv::Attention on
// random queries. kv_fuzz covers the parser alone.
//
// The input picks the layout (layers, kv heads, GQA group, head size), the
// spec (either free text or one assembled from valid-looking items, which
// reaches the codecs far more often), the pool budget, the tokens and the
// queries; the values themselves come from a PRNG seeded by the input, in
// one of several distributions (normal, large, constant rows, sparse spikes).
// Values are finite: K and V come from a forward pass over finite weights.
//
// Properties checked (abort on violation):
//   * a spec that validates resolves to one codec per layer with non-empty
//     pages that fit the pool's page size;
//   * Append either succeeds or fails with ResourceExhausted having changed
//     nothing; every (layer, kv-head) then holds exactly the appended tokens,
//     and the pool's invariants hold after every call;
//   * entries read back (ReadEntry) keep their positions;
//   * Attention with a thread pool equals Attention on the calling thread bit
//     for bit (the chunking never depends on the thread count);
//   * every output is a convex combination of the visible decoded values, so
//     each channel lies within their range (zero when nothing is visible),
//     and for moderate values it matches a dense double-precision reference
//     over the decoded entries;
//   * a fork shares pages copy-on-write: appending to the fork leaves the
//     original's attention output unchanged bit for bit.
//
// Seed corpus: fuzz/corpus/kv_attention/.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/block_pool.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"
#include "ops/nn.h"
#include "util/thread_pool.h"

namespace {

using kvx::kv::KVLayout;
using kvx::kv::KVSpec;
using kvx::kv::SequenceKV;

[[noreturn]] void Fail(const std::string& spec, const KVLayout& layout, const std::string& what) {
  std::fprintf(stderr, "kv_attention_fuzz: spec '%s' layout %s: %s\n", spec.c_str(), layout.ToString().c_str(),
               what.c_str());
  std::abort();
}

// Assembles a spec from items the grammar knows, with values around (and
// just outside) their valid ranges.
std::string StructuredSpec(FuzzedDataProvider& in) {
  static const char* kCodecs[] = {"f32", "f16", "int8", "int4", "int2", "kivi4", "kivi2"};
  static const char* kBits[] = {"2", "4", "8", "k2v2", "k4v2", "k2v4", "k8v4", "k4v8", "k8v8", "k16v16", "k3v4"};
  static const char* kRotate[] = {"none", "hadamard", "values"};
  std::string s = std::string("codec=") + kCodecs[in.ConsumeIntegralInRange<int>(0, 6)];
  s += ",page=" + std::to_string(1 << in.ConsumeIntegralInRange<int>(0, 8));
  const uint16_t items = in.ConsumeIntegral<uint16_t>();
  if (items & 1) s += ",residual=" + std::to_string(in.ConsumeIntegralInRange<int>(0, 300));
  if (items & 2) s += ",sinks=" + std::to_string(in.ConsumeIntegralInRange<int>(0, 80));
  if (items & 4) s += ",group=" + std::to_string(1 << in.ConsumeIntegralInRange<int>(2, 11));
  if (items & 8) s += std::string(",bits=") + kBits[in.ConsumeIntegralInRange<int>(0, 10)];
  if (items & 16) {
    const int a = in.ConsumeIntegralInRange<int>(0, 3), b = in.ConsumeIntegralInRange<int>(a, 4);
    s += ",bits." + std::to_string(a) + (a == b ? "" : "-" + std::to_string(b)) + "=" +
         kBits[in.ConsumeIntegralInRange<int>(0, 10)];
  }
  if (items & 32) s += ",sym=" + std::to_string(in.ConsumeIntegralInRange<int>(0, 1));
  if (items & 64) s += ",clip=" + std::to_string(in.ConsumeIntegralInRange<int>(0, 1));
  if (items & 128) s += std::string(",rotate=") + kRotate[in.ConsumeIntegralInRange<int>(0, 2)];
  if (items & 256) s += ",prerope=1";
  if (items & 512) s += ",outliers=" + std::to_string(in.ConsumeIntegralInRange<int>(0, 60) / 100.0);
  return s;
}

// Fills n rows of `dim` finite floats in one of several distributions.
void FillValues(std::mt19937& rng, int mode, size_t n_rows, int dim, std::vector<float>* out) {
  out->resize(n_rows * dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t r = 0; r < n_rows; ++r) {
    float* row = out->data() + r * dim;
    const float constant = normal(rng);
    for (int c = 0; c < dim; ++c) {
      switch (mode) {
        case 0: row[c] = normal(rng); break;
        case 1: row[c] = 1000.0f * uniform(rng); break;                                    // large
        case 2: row[c] = constant; break;                                                  // flat rows
        default: row[c] = (rng() % 16 == 0) ? 50.0f * uniform(rng) : 0.01f * normal(rng);  // spikes
      }
    }
  }
}

struct Decoded {
  std::vector<float> k, v;  // [n][head_dim], keys roped when the cache holds pre-RoPE keys
  std::vector<int32_t> pos;
};

Decoded DecodeChain(const SequenceKV& kv, int layer, int head) {
  const int n = kv.Length(layer, head), dim = kv.layout().head_dim;
  Decoded d;
  d.k.resize(static_cast<size_t>(n) * dim);
  d.v.resize(static_cast<size_t>(n) * dim);
  d.pos.resize(n);
  for (int j = 0; j < n; ++j) {
    float* k = &d.k[static_cast<size_t>(j) * dim];
    kv.ReadEntry(layer, head, j, k, &d.v[static_cast<size_t>(j) * dim], &d.pos[j]);
    if (kv.keys_pre_rope()) kvx::ops::Rope(k, 1, dim, d.pos[j], kv.rope());
  }
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  FuzzedDataProvider in(data, size);
  KVLayout layout;
  layout.n_layers = in.ConsumeIntegralInRange<int>(1, 2);
  layout.n_kv_heads = in.ConsumeIntegralInRange<int>(1, 2);
  const int group = in.ConsumeIntegralInRange<int>(1, 3);
  static const int kHeadDims[] = {8, 16, 32, 64, 128, 96, 24, 6, 2, 1, 12, 40};
  layout.head_dim = in.ConsumeBool() ? kHeadDims[in.ConsumeIntegralInRange<int>(0, 11)]
                                     : in.ConsumeIntegralInRange<int>(1, 160);
  const std::string spec_text = in.ConsumeBool() ? StructuredSpec(in) : in.ConsumeRandomLengthString(200);

  auto spec = kvx::kv::ParseKVSpec(spec_text);
  if (!spec.ok()) return 0;
  layout.page_tokens = spec->page_tokens;
  if (!layout.Validate().ok()) return 0;
  // What the KV manager does once for every path: a spec that does not
  // validate never reaches a SequenceKV.
  if (!kvx::kv::ValidateKVSpec(*spec, layout).ok()) return 0;
  const kvx::kv::CodecConfig& codec = spec->codec;
  const std::string canonical = spec->ToString();

  const std::vector<kvx::kv::LayerCodec> layers = kvx::kv::ResolveLayers(layout, codec);
  const size_t page_bytes = kvx::kv::PageBytes(layout, codec);
  if (static_cast<int>(layers.size()) != layout.n_layers) Fail(canonical, layout, "ResolveLayers: wrong layer count");
  for (const auto& lc : layers) {
    if (lc.packed_page_bytes == 0 || lc.full_page_bytes == 0 || lc.params.page_tokens != layout.page_tokens) {
      Fail(canonical, layout, "ResolveLayers: empty page or wrong page tokens");
    }
    // f16 pages exist only for staging (sealed codecs) and sinks.
    const bool has_full_pages = lc.sealed || lc.sink_pages > 0;
    if (lc.PageBytes(false) > page_bytes || (has_full_pages && lc.PageBytes(true) > page_bytes)) {
      Fail(canonical, layout, "a layer's page is larger than PageBytes()");
    }
  }

  // Tokens: up to ~600 in several appends (crossing the 512-entry attention
  // chunk), positions increasing with occasional gaps.
  // Mostly short caches (fast, so a 30 s run tries many specs); sometimes
  // long enough for several attention chunks.
  const int max_tokens = in.ConsumeIntegral<uint8_t>() < 224 ? in.ConsumeIntegralInRange<int>(1, 64)
                                                             : in.ConsumeIntegralInRange<int>(65, 600);
  const uint8_t budget_kind = in.ConsumeIntegral<uint8_t>();
  uint64_t budget = kvx::kv::BudgetForContext(layout, codec, max_tokens) + 4 * page_bytes;
  if (budget_kind % 8 == 0) budget = page_bytes * (1 + budget_kind / 8);  // tight: Append must fail cleanly
  auto pool_or = kvx::kv::BlockPool::Create({.budget_bytes = budget, .page_bytes = page_bytes});
  if (!pool_or.ok()) return 0;
  kvx::kv::BlockPool& pool = **pool_or;
  SequenceKV kv(&pool, layout, codec);
  kvx::ops::RopeParams rope{.n_dims = layout.head_dim - layout.head_dim % 2, .freq_base = 10000.0f};
  if (kv.keys_pre_rope()) {
    if (rope.n_dims == 0) return 0;
    kv.set_rope(rope);
  }

  std::mt19937 rng(in.ConsumeIntegral<uint32_t>());
  const int value_mode = in.ConsumeIntegralInRange<int>(0, 3);
  const int row = layout.n_kv_heads * layout.head_dim;
  // Appends run on two threads for some inputs only: every parallel call
  // waits for both threads, which on a loaded machine costs far more than the
  // work (a 30 s smoke run should try many specs).
  static kvx::ThreadPool threads(2);
  kvx::ThreadPool* append_threads = in.ConsumeIntegral<uint8_t>() < 64 ? &threads : nullptr;
  int32_t next_pos = 0;
  int total = 0;                                  // tokens offered to every layer
  std::vector<int> length(layout.n_layers, 0);    // entries each layer holds
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  // Appends n tokens to every layer of `seq`; false once the pool is full
  // (the layers before the failing one keep their new entries, as in a
  // forward pass that stops there).
  auto append = [&](SequenceKV& seq, int n, std::vector<int>* lengths) {
    pos.resize(n);
    for (int i = 0; i < n; ++i) {
      pos[i] = next_pos;
      next_pos += (rng() % 8 == 0) ? 1 + static_cast<int32_t>(rng() % 5) : 1;
    }
    FillValues(rng, value_mode, n, row, &k);
    FillValues(rng, value_mode, n, row, &v);
    for (int l = 0; l < layout.n_layers; ++l) {
      const int before = seq.Length(l, 0);
      const kvx::Status s = seq.Append(l, n, pos.data(), k.data(), v.data(), append_threads);
      if (!pool.CheckInvariants().ok()) Fail(canonical, layout, pool.CheckInvariants().ToString());
      if (!s.ok()) {
        if (s.code() != kvx::StatusCode::kResourceExhausted) Fail(canonical, layout, "Append: " + s.ToString());
        for (int h = 0; h < layout.n_kv_heads; ++h) {
          if (seq.Length(l, h) != before) Fail(canonical, layout, "a failed Append changed the cache");
        }
        return false;
      }
      (*lengths)[l] += n;
    }
    return true;
  };
  while (total < max_tokens && in.remaining_bytes() > 0) {
    const int n = std::min(max_tokens - total, in.ConsumeIntegralInRange<int>(1, 200));
    total += n;
    if (!append(kv, n, &length)) break;
  }
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      if (kv.Length(l, h) != length[l]) Fail(canonical, layout, "a head holds a wrong number of entries");
    }
  }

  // Queries: a decode step, a prompt block, positions before, inside and after the cache.
  const int n_heads = layout.n_kv_heads * group;
  const int n_q = in.ConsumeIntegralInRange<int>(1, 8);
  std::vector<int32_t> q_pos(n_q);
  for (int i = 0; i < n_q; ++i) q_pos[i] = static_cast<int32_t>(rng() % (next_pos + 4));
  std::vector<float> q;
  FillValues(rng, value_mode == 1 ? 1 : 0, static_cast<size_t>(n_q) * n_heads, layout.head_dim, &q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  const size_t out_size = static_cast<size_t>(n_q) * n_heads * layout.head_dim;
  const int layer = in.ConsumeIntegralInRange<int>(0, layout.n_layers - 1);
  std::vector<float> out(out_size), out_threads(out_size);
  kvx::kv::Attention(kv, layer, q.data(), q_pos.data(), n_q, n_heads, scale, out.data(), nullptr);
  kvx::kv::Attention(kv, layer, q.data(), q_pos.data(), n_q, n_heads, scale, out_threads.data(), &threads);
  if (out != out_threads) Fail(canonical, layout, "Attention differs with a thread pool");

  const int dim = layout.head_dim;
  for (int kh = 0; kh < layout.n_kv_heads; ++kh) {
    const Decoded d = DecodeChain(kv, layer, kh);
    for (int j = 1; j < static_cast<int>(d.pos.size()); ++j) {
      if (d.pos[j] <= d.pos[j - 1]) Fail(canonical, layout, "ReadEntry positions out of order");
    }
    for (int i = 0; i < n_q; ++i) {
      for (int g = 0; g < group; ++g) {
        const int h = kh * group + g;
        const float* qi = &q[(static_cast<size_t>(i) * n_heads + h) * dim];
        const float* oi = &out[(static_cast<size_t>(i) * n_heads + h) * dim];
        // Dense reference in double over the decoded entries, and the range of visible values.
        std::vector<double> s(d.pos.size(), -INFINITY);
        double mx = -INFINITY;
        for (size_t j = 0; j < d.pos.size(); ++j) {
          if (d.pos[j] > q_pos[i]) continue;
          double dot = 0;
          for (int c = 0; c < dim; ++c) dot += static_cast<double>(qi[c]) * d.k[j * dim + c];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        for (int c = 0; c < dim; ++c) {
          if (!std::isfinite(oi[c])) Fail(canonical, layout, "non-finite attention output");
        }
        if (mx == -INFINITY) {
          for (int c = 0; c < dim; ++c) {
            if (oi[c] != 0.0f) Fail(canonical, layout, "a query that sees no entry got a non-zero output");
          }
          continue;
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        // A rotation (Hadamard) mixes every channel's rounding into each.
        double vmax_abs = 0;
        for (size_t j = 0; j < d.pos.size(); ++j) {
          if (d.pos[j] > q_pos[i]) continue;
          for (int c = 0; c < dim; ++c) vmax_abs = std::max(vmax_abs, std::fabs(static_cast<double>(d.v[j * dim + c])));
        }
        for (int c = 0; c < dim; ++c) {
          double lo = INFINITY, hi = -INFINITY, ref = 0;
          for (size_t j = 0; j < d.pos.size(); ++j) {
            if (d.pos[j] > q_pos[i]) continue;
            const double x = d.v[j * dim + c];
            lo = std::min(lo, x), hi = std::max(hi, x);
            ref += s[j] / sum * x;
          }
          const double slack = 1e-3 * (std::fabs(lo) + std::fabs(hi)) + 1e-5 * vmax_abs + 1e-5;
          if (oi[c] < lo - slack || oi[c] > hi + slack) {
            Fail(canonical, layout, "output channel " + std::to_string(c) + " = " + std::to_string(oi[c]) +
                                        " outside the visible values' range [" + std::to_string(lo) + ", " +
                                        std::to_string(hi) + "]");
          }
          // Moderate values only: with large ones a score's last bits pick the argmax.
          if (value_mode == 0 && std::fabs(oi[c] - ref) > 2e-2 * (std::fabs(ref) + 1.0)) {
            Fail(canonical, layout, "output channel " + std::to_string(c) + " = " + std::to_string(oi[c]) +
                                        ", dense reference " + std::to_string(ref));
          }
        }
      }
    }
  }

  // Copy-on-write: a fork that grows must not change what the original sees.
  if (length[layer] > 0 && in.ConsumeBool()) {
    std::unique_ptr<SequenceKV> fork = kv.Fork();
    if (fork->keys_pre_rope()) fork->set_rope(rope);
    std::vector<int> fork_length = length;
    append(*fork, in.ConsumeIntegralInRange<int>(1, 64), &fork_length);
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      if (kv.Length(layer, h) != length[layer]) Fail(canonical, layout, "appending to a fork grew the original");
    }
    std::vector<float> again(out_size);
    kvx::kv::Attention(kv, layer, q.data(), q_pos.data(), n_q, n_heads, scale, again.data(), nullptr);
    if (again != out) Fail(canonical, layout, "appending to a fork changed the original's attention");
    fork.reset();
    if (!pool.CheckInvariants().ok()) Fail(canonical, layout, pool.CheckInvariants().ToString());
  }
  kv.Clear();
  if (pool.pages_in_use() != 0) Fail(canonical, layout, "Clear() left pages in use");
  return 0;
}
