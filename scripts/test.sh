#!/usr/bin/env bash
# Runs the whole test suite:
#   1. the Release build: unit + integration tests (integration tests skip
#      with a message when ../shared is absent);
#   2. one clang ASan+UBSan build: the unit tests, then a short libFuzzer run
#      of every fuzz target;
#   3. a ThreadSanitizer build of only the tests with threads of their own
#      (ctest label `threads`: the scheduler, the server, the thread pool).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

echo "== Release build: all tests"
scripts/build.sh
ctest --test-dir build -j "$JOBS" --output-on-failure

# One sanitizer build serves both: clang with ASan+UBSan, the libraries also
# instrumented for libFuzzer's coverage (-fsanitize=fuzzer-no-link; the ASan
# runtime supplies the coverage callbacks when no fuzzer is linked), so the
# libraries compile once for the unit tests and the fuzz targets. Line tables
# only: stack traces keep file:line, compiling skips full debug info.
echo "== ASan+UBSan build (clang): unit tests (labels unit and threads), then libFuzzer smoke runs"
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DKVX_SANITIZE=ON -DKVX_FUZZ=ON -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$JOBS" --target kvx_unit_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L 'unit|threads' -j "$JOBS" --output-on-failure

for src in fuzz/*_fuzz.cc; do
  name=$(basename "$src" .cc)
  cmake --build build-asan -j "$JOBS" --target "$name"
  corpus="fuzz/corpus/${name%_fuzz}"
  mkdir -p build-asan/corpus-"$name"
  ./build-asan/"$name" -max_total_time=20 -print_final_stats=0 \
    build-asan/corpus-"$name" $( [ -d "$corpus" ] && echo "$corpus" ) 2>&1 | tail -n 3
done

echo "== TSan build: tests with threads of their own"
# Release (no -g) keeps this stage's compile small; reports still name the
# functions; rebuild with RelWithDebInfo for line numbers.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_TSAN=ON \
  -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j "$JOBS" --target kvx_threads_tests
# tests/tsan.supp: races inside Debian's uninstrumented cpp-httplib only.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir build-tsan -L threads --no-tests=error -j "$JOBS" --output-on-failure
echo "== all tests passed"
