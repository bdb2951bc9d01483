#!/usr/bin/env bash
# Runs the whole test suite:
#   1. the Release build: unit + integration tests (integration tests skip
#      with a message when ../shared is absent);
#   2. an ASan+UBSan build of the unit tests;
#   3. a ThreadSanitizer build of only the tests with threads of their own
#      (ctest label `threads`: the scheduler, the thread pool);
#   4. a short libFuzzer run of every fuzz target (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

echo "== Release build: all tests"
scripts/build.sh
ctest --test-dir build -j "$JOBS" --output-on-failure

echo "== ASan+UBSan build: unit tests (labels unit and threads)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_SANITIZE=ON \
  -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$JOBS" --target kvx_unit_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L 'unit|threads' -j "$JOBS" --output-on-failure

echo "== TSan build: tests with threads of their own"
# Release (no -g) keeps this stage's compile small; reports still name the
# functions; rebuild with RelWithDebInfo for line numbers.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_TSAN=ON \
  -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j "$JOBS" --target kvx_threads_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan -L threads -j "$JOBS" --output-on-failure

if ls fuzz/*_fuzz.cc >/dev/null 2>&1; then
  echo "== libFuzzer smoke runs"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVX_SANITIZE=ON -DKVX_FUZZ=ON -DKVX_BUILD_BENCH=OFF >/dev/null
  for src in fuzz/*_fuzz.cc; do
    name=$(basename "$src" .cc)
    cmake --build build-fuzz -j "$JOBS" --target "$name"
    corpus="fuzz/corpus/${name%_fuzz}"
    mkdir -p build-fuzz/corpus-"$name"
    ./build-fuzz/"$name" -max_total_time=30 -print_final_stats=0 \
      build-fuzz/corpus-"$name" $( [ -d "$corpus" ] && echo "$corpus" ) 2>&1 | tail -n 3
  done
fi
echo "== all tests passed"
