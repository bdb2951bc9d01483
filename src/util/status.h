// Status and Result<T>: how kvx reports recoverable errors (bad files, bad user
// input, exhausted budgets). A Status carries a code and a message written for
// the user: what is wrong and what to do about it.
//
// Programmer invariants use KVX_CHECK (check.h) instead; library code never
// aborts on user input.
//
// Thread-safety: value types, no shared state.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace kvx {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad user input: flags, specs, prompts
  kNotFound,          // missing file, key, tensor
  kDataLoss,          // truncated or corrupted file
  kUnimplemented,     // valid but unsupported (architecture, type)
  kResourceExhausted, // KV budget / context exhausted
  kIoError,           // OS-level failure
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"; "OK" when ok.
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>" (adds context while
  // an error travels up the stack).
  Status WithContext(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status Unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
inline Status ResourceExhausted(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
inline Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
inline Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from OK status");
    }
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvx

#define KVX_CONCAT_INNER_(a, b) a##b
#define KVX_CONCAT_(a, b) KVX_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define KVX_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kvx::Status kvx_status_ = (expr);        \
    if (!kvx_status_.ok()) return kvx_status_; \
  } while (0)

// KVX_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns
// its error.
#define KVX_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVX_ASSIGN_OR_RETURN_IMPL_(KVX_CONCAT_(kvx_result_, __LINE__), lhs, rexpr)
#define KVX_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
