#include "kv/kv_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/layout.h"
#include "util/byte_size.h"
#include "util/mmap_file.h"
#include "util/printable.h"

namespace kvx::kv {
namespace {

constexpr std::string_view kValidKeys =
    "codec, page, budget, bits, bits.L, group, sym, clip, residual, sinks, outliers, rotate, prerope";
constexpr int kMaxLayerIndex = 4095;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Parses a non-negative decimal integer that fits in uint64_t.
bool ParseUint(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

Status BadValue(std::string_view item, const std::string& why) {
  return InvalidArgument("bad --kv item '" + std::string(item) + "': " + why);
}

// budget=: the one size grammar (util/byte_size.h), its message naming the item.
Result<uint64_t> ParseBudget(std::string_view item, std::string_view value) {
  auto bytes = ParseByteSize(value);
  if (!bytes.ok()) return BadValue(item, "budget " + bytes.status().message());
  return *bytes;
}

std::string FormatBytes(uint64_t b) {
  if (b != 0 && b % (1ull << 30) == 0) return std::to_string(b >> 30) + "GiB";
  if (b != 0 && b % (1ull << 20) == 0) return std::to_string(b >> 20) + "MiB";
  if (b != 0 && b % (1ull << 10) == 0) return std::to_string(b >> 10) + "KiB";
  return std::to_string(b);
}

// "k8v4" or "8" -> (8, 4) / (8, 8); widths 2, 4, 8 (16 only as k16v16 when allowed).
bool ParseBits(std::string_view v, bool allow_16, int* k, int* vb) {
  auto width = [](std::string_view t, int* out) {
    uint64_t x = 0;
    if (!ParseUint(t, &x) || (x != 2 && x != 4 && x != 8 && x != 16)) return false;
    *out = static_cast<int>(x);
    return true;
  };
  const std::string low = Lower(v);
  std::string_view s = low;
  if (!s.empty() && s[0] == 'k') {
    const size_t at = s.find('v');
    if (at == std::string_view::npos || !width(s.substr(1, at - 1), k) || !width(s.substr(at + 1), vb)) return false;
  } else {
    if (!width(s, k)) return false;
    *vb = *k;
  }
  if (*k == 16 || *vb == 16) return allow_16 && *k == 16 && *vb == 16;
  return true;
}

// "3" or "2-5" -> [first, last].
bool ParseLayerRange(std::string_view s, int* first, int* last) {
  const size_t dash = s.find('-');
  uint64_t a = 0, b = 0;
  if (dash == std::string_view::npos) {
    if (!ParseUint(s, &a)) return false;
    b = a;
  } else if (!ParseUint(s.substr(0, dash), &a) || !ParseUint(s.substr(dash + 1), &b)) {
    return false;
  }
  if (a > b || b > static_cast<uint64_t>(kMaxLayerIndex)) return false;
  *first = static_cast<int>(a);
  *last = static_cast<int>(b);
  return true;
}

bool ParseFraction(std::string_view s, double* out) {
  std::string t(s);
  double scale = 1.0;
  if (!t.empty() && t.back() == '%') {
    t.pop_back();
    scale = 0.01;
  }
  if (t.empty()) return false;
  char* end = nullptr;
  const double x = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !(x >= 0.0)) return false;
  *out = x * scale;
  return *out < 0.5;
}

bool ParseBool(std::string_view s, bool* out) {
  const std::string t = Lower(s);
  if (t == "1" || t == "true" || t == "on" || t == "yes") return *out = true, true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return *out = false, true;
  return false;
}

}  // namespace

namespace {

// A codec's setting when the spec names none of page, group, residual,
// rotate and prerope (kv_spec.h: the page key).
struct CodecDefaults {
  int page_tokens = 16;
  int group = 0;      // 0: CodecConfig::kDefaultGroup
  int residual = -1;  // -1: CodecConfig::EffectiveResidual's
  Rotation rotation = Rotation::kNone;
  bool pre_rope = false;
  bool clip = false;
};

// Each codec's best setting in the KLD evidence at 4096 tokens on the recall
// model (docs/kv-quantization.md, "Codec defaults"; scripts/codec_defaults.py).
CodecDefaults DefaultsOf(CodecId id) {
  // KIVI's keys are quantized per channel over a page: long pages and wide
  // value groups make it 6x smaller than f16 (kivi2) with no f16 residual.
  // Keys before RoPE lose less to per-channel quantization (KVQuant), and
  // the Hadamard rotation spreads their outlier channels (kivi4: KLD 0.0081
  // vs 0.0116 without it).
  if (IsKivi(id)) return CodecDefaults{128, 64, 0, Rotation::kHadamard, true};
  // Per-token 4 bits: the rotation spreads outlier channels over the group
  // (KLD 0.021 vs 0.027 unrotated); 2 bits: the clipped range search (0.39
  // vs 0.55 unclipped). Neither costs a byte.
  if (id == CodecId::kInt4) return CodecDefaults{.rotation = Rotation::kHadamard};
  if (id == CodecId::kInt2) return CodecDefaults{.clip = true};
  return CodecDefaults{};
}

// Policies that score and drop the keys' own channels (ThinK, kv/policy/think.h):
// a codec default that mixes key channels would make such a spec an error.
bool PrunesKeyChannels(const std::vector<PolicySpec>& policies) {
  return std::any_of(policies.begin(), policies.end(), [](const PolicySpec& p) { return p.name == "think"; });
}

}  // namespace

std::string KVSpec::ToString() const {
  // codec=X first, then page, then the codec's options, then the budget.
  std::string c = codec.ToString();
  const size_t comma = c.find(',');
  std::string s = c.substr(0, comma) + ",page=" + std::to_string(page_tokens);
  if (comma != std::string::npos) s += c.substr(comma);
  if (budget_bytes != 0) s += ",budget=" + FormatBytes(budget_bytes);
  for (const PolicySpec& p : policies) {
    s += ";policy=" + p.name;
    for (const auto& [k, v] : p.params) s += "," + k + "=" + v;
  }
  return s;
}

Result<KVSpec> ParseKVSpec(std::string_view text) {
  KVSpec spec;
  CodecConfig& cc = spec.codec;
  std::set<std::string> seen;
  std::string quant_key;  // first key that needs a quantized codec
  for (std::string_view group : Split(text, ';')) {
    const std::vector<std::string_view> items = Split(group, ',');
    // A policy group: policy=NAME, then the policy's own key=value items up to
    // the end of the group (so "codec=kivi4,policy=snapkv,ratio=0.75" reads
    // ratio as snapkv's).
    auto is_policy = [](std::string_view item) {
      const size_t eq = item.find('=');
      return eq != std::string_view::npos && Trim(item.substr(0, eq)) == "policy";
    };
    auto parse_policy = [&](size_t at) -> Status {
      const std::string_view first = Trim(items[at]);
      PolicySpec p;
      p.name = Lower(Trim(first.substr(first.find('=') + 1)));
      if (p.name.empty()) return BadValue(first, "missing policy name");
      for (size_t i = at + 1; i < items.size(); ++i) {
        const std::string_view item = Trim(items[i]);
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos || Trim(item.substr(eq + 1)).empty()) {
          return InvalidArgument("bad --kv item '" + std::string(item) + "' in the policy group of '" + p.name +
                                 "': expected key=value");
        }
        const std::string key = Lower(Trim(item.substr(0, eq)));
        if (key == "policy") {
          return InvalidArgument("--kv: a second policy= in the policy group of '" + p.name +
                                 "'; separate policies with ';', e.g. policy=snapkv,ratio=0.5;policy=streamingllm");
        }
        if (!p.params.emplace(key, std::string(Trim(item.substr(eq + 1)))).second) {
          return InvalidArgument("duplicate key '" + key + "' in the policy group of '" + p.name + "'");
        }
      }
      spec.policies.push_back(std::move(p));
      return Status::Ok();
    };
    size_t policy_at = items.size();
    for (size_t i = 0; i < items.size(); ++i) {
      if (is_policy(Trim(items[i]))) {
        policy_at = i;
        break;
      }
    }
    if (policy_at < items.size()) KVX_RETURN_IF_ERROR(parse_policy(policy_at));
    for (size_t item_index = 0; item_index < policy_at; ++item_index) {
      const std::string_view raw_item = items[item_index];
      const std::string_view item = Trim(raw_item);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return InvalidArgument("bad --kv item '" + std::string(item) + "': expected key=value (keys: " +
                               std::string(kValidKeys) + ")");
      }
      const std::string_view key = Trim(item.substr(0, eq));
      const std::string_view value = Trim(item.substr(eq + 1));
      if (value.empty()) return BadValue(item, "missing value");
      const bool layer_key = key.substr(0, 5) == "bits.";
      static const std::set<std::string_view> kKeys = {"codec", "page",  "budget",   "bits",   "group",  "sym",    "clip",
                                                       "residual", "sinks", "outliers", "rotate", "prerope"};
      if (!layer_key && kKeys.count(key) == 0) {
        return InvalidArgument("unknown --kv key '" + std::string(key) + "' in '" + std::string(item) +
                               "'; valid keys: " + std::string(kValidKeys));
      }
      if (!seen.insert(std::string(key)).second) {
        return InvalidArgument("duplicate --kv key '" + std::string(key) + "' in '" + std::string(item) + "'");
      }
      if (layer_key || key == "bits" || key == "group" || key == "sym" || key == "clip" || key == "residual" ||
          key == "sinks" || key == "outliers") {
        if (quant_key.empty()) quant_key = std::string(key);
      }
      uint64_t u = 0;
      if (key == "codec") {
        const std::optional<CodecId> id = ParseCodecName(value);
        if (!id) {
          return InvalidArgument("unknown --kv codec '" + std::string(value) + "'; valid codecs: " +
                                 std::string(kCodecChoices));
        }
        cc.id = *id;
      } else if (key == "page") {
        if (!ParseUint(value, &u) || u < 1 || u > static_cast<uint64_t>(kMaxPageTokens) || (u & (u - 1)) != 0) {
          return BadValue(item, "page (tokens per page) must be a power of two in 1.." +
                                    std::to_string(kMaxPageTokens) + ", e.g. page=16");
        }
        spec.page_tokens = static_cast<int>(u);
      } else if (key == "budget") {
        KVX_ASSIGN_OR_RETURN(spec.budget_bytes, ParseBudget(item, value));
      } else if (key == "bits") {
        if (!ParseBits(value, false, &cc.k_bits, &cc.v_bits)) {
          return BadValue(item, "bits must be kXvY with X, Y in 2, 4, 8 (e.g. bits=k4v2) or one width (bits=4)");
        }
      } else if (layer_key) {
        LayerBits lb;
        if (!ParseLayerRange(key.substr(5), &lb.first, &lb.last)) {
          return BadValue(item, "per-layer bits take a layer or range: bits.3=k8v4 or bits.0-5=k4v2 (layers 0.." +
                                    std::to_string(kMaxLayerIndex) + ")");
        }
        if (!ParseBits(value, true, &lb.k_bits, &lb.v_bits)) {
          return BadValue(item, "per-layer bits must be kXvY with X, Y in 2, 4, 8, or k16v16 (f16 layer)");
        }
        cc.layer_bits.push_back(lb);
      } else if (key == "group") {
        if (!ParseUint(value, &u) || u < 8 || u > 1024 || (u & (u - 1)) != 0) {
          return BadValue(item, "group (channels per scale) must be a power of two in 8..1024, e.g. group=32");
        }
        cc.group = static_cast<int>(u);
      } else if (key == "residual" || key == "sinks") {
        if (!ParseUint(value, &u) || u > (1u << 20)) {
          return BadValue(item, std::string(key) + " must be a token count in 0..1048576, e.g. " + std::string(key) +
                                    "=32");
        }
        (key == "residual" ? cc.residual : cc.sinks) = static_cast<int>(u);
      } else if (key == "outliers") {
        if (!ParseFraction(value, &cc.outliers)) {
          return BadValue(item, "outliers must be a fraction in [0, 0.5), e.g. outliers=0.01 or outliers=1%");
        }
      } else if (key == "rotate") {
        const std::string r = Lower(value);
        if (r == "hadamard") cc.rotation = Rotation::kHadamard;
        else if (r == "values") cc.rotation = Rotation::kValues;
        else if (r == "none") cc.rotation = Rotation::kNone;
        else return BadValue(item, "rotate must be none, hadamard or values");
      } else if (key == "sym") {
        if (!ParseBool(value, &cc.sym)) return BadValue(item, "sym must be 0 or 1");
      } else if (key == "clip") {
        if (!ParseBool(value, &cc.clip)) return BadValue(item, "clip must be 0 or 1");
      } else {  // prerope
        if (!ParseBool(value, &cc.pre_rope)) return BadValue(item, "prerope must be 0 or 1");
      }
    }
  }
  // A codec named without page, group, residual, rotate and prerope takes
  // its default setting (CodecDefaults) for every key the spec does not name
  // (codec=int2,clip=0 is int2's setting unclipped); a spec that names any of
  // the five keeps the per-key defaults for the others, so a string naming
  // one (every canonical form names page) means what it meant when written.
  if (!seen.count("page") && !seen.count("group") && !seen.count("residual") && !seen.count("rotate") &&
      !seen.count("prerope")) {
    const CodecDefaults d = DefaultsOf(cc.id);
    spec.page_tokens = d.page_tokens;
    if (d.group != 0) cc.group = d.group;
    if (d.residual >= 0) cc.residual = d.residual;
    cc.rotation = d.rotation;
    cc.pre_rope = d.pre_rope;
    if (!seen.count("clip")) cc.clip = d.clip;
    // A default that mixes key channels (the Hadamard rotation; pre-RoPE keys,
    // which RoPE pairs at read time) gives way to a policy that prunes them:
    // codec=int4;policy=think is unrotated int4 with ThinK. Named explicitly,
    // either stays the policy's error.
    if (PrunesKeyChannels(spec.policies)) {
      if (cc.rotation == Rotation::kHadamard) cc.rotation = Rotation::kNone;
      cc.pre_rope = false;
    }
  }
  if (!quant_key.empty() && !IsQuantized(cc.id)) {
    return InvalidArgument("--kv key '" + quant_key + "' needs a quantized codec (int8, int4, int2, kivi4, kivi2); "
                           "codec is " + std::string(CodecName(cc.id)));
  }
  std::sort(cc.layer_bits.begin(), cc.layer_bits.end(),
            [](const LayerBits& a, const LayerBits& b) { return a.first < b.first; });
  for (size_t i = 1; i < cc.layer_bits.size(); ++i) {
    if (cc.layer_bits[i].first <= cc.layer_bits[i - 1].last) {
      return InvalidArgument("--kv per-layer bits overlap at layer " + std::to_string(cc.layer_bits[i].first));
    }
  }
  return spec;
}

Status ValidateKVSpec(const KVSpec& spec, const KVLayout& layout) {
  KVLayout l = layout;
  l.page_tokens = spec.page_tokens;
  return ValidateCodecConfig(l, spec.codec);
}

Result<std::string> ExpandKVSpecArg(std::string_view arg) {
  if (arg.empty() || arg.front() != '@') return std::string(arg);
  const std::string path(arg.substr(1));
  const std::string what = "@" + QuotePrintable(path, 4096);
  if (path.empty()) return InvalidArgument("--kv @FILE needs a file name after '@' (a JSON file from kvx tune -o)");
  auto text = ReadFileToString(path, size_t{1} << 26);
  if (!text.ok()) return InvalidArgument(what + ": " + text.status().message());
  const nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument(what + ": not valid JSON (expected kvx tune's output file)");
  const auto spec = doc.is_object() ? doc.find(kSpecFileKey) : doc.end();
  if (!doc.is_object() || spec == doc.end() || !spec->is_string()) {
    return InvalidArgument(what + ": no string member \"" + std::string(kSpecFileKey) +
                           "\" (expected kvx tune's output file, {\"spec\": \"codec=...\", ...})");
  }
  const std::string spec_text = spec->get<std::string>();
  if (!spec_text.empty() && spec_text.front() == '@') return InvalidArgument(what + ": its spec names another file");
  const Result<KVSpec> parsed = ParseKVSpec(spec_text);
  if (!parsed.ok()) return InvalidArgument(what + ": its spec does not parse: " + parsed.status().message());
  return spec_text;
}

}  // namespace kvx::kv
