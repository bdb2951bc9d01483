#include "kv/policy/head_typing.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kv/policy/params.h"
#include "kv/policy/sinks_window.h"
#include "util/output_file.h"

namespace kvx::kv {

Result<HeadTable> HeadTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("head table '" + path + "' cannot be read; write one with kvx calibrate-heads");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return InvalidArgument("head table '" + path + "' is not JSON: " + e.what());
  }
  HeadTable t;
  try {
    t.method = j.value("method", "");
    t.model = j.value("model", "");
    t.calib = j.value("calib", "");
    t.n_layers = j.at("n_layers").get<int>();
    t.n_kv_heads = j.at("n_kv_heads").get<int>();
    for (const auto& row : j.at("scores")) {
      if (static_cast<int>(row.size()) != t.n_kv_heads) throw std::runtime_error("a scores row is not n_kv_heads long");
      for (const auto& x : row) t.scores.push_back(x.get<double>());
    }
  } catch (const std::exception& e) {
    return InvalidArgument("head table '" + path + "': " + e.what() +
                           " (expected {\"n_layers\", \"n_kv_heads\", \"scores\": [[...] per layer]})");
  }
  if (t.n_layers < 1 || t.n_kv_heads < 1 || static_cast<int>(t.scores.size()) != t.n_layers * t.n_kv_heads) {
    return InvalidArgument("head table '" + path + "' holds " + std::to_string(t.scores.size()) + " scores for " +
                           std::to_string(t.n_layers) + " layers x " + std::to_string(t.n_kv_heads) + " kv heads");
  }
  for (double s : t.scores) {
    if (!std::isfinite(s)) return InvalidArgument("head table '" + path + "' holds a score that is not finite");
  }
  return t;
}

Status HeadTable::Save(const std::string& path) const {
  nlohmann::json j;
  j["method"] = method;
  j["model"] = model;
  if (!calib.empty()) j["calib"] = calib;
  j["n_layers"] = n_layers;
  j["n_kv_heads"] = n_kv_heads;
  nlohmann::json rows = nlohmann::json::array();
  for (int l = 0; l < n_layers; ++l) {
    rows.push_back(std::vector<double>(scores.begin() + static_cast<ptrdiff_t>(l) * n_kv_heads,
                                       scores.begin() + static_cast<ptrdiff_t>(l + 1) * n_kv_heads));
  }
  j["scores"] = rows;
  return WriteFileAtomically(path, j.dump(1) + "\n");
}

std::vector<uint8_t> HeadTable::RetrievalMask(double fraction) const {
  const int n = static_cast<int>(scores.size());
  const int take = std::clamp(static_cast<int>(std::ceil(fraction * n - 1e-9)), 0, n);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  std::vector<uint8_t> mask(n, 0);
  for (int i = 0; i < take; ++i) mask[order[i]] = 1;
  return mask;
}

Result<std::unique_ptr<KVPolicy>> HeadTypingPolicy::CreateDuo(PolicyParamReader& params) {
  return Create("duo", params, 0.5, 128, 256, 0.0);
}

Result<std::unique_ptr<KVPolicy>> HeadTypingPolicy::CreateRazor(PolicyParamReader& params) {
  return Create("razor", params, 0.15, 4, 256, 0.2);
}

namespace {
const PolicyRegistrar kDuo("duo", HeadTypingPolicy::CreateDuo);
const PolicyRegistrar kRazor("razor", HeadTypingPolicy::CreateRazor);
}  // namespace

Result<std::unique_ptr<KVPolicy>> HeadTypingPolicy::Create(std::string name, PolicyParamReader& r,
                                                           double retrieval, int sinks, int window,
                                                           double window_fraction) {
  std::unique_ptr<HeadTypingPolicy> p(new HeadTypingPolicy());
  p->name_ = name;
  p->sinks_ = sinks;
  p->window_ = window;
  p->window_fraction_ = window_fraction;
  std::string mode = "continuous";
  r.Double("retrieval", &retrieval, 0.0, 1.0)
      .Int("sinks", &p->sinks_, 0, 1 << 24)
      .Int("window", &p->window_, 1, 1 << 24)
      .Double("window_fraction", &p->window_fraction_, 0.0, 1.0)
      .Choice("mode", &mode, {"continuous", "once"});
  std::string heads;
  r.Text("heads", &heads);
  KVX_RETURN_IF_ERROR(r.error());
  if (heads.empty()) {
    return InvalidArgument("policy " + name + " needs heads=FILE, a head table written by `kvx calibrate-heads -m MODEL" +
                           " --method " + name + " -o FILE`");
  }
  KVX_ASSIGN_OR_RETURN(p->table_, HeadTable::Load(heads));
  p->retrieval_ = p->table_.RetrievalMask(retrieval);
  p->retrieval_fraction_ = retrieval;
  p->heads_file_ = heads;
  p->continuous_ = mode == "continuous";
  return std::unique_ptr<KVPolicy>(std::move(p));
}

PolicyParams HeadTypingPolicy::Parameters() const {
  return {{"heads", heads_file_},
          {"retrieval", std::to_string(retrieval_fraction_)},
          {"sinks", std::to_string(sinks_)},
          {"window", std::to_string(window_)},
          {"window_fraction", std::to_string(window_fraction_)},
          {"mode", continuous_ ? "continuous" : "once"}};
}

Status HeadTypingPolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  const KVLayout& layout = resolved.layout;
  if (table_.n_layers != layout.n_layers || table_.n_kv_heads != layout.n_kv_heads) {
    return InvalidArgument("policy " + name_ + ": the head table has " + std::to_string(table_.n_layers) + " layers x " +
                           std::to_string(table_.n_kv_heads) + " kv heads, the model " +
                           std::to_string(layout.n_layers) + " x " + std::to_string(layout.n_kv_heads) +
                           "; calibrate this model with kvx calibrate-heads");
  }
  return Status::Ok();
}

double HeadTypingPolicy::KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const {
  if (retrieval_.empty()) return bytes_per_token;
  const double retrieval =
      static_cast<double>(std::count(retrieval_.begin(), retrieval_.end(), 1)) / static_cast<double>(retrieval_.size());
  // A streaming head holds whole pages: its sinks' from the start, and its
  // window's, which spans one page more when it does not start on a page
  // boundary (the entries removed between leave the window's first page
  // partly live).
  const int page = std::max(1, resolved.layout.page_tokens);
  const int window = StreamingKeep(tokens) - sinks_;
  const int64_t held = static_cast<int64_t>(page) * ((sinks_ + page - 1) / page + (window + page - 1) / page + 1);
  const double streaming_kept = std::min(1.0, static_cast<double>(held) / tokens);
  return bytes_per_token * (retrieval + (1.0 - retrieval) * streaming_kept);
}

int HeadTypingPolicy::StreamingKeep(int tokens) const {
  const int window = std::max(window_, static_cast<int>(std::floor(window_fraction_ * tokens)));
  return sinks_ + window;
}

Status HeadTypingPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  return continuous_ ? Evict(manager, seq) : Status::Ok();
}

Status HeadTypingPolicy::Compress(KVManager& manager, SeqId seq) { return Evict(manager, seq); }

Status HeadTypingPolicy::Evict(KVManager& manager, SeqId seq) {
  const KVLayout& L = manager.kv(seq).layout();
  KVX_RETURN_IF_ERROR(CheckSpec(manager.spec()));
  // Retrieval heads keep everything; streaming heads keep sinks + window.
  auto streaming = [&](int l, int h) { return !retrieval_[static_cast<size_t>(l) * L.n_kv_heads + h]; };
  return TrimToSinksAndWindow(manager, seq, sinks_, StreamingKeep(manager.length(seq)) - sinks_, streaming).status();
}

}  // namespace kvx::kv
