#include "kv/policy/params.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace kvx::kv {

namespace {

std::string NumberText(double x) {
  std::ostringstream m;
  m << x;
  return m.str();
}

}  // namespace

bool PolicyParamReader::Seen(std::string_view key, std::string* value) {
  examples_.emplace(key, "");
  if (!error_.ok()) return false;
  auto it = params_.find(key);
  if (it == params_.end()) return false;
  *value = it->second;
  return true;
}

PolicyParamReader& PolicyParamReader::Int(std::string_view key, int* out, int lo, int hi) {
  std::string v;
  // +2 keeps an odd kernel odd.
  const int example = *out + 2 <= hi && *out + 2 >= lo ? *out + 2 : *out != lo ? lo : hi;
  examples_[std::string(key)] = std::to_string(example);
  if (!Seen(key, &v)) return *this;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || x < lo || x > hi) {
    error_ = InvalidArgument("policy " + policy_ + ": " + std::string(key) + "=" + v + " must be an integer in " +
                             std::to_string(lo) + ".." + std::to_string(hi) + ", e.g. " + std::string(key) + "=" +
                             std::to_string(*out));
    return *this;
  }
  *out = static_cast<int>(x);
  return *this;
}

PolicyParamReader& PolicyParamReader::Double(std::string_view key, double* out, double lo, double hi) {
  std::string v;
  examples_[std::string(key)] = NumberText(*out > lo ? (lo + *out) / 2 : (*out + std::min(hi, *out + 1.0)) / 2);
  if (!Seen(key, &v)) return *this;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(x >= lo && x <= hi)) {
    std::ostringstream m;
    m << "policy " << policy_ << ": " << key << "=" << v << " must be a number in [" << lo << ", " << hi << "], e.g. "
      << key << "=" << *out;
    error_ = InvalidArgument(m.str());
    return *this;
  }
  *out = x;
  return *this;
}

PolicyParamReader& PolicyParamReader::Choice(std::string_view key, std::string* out,
                                             const std::vector<std::string>& choices) {
  std::string v;
  for (const std::string& c : choices) {
    if (c != *out) {
      examples_[std::string(key)] = c;
      break;
    }
  }
  if (!Seen(key, &v)) return *this;
  for (const std::string& c : choices) {
    if (c == v) {
      *out = v;
      return *this;
    }
  }
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  error_ = InvalidArgument("policy " + policy_ + ": " + std::string(key) + "=" + v + " is not one of " + list);
  return *this;
}

PolicyParamReader& PolicyParamReader::Bool(std::string_view key, bool* out) {
  std::string v;
  examples_[std::string(key)] = *out ? "0" : "1";
  if (!Seen(key, &v)) return *this;
  if (v == "1" || v == "true") {
    *out = true;
  } else if (v == "0" || v == "false") {
    *out = false;
  } else {
    error_ = InvalidArgument("policy " + policy_ + ": " + std::string(key) + "=" + v + " must be 0 or 1");
  }
  return *this;
}

PolicyParamReader& PolicyParamReader::Text(std::string_view key, std::string* out) {
  std::string v;
  examples_[std::string(key)] = *out + "x";
  if (!Seen(key, &v)) return *this;
  if (v.empty()) {
    error_ = InvalidArgument("policy " + policy_ + ": " + std::string(key) + "= needs a value");
  } else {
    *out = v;
  }
  return *this;
}

PolicyParamReader& PolicyParamReader::NotApplicable(std::string_view key, std::string why) {
  not_applicable_[std::string(key)] = std::move(why);
  return *this;
}

Status PolicyParamReader::Finish() const {
  if (!error_.ok()) return error_;
  for (const auto& [key, value] : params_) {
    if (examples_.count(key) != 0) continue;
    std::string list;
    for (const auto& [k, example] : examples_) list += (list.empty() ? "" : ", ") + k;
    auto why = not_applicable_.find(key);
    return InvalidArgument("'" + key + "' does not apply to policy " + policy_ +
                           (why != not_applicable_.end() ? " (" + why->second + ")" : "") +
                           "; it takes: " + (list.empty() ? "no parameters" : list));
  }
  return Status::Ok();
}

}  // namespace kvx::kv
