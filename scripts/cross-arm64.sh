#!/usr/bin/env bash
# Cross-builds needle for aarch64 Linux into ./build-arm64 and runs the test suite under
# qemu-user (issue 12). Installs what is missing (as root, or with sudo) like setup.sh; safe to
# run again.
#
#   scripts/cross-arm64.sh [--no-tests]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${NEEDLE_ARM64_BUILD:-$ROOT/build-arm64}
JOBS=${NEEDLE_ARM64_JOBS:-$(nproc)}

# ---------------------------------------------------------------- packages
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
apt_install() {
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "$@"
}
# Host side (headers shared by both architectures: xsimd, doctest, nlohmann-json).
packages=(cmake make g++-aarch64-linux-gnu qemu-user binutils-aarch64-linux-gnu libxsimd-dev
          doctest-dev nlohmann-json3-dev)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "cross-arm64: adding the arm64 architecture"
  $sudo dpkg --add-architecture arm64
fi
# xsimd is header-only, but its CMake package lives in the multiarch folder: take the arm64 one.
packages+=(libtbb-dev:arm64 libxsimd-dev:arm64)
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cross-arm64: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# ---------------------------------------------------------------- build
# needle_tests is compiled from only the test files run below (the whole suite would add minutes
# of cross compiling for tests that never run here).
test_files="test_kernels;test_logits_v2;test_logits_v3;test_isa;test_fastpath;test_kv_int8;test_api;test_build_options;test_fast"
build_t0=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DNEEDLE_TEST_FILES="$test_files" \
      -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchain-aarch64-linux.cmake" >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target needle needle_tests needle-bench
echo "cross-arm64: build: $(( $(date +%s) - build_t0 )) s wall"

# Stripped size of libneedle.so (the README states these): aarch64, and x86-64 when ./build has one.
stripped_size() {  # <strip program> <library>
  local tmp
  tmp=$(mktemp)
  "$1" --strip-all -o "$tmp" "$2" && stat -c %s "$tmp"
  rm -f "$tmp"
}
echo "cross-arm64: libneedle.so stripped: aarch64 $(stripped_size aarch64-linux-gnu-strip "$BUILD/libneedle.so") bytes"
if [ -f "$ROOT/build/libneedle.so" ]; then
  echo "cross-arm64: libneedle.so stripped: x86-64 $(stripped_size strip "$ROOT/build/libneedle.so") bytes"
fi
[ "${1:-}" = "--no-tests" ] && exit 0

# ---------------------------------------------------------------- tests under qemu-user
# One needle_tests process per group (ctest would start one emulated process per test case),
# two at a time (one per core). Times are printed per group and per test case (the logs are
# build-arm64/qemu-<group>.log). CPU time under qemu on the shared 2-core dev machine in brackets
# (4.3 min in all; the wall time there depends on the other load):
#   kernels            kernels:*: every kernel of the neon table against scalar (< 1 s); cpu
#                      features from AT_HWCAP under qemu's Cortex-A53 and Neoverse-N1
#   logits             logits v2 of tiny, odd and ternary against the upstream reference (every
#                      prompt position and decode step); v3 logits: all 27 tiny3 cases against
#                      the peer, f32 and int8 KV, ladder rungs (44 s)
#   isa                isa: tiny, odd, ternary: the whole model under scalar and under neon (47 s)
#   batched            fastpath: batched == sequential on tiny (also the window overrides), odd
#                      and ternary; forced ISA (neon active); build:* (logits bits for n_threads
#                      1 and 4) (119 s, the largest group: a lane of its own)
#   kv-int8            kv int8 on tiny (error against the reference, batched == one at a time,
#                      kv_type validation; 18 s)
#   api                api:* (27 s)
#   fast               FAST precision (int8 activations): the neon FAST kernels give the scalar
#                      FAST bits; FAST logits error bounds on tiny, odd, ternary and tiny3;
#                      batched == sequential; the params field (7 cases, needle2/needle3syn out)
#   bench              needle-bench on tiny, 32 prompt + 8 decode tokens, default threads (< 1 s)
# Left out (the x86 suite runs them natively): everything on needle2 (13 MB; its v2 logits alone
# ran past 150 s of CPU under qemu) and needle3syn (35 MB); v3 batched; threads:* (the
# TSan-sized thread stress); misuse:* (1,000 create/free cycles); corruption:*; the chat,
# tokenizer and container tests (not arch-specific; their files are not even compiled here, see
# test_files above).
#
# Each emulated run is bounded so that a hang fails its group instead of eating CI's budget: by
# NEEDLE_ARM64_CPU_LIMIT seconds of CPU (default 400, 3x the largest group; SIGXCPU or SIGKILL:
# a spinning hang, as the loader mismatch below was) and NEEDLE_ARM64_TIMEOUT seconds of wall
# time (default 1800: a sleeping hang; CPU, not wall, is the tight bound because the dev machine
# is shared: the batched group once took 1,104 s of wall time for 119 s of CPU).
# The guest's root is the host's: the loader /lib/ld-linux-aarch64.so.1 and every library come
# from the multiarch arm64 packages (libc6:arm64, pulled in by libtbb-dev:arm64), so ld.so and
# libc.so.6 are one glibc build. The cross sysroot (/usr/aarch64-linux-gnu, libc6-arm64-cross) is
# for linking only: its ld.so with the multiarch libc.so.6 (a different Debian revision; ld.so and
# libc share private layouts) looped forever in the first pthread_create, so every run that
# started a oneTBB worker hung (the "17 minutes" and the needle-bench hang of the previous round).
QEMU=(qemu-aarch64 -L /)
TESTS="$BUILD/tests/needle_tests"
TIMEOUT=${NEEDLE_ARM64_TIMEOUT:-1800}
CPU_LIMIT=${NEEDLE_ARM64_CPU_LIMIT:-400}
# guarded <command...>: the command under both limits.
guarded() { (ulimit -c 0 && ulimit -t "$CPU_LIMIT" && exec timeout "$TIMEOUT" "$@"); }
# run <label> <number of test cases> <needle_tests arguments...>: writes qemu-<label>.log, .time
# and .rc in $BUILD. A filter that matches another number of test cases than expected fails the
# group (a renamed test would otherwise drop out silently).
run() {
  local label=$1 want=$2 rc=0 TIMEFORMAT='%0R s wall, %0U s user CPU'
  shift 2
  { time guarded "${QEMU[@]}" "$TESTS" --no-version --duration=true "$@" >"$BUILD/qemu-$label.log" 2>&1 \
      || rc=$?; } 2>"$BUILD/qemu-$label.time"
  case $rc in
    124) echo "cross-arm64: $label: timed out after $TIMEOUT s of wall time" >>"$BUILD/qemu-$label.log" ;;
    137 | 152) echo "cross-arm64: $label: killed after $CPU_LIMIT s of CPU" >>"$BUILD/qemu-$label.log" ;;
  esac
  if ! grep -qE "test cases: +$want \|" "$BUILD/qemu-$label.log"; then
    echo "cross-arm64: $label: expected $want test cases" >>"$BUILD/qemu-$label.log"
    rc=1
  fi
  echo "$rc" >"$BUILD/qemu-$label.rc"
  echo "cross-arm64: $label: $(grep -E '^\[doctest\] test cases' "$BUILD/qemu-$label.log" | sed 's/.*test cases: *//') ($(tail -n 1 "$BUILD/qemu-$label.time"))"
}
# bench: needle-bench on tiny (the same .log/.time/.rc files as run).
bench() {
  local rc=0 TIMEFORMAT='%0R s wall, %0U s user CPU'
  { time guarded "${QEMU[@]}" "$BUILD/needle-bench" --model "$ROOT/../shared/fixtures/v2/models/tiny.cact" \
      --prompt-tokens 32 --decode-tokens 8 --runs 1 >"$BUILD/qemu-bench.log" 2>&1 || rc=$?; } 2>"$BUILD/qemu-bench.time"
  grep -q "isa neon" "$BUILD/qemu-bench.log" || rc=1
  echo "$rc" >"$BUILD/qemu-bench.rc"
  echo "cross-arm64: bench: exit $rc ($(tail -n 1 "$BUILD/qemu-bench.time"))"
}
no_needle2='*needle2*'
# NEEDLE_ARM64_QUICK=1: only the kernels, HWCAP and the v2 logits of tiny, odd and ternary (about
# half a minute of CPU under qemu), for a quick check by hand; .ci/run runs the whole set.
QUICK=${NEEDLE_ARM64_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  labels=(kernels hwcap-a53 hwcap-n1 logits)
else
  labels=(kernels hwcap-a53 hwcap-n1 logits isa batched kv-int8 api fast bench)
fi
rm -f "$BUILD"/qemu-*.rc
tests_t0=$(date +%s)
run kernels 11 --test-case='kernels:*'
# The dot product is detected from AT_HWCAP: qemu's Cortex-A53 has none, its Neoverse-N1 has it.
QEMU_CPU=cortex-a53 NEEDLE_EXPECT_CPU_FEATURES="neon -asimddp" run hwcap-a53 1 --test-case='kernels: cpu features*'
QEMU_CPU=neoverse-n1 NEEDLE_EXPECT_CPU_FEATURES="neon asimddp" run hwcap-n1 1 --test-case='kernels: cpu features*'
if [ "$QUICK" = 1 ]; then
  run logits 3 --test-case='logits v2: tiny*,logits v2: odd*,logits v2: ternary*'
else
  # Two lanes of about equal CPU: the batched group, and everything else.
  run batched 6 --test-case='fastpath: batched == sequential: *,fastpath: forced*,build:*' \
      --test-case-exclude="$no_needle2" &
  {
    run logits 4 --test-case='logits v2: tiny*,logits v2: odd*,logits v2: ternary*,v3 logits: tiny3 cases*'
    run isa 3 --test-case='isa: *' --test-case-exclude="$no_needle2"
    run kv-int8 3 --test-case='kv int8*' --test-case-exclude="$no_needle2"
    run api 17 --test-case='api:*' --test-case-exclude="$no_needle2"
    run fast 7 --test-case='fast:*' --test-case-exclude="$no_needle2,*needle3syn*"
    bench
  } &
  wait
fi
echo "cross-arm64: tests under qemu: $(( $(date +%s) - tests_t0 )) s wall"
# Every test case with its time (doctest --duration), group by group.
for l in "${labels[@]}"; do
  sed -nE "s/^([0-9]+)\.([0-9]{2})[0-9]* s: (.*)/cross-arm64:   $l: \1.\2 s  \3/p" "$BUILD/qemu-$l.log"
done
# The NEON path against the references, per fixture model (the tests' own messages).
sed -nE 's/.*MESSAGE: (tiny|odd|ternary): max \|logit - ref\| over all prompts = (.*)/\1 \2 (vs upstream)/p
         s/.*MESSAGE: (tiny3 (f32|int8)): max \|dlogit\| (.*)/\1 \3 (vs the peer)/p' "$BUILD/qemu-logits.log" |
  sed 's/^/cross-arm64: NEON max |logit - ref|: /'
[ "$QUICK" = 1 ] || sed -nE 's/.*MESSAGE: ((tiny|odd|ternary): neon vs scalar, max \|d logit\| = .*)/cross-arm64: \1/p' \
  "$BUILD/qemu-isa.log"
failed=0
for l in "${labels[@]}"; do
  if [ "$(cat "$BUILD/qemu-$l.rc" 2>/dev/null)" != 0 ]; then
    failed=$((failed + 1))
    echo "cross-arm64: $l FAILED:"
    tail -n 30 "$BUILD/qemu-$l.log"
  fi
done
if [ $failed -ne 0 ]; then
  echo "cross-arm64: $failed group(s) FAILED"
  exit 1
fi
echo "cross-arm64: all groups passed"
