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
test_files="test_kernels;test_logits_v2;test_logits_v3;test_fastpath;test_kv_int8;test_api;test_build_options"
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
# One needle_tests process per group (ctest would start one emulated process per test case).
# Run under emulation (slow: the three v2 logits tests take about 50 s of CPU; the times are
# printed per group, per test case in build-arm64/qemu-<group>.log):
#   kernels:*          every kernel of the neon table against scalar; cpu features (HWCAP)
#   logits             logits v2 of tiny, odd and ternary against the upstream reference (every
#                      prompt position and decode step); v3 logits: tiny3 short cases (five:
#                      chat f32 and int8 KV, past the window, past the chunk, a ladder rung)
#   batched            fastpath: short batched == sequential on tiny, odd and ternary; forced ISA
#                      (neon active); build:* (logits bits for n_threads 1 and 4)
#   kv-int8            kv int8 on tiny (error against the reference, batched == one at a time,
#                      kv_type validation)
#   api                api:* but the two below
# Left out as too slow under emulation (the x86 suite runs them natively; CPU time under qemu on
# the 2-core CI machine in brackets where measured):
#   fastpath: batched == sequential: tiny, tiny window overrides, odd (> 190 s), ternary: the
#     short variant above runs the same checks on fewer prompt lengths and chunk sizes;
#   v3 logits: tiny3 cases (> 110 s; all 27 cases, prompts up to 200 tokens; 21 of them took
#     > 230 s): the short variant runs five;
#   batched: the short variant with two prompt lengths per model took > 230 s with build:*;
#   api: CONTEXT_FULL at max_seq_len (fills tiny's 512 and odd's 256 positions twice) and
#     api: batched prefill is bit-identical to unbatched (tiny, odd) (1,000+ positions per
#     model; the short batched group covers it); api:* in all took > 140 s;
#   everything on needle2 (13 MB) and needle3syn (35 MB); isa:* (the whole model under scalar
#   and under neon: kernels:* compares every kernel instead); v3 batched; threads:*; misuse:*
#   (1,000 create/free cycles); corruption:*; the chat, tokenizer and container tests (not
#   arch-specific; their files are not even compiled here, see test_files above).
# The guest's root is the host's: the loader /lib/ld-linux-aarch64.so.1 and every library come
# from the multiarch arm64 packages (libc6:arm64, pulled in by libtbb-dev:arm64), so ld.so and
# libc.so.6 are one glibc build. The cross sysroot (/usr/aarch64-linux-gnu, libc6-arm64-cross) is
# for linking only: its ld.so with the multiarch libc.so.6 (a different Debian revision; ld.so and
# libc share private layouts) looped forever in the first pthread_create, so every run that
# started a oneTBB worker hung (the "17 minutes" and the needle-bench hang of the previous round).
QEMU=(qemu-aarch64 -L /)
TESTS="$BUILD/tests/needle_tests"
# run <label> <number of test cases> <needle_tests arguments...>: writes qemu-<label>.log, .time
# and .rc in $BUILD. A filter that matches fewer test cases than expected fails the group (a
# renamed test would otherwise drop out silently).
run() {
  local label=$1 want=$2 rc=0 TIMEFORMAT='%0R s wall, %0U s user CPU'
  shift 2
  { time "${QEMU[@]}" "$TESTS" --no-version --duration=true "$@" >"$BUILD/qemu-$label.log" 2>&1 \
      || rc=$?; } 2>"$BUILD/qemu-$label.time"
  if ! grep -qE "test cases: +$want \|" "$BUILD/qemu-$label.log"; then
    echo "cross-arm64: $label: expected $want test cases" >>"$BUILD/qemu-$label.log"
    rc=1
  fi
  echo "$rc" >"$BUILD/qemu-$label.rc"
  echo "cross-arm64: $label: $(grep -E '^\[doctest\] test cases' "$BUILD/qemu-$label.log" | sed 's/.*test cases: *//') ($(cat "$BUILD/qemu-$label.time"))"
}
no_needle2='*needle2*'
# NEEDLE_ARM64_QUICK=1 (what .ci/run uses): only the kernels, HWCAP and the v2 logits of tiny,
# odd and ternary (about a minute of CPU under qemu). The later groups (tiny3, batched, int8 KV,
# api) ran more than 17 minutes under qemu on the 2-core machine, past CI's budget.
QUICK=${NEEDLE_ARM64_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  labels=(kernels hwcap-a53 hwcap-n1 logits)
else
  labels=(kernels hwcap-a53 hwcap-n1 logits batched kv-int8 api)
fi
rm -f "$BUILD"/qemu-*.rc
tests_t0=$(date +%s)
run kernels 6 --test-case='kernels:*'
# The dot product is detected from AT_HWCAP: qemu's Cortex-A53 has none, its Neoverse-N1 has it.
QEMU_CPU=cortex-a53 NEEDLE_EXPECT_CPU_FEATURES="neon -asimddp" run hwcap-a53 1 --test-case='kernels: cpu features*'
QEMU_CPU=neoverse-n1 NEEDLE_EXPECT_CPU_FEATURES="neon asimddp" run hwcap-n1 1 --test-case='kernels: cpu features*'
if [ "$QUICK" = 1 ]; then
  run logits 3 --test-case='logits v2: tiny*,logits v2: odd*,logits v2: ternary*'
else
# Two emulated processes at a time (one per core).
run logits 4 --test-case='logits v2: tiny*,logits v2: odd*,logits v2: ternary*,v3 logits: tiny3 short*' &
run batched 3 --test-case='fastpath: short batched*,fastpath: forced*,build:*' &
wait
run kv-int8 3 --test-case='kv int8*' --test-case-exclude="$no_needle2" &
run api 15 --test-case='api:*' \
    --test-case-exclude="$no_needle2,api: CONTEXT_FULL*,api: batched prefill is bit-identical to unbatched (tiny, odd)" &
wait
fi
echo "cross-arm64: tests under qemu: $(( $(date +%s) - tests_t0 )) s wall"
# The NEON path against the references, per fixture model (the logits tests' own messages).
sed -nE 's/.*MESSAGE: (tiny|odd|ternary): max \|logit - ref\| over all prompts = (.*)/\1 \2 (vs upstream)/p
         s/.*MESSAGE: (tiny3 (f32|int8)): max \|dlogit\| (.*)/\1 \3 (vs the peer)/p' "$BUILD/qemu-logits.log" |
  sed 's/^/cross-arm64: NEON max |logit - ref|: /'
failed=0
for l in "${labels[@]}"; do
  if [ "$(cat "$BUILD/qemu-$l.rc" 2>/dev/null)" != 0 ]; then
    failed=$((failed + 1))
    echo "cross-arm64: $l FAILED:"
    tail -n 30 "$BUILD/qemu-$l.log"
  fi
done
# needle-bench under qemu ran past 10 minutes on tiny (32 + 8 tokens) in this round: not in the
# quick set until that is understood.
if [ "$QUICK" != 1 ] && ! "${QEMU[@]}" "$BUILD/needle-bench" --model "$ROOT/../shared/fixtures/v2/models/tiny.cact" \
     --prompt-tokens 32 --decode-tokens 8 --runs 1 >"$BUILD/qemu-bench.log" 2>&1; then
  failed=$((failed + 1))
  tail -n 5 "$BUILD/qemu-bench.log"
fi
echo "cross-arm64: needle-bench under qemu: exit 0 unless counted below"
if [ $failed -ne 0 ]; then
  echo "cross-arm64: $failed group(s) FAILED"
  exit 1
fi
echo "cross-arm64: all groups passed"
