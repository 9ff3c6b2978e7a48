#!/usr/bin/env bash
# Sanitizer runs of the test suite, each in its own build folder.
#
#   scripts/sanitize.sh [asan|tsan|all]      (default all)
#
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer, part of ASan on Linux),
#         no recovery: the engine, the shared library, the tests and every link are instrumented.
#         Runs ctest, excluding only (the reason: run time, and they test nothing ASan-specific
#         that a cheaper case does not):
#           isa.*                     every fixture logits test again under each forced ISA
#                                     (4 ISAs x the whole logits suite); the same kernel code
#                                     runs in the plain logits and fastpath tests
#           logits v2: needle2*       the 13 MB model's full reference comparison (tens of
#           fastpath: *needle2*       minutes under ASan); tiny/odd/ternary cover the same code
#           kv int8: *needle2*        paths, and the corruption suite loads and runs needle2
#           chat retrieval: a         needle2 conversations with a tool-selection rebuild and
#             (follow-up|tool-result) a tool-result turn (about 4 and 2 min each under ASan on
#                                     the shared VM); run by hand when the chat layer changes
#   tsan  ThreadSanitizer: the threading tests (threads:*, team:*, and the api tests that use
#         threads). oneTBB is not instrumented, so TSan cannot see its internal synchronisation:
#         the threading tests cap the threads at one under TSan (why: scripts/tsan.supp, which
#         holds one oneTBB-internal suppression); the thread team (src/core/team.cpp) is our code and its tests
#         run it with 2-4 threads.
#
# Environment: NEEDLE_ASAN_BUILD (default ./build-asan), NEEDLE_TSAN_BUILD (./build-tsan),
# NEEDLE_SAN_JOBS (build and ctest parallelism, default: number of cores).
# Exit status 0 only if every selected run passed; the last line is "N passed, N failed"
# (counting ctest entries).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-all}
JOBS=${NEEDLE_SAN_JOBS:-$(nproc)}
passed=0
failed=0

case "$MODE" in asan|tsan|all) ;; *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;; esac

# configure_and_build <dir> <compile flags> <link flags> <targets...>
configure_and_build() {
  local dir=$1 cflags=$2 lflags=$3
  shift 3
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEEDLE_BUILD_EXAMPLES=OFF \
        -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
        -DCMAKE_EXE_LINKER_FLAGS="$lflags" -DCMAKE_SHARED_LINKER_FLAGS="$lflags" \
        -DCMAKE_MODULE_LINKER_FLAGS="$lflags" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  local t
  for t in "$@"; do
    cmake --build "$dir" -j"$JOBS" --target "$t" || return 1
  done
}

# run_ctest <label> <dir> <ctest args...>: adds the ctest entries to the totals.
run_ctest() {
  local label=$1 dir=$2
  shift 2
  local log="$dir/ctest.log"
  (cd "$dir" && ctest --output-on-failure --timeout 3600 -j"$JOBS" "$@") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  # "100% tests passed, 0 tests failed out of 93"
  local line total bad
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [ -n "$line" ]; then
    total=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
    bad=$(echo "$line" | sed -E 's/.*, ([0-9]+) tests failed.*/\1/')
    passed=$((passed + total - bad))
    failed=$((failed + bad))
  fi
  if [ "$rc" -ne 0 ] && { [ -z "$line" ] || [ "$bad" -eq 0 ]; }; then
    failed=$((failed + 1))  # ctest itself failed (no tests found, ...)
  fi
  # A filter that selected nothing proves nothing.
  if [ -n "$line" ] && [ "$total" -eq 0 ]; then failed=$((failed + 1)); fi
  echo "sanitize: $label: ctest exit $rc"
}

if [ "$MODE" = asan ] || [ "$MODE" = all ]; then
  dir=${NEEDLE_ASAN_BUILD:-$ROOT/build-asan}
  san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  echo "sanitize: ASan + UBSan build in $dir"
  if configure_and_build "$dir" "$san" "-fsanitize=address,undefined" needle needle_tests needle_demo_model dlclose_probe; then
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
      run_ctest asan "$dir" -E '^(isa\.|logits v2: needle2|fastpath: .*needle2|kv int8: .*needle2|v3 batched: needle3syn|v3 logits: needle3syn|chat\.upstream_python_client|chat retrieval: a (follow-up|tool-result))'
  else
    echo "sanitize: asan build failed"
    failed=$((failed + 1))
  fi
fi

if [ "$MODE" = tsan ] || [ "$MODE" = all ]; then
  dir=${NEEDLE_TSAN_BUILD:-$ROOT/build-tsan}
  echo "sanitize: TSan build in $dir"
  if configure_and_build "$dir" "-fsanitize=thread -fno-omit-frame-pointer" "-fsanitize=thread" needle_tests needle_demo_model; then
    TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp} \
      run_ctest tsan "$dir" -R '^(threads: |team: |api: one model serves many threads|api: needle_last_error is per thread|api: handles may be freed)'
  else
    echo "sanitize: tsan build failed"
    failed=$((failed + 1))
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
