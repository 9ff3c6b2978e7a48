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
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchain-aarch64-linux.cmake" >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target needle needle_tests needle-bench

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
# Run under emulation (about 20-50x slower than native):
#   kernels:*          every kernel of the neon table against scalar, cpu features
#   logits v2 tiny/odd/ternary, fastpath: batched == sequential: odd, forced ISA (neon active),
#   kv int8 (tiny, its batched == sequential too), api:* (batched == unbatched on tiny and odd),
#   build:* (logits bits for n_threads 1 and 4)
# Left out as too slow under emulation (the x86 suite runs them natively):
#   everything on the 13 MB needle2 model (logits, batched, kv int8, n_threads), threads:*,
#   fastpath: batched == sequential: tiny, tiny window overrides, ternary (minutes each under
#   qemu's NEON emulation; the kernel-level matvec == matmul test covers every width),
#   misuse:* (1,000 create/free cycles), corruption:*, the chat grammar tests (not arch-specific).
QEMU=(qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu:/lib/aarch64-linux-gnu)
TESTS="$BUILD/tests/needle_tests"
run() {  # <label> <needle_tests arguments...>: writes qemu-<label>.log and .rc in $BUILD
  local label=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "${QEMU[@]}" "$TESTS" --no-version "$@" >"$BUILD/qemu-$label.log" 2>&1 || rc=$?
  # A filter matching no test case would pass silently.
  if grep -qE "test cases: +0 \|" "$BUILD/qemu-$label.log"; then rc=1; fi
  echo "$rc" >"$BUILD/qemu-$label.rc"
  echo "cross-arm64: $label: $(grep -E '^\[doctest\] test cases' "$BUILD/qemu-$label.log" | sed 's/.*test cases: *//') ($(( $(date +%s) - t0 )) s)"
}
no_needle2='*needle2*'
labels=(kernels hwcap-a53 hwcap-n1 logits batched kv-int8 api)
rm -f "$BUILD"/qemu-*.rc
run kernels --test-case='kernels:*'
# The dot product is detected from AT_HWCAP: qemu's Cortex-A53 has none, its Neoverse-N1 has it.
QEMU_CPU=cortex-a53 NEEDLE_EXPECT_CPU_FEATURES="neon -asimddp" run hwcap-a53 --test-case='kernels: cpu features*'
QEMU_CPU=neoverse-n1 NEEDLE_EXPECT_CPU_FEATURES="neon asimddp" run hwcap-n1 --test-case='kernels: cpu features*'
# Two emulated processes at a time (one per core).
run logits --test-case='logits v2: tiny*,logits v2: odd*,logits v2: ternary*,logits v3*' --test-case-exclude="$no_needle2" &
run batched --test-case='fastpath: batched == sequential: odd,fastpath: forced*' &
wait
run kv-int8 --test-case='kv int8*' --test-case-exclude="$no_needle2" &
run api --test-case='api:*,build:*' --test-case-exclude="$no_needle2" &
wait
failed=0
for l in "${labels[@]}"; do
  if [ "$(cat "$BUILD/qemu-$l.rc" 2>/dev/null)" != 0 ]; then
    failed=$((failed + 1))
    echo "cross-arm64: $l FAILED:"
    tail -n 30 "$BUILD/qemu-$l.log"
  fi
done
if ! "${QEMU[@]}" "$BUILD/needle-bench" --model "$ROOT/../shared/fixtures/v2/models/tiny.cact" \
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
