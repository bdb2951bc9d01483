#include "kv/policy/params.h"

#include <cstdlib>
#include <sstream>

namespace kvx::kv {

bool PolicyParamReader::Seen(std::string_view key, std::string* value) {
  known_.emplace(key);
  if (!error_.ok()) return false;
  auto it = params_.find(key);
  if (it == params_.end()) return false;
  *value = it->second;
  return true;
}

PolicyParamReader& PolicyParamReader::Int(std::string_view key, int* out, int lo, int hi) {
  std::string v;
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

Status PolicyParamReader::Finish() const {
  if (!error_.ok()) return error_;
  for (const auto& [key, value] : params_) {
    if (known_.count(key) != 0) continue;
    std::string list;
    for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
    return InvalidArgument("policy " + policy_ + " has no parameter '" + key + "'; it takes " + list);
  }
  return Status::Ok();
}

}  // namespace kvx::kv
