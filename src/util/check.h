// KVX_CHECK: programmer invariants. A failed check is a bug in kvx, never the
// user's fault, so it prints where and aborts. Never use it on user input;
// return a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace kvx::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "kvx: internal check failed at %s:%d: %s %s\n", file, line, expr, msg ? msg : "");
  std::abort();
}
}  // namespace kvx::internal

#define KVX_CHECK(cond)                                                       \
  do {                                                                        \
    if (!(cond)) ::kvx::internal::CheckFailed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)

#define KVX_CHECK_MSG(cond, msg)                                              \
  do {                                                                        \
    if (!(cond)) ::kvx::internal::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)

#ifdef NDEBUG
#define KVX_DCHECK(cond) do { (void)sizeof(cond); } while (0)
#else
#define KVX_DCHECK(cond) KVX_CHECK(cond)
#endif
