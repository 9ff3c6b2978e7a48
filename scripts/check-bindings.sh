#!/usr/bin/env bash
# Checks the package and the four language bindings against an installed libneedle:
#
#   scripts/check-bindings.sh [BUILD_DIR]      (default: ./build of the repository)
#
# 1. builds the library and demo model in BUILD_DIR (if not already) and runs
#    `cmake --install` into a temporary prefix;
# 2. builds examples/consumer with find_package(needle) and with pkg-config, and runs both;
# 3. runs each binding's tests and its example on the demo model and on tiny.cact, all linked
#    against the installed prefix; then checks that every binding streams the same text as the
#    others (and as needle-run, when BUILD_DIR has it) for the same prompt, temperature and seed.
#
# Installs golang-go, mono-mcs and mono-runtime with apt-get when missing. Prints one line per
# check (plus the tail of the log of a failed one) and ends with "N passed, N failed"; exits
# non-zero when any check failed. Environment: PYTHON (default python3), KEEP_TMP=1 keeps the
# temporary directory.
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$repo/build}" 2>/dev/null && pwd)" || { echo "check-bindings: no build dir ${1:-$repo/build}" >&2; echo "0 passed, 1 failed"; exit 1; }
python="${PYTHON:-python3}"
fixtures="$repo/../shared/fixtures"
tiny="$fixtures/v2/models/tiny.cact"

tmp="$(mktemp -d /tmp/needle-check.XXXXXX)"
[ "${KEEP_TMP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
logs="$tmp/logs"
mkdir -p "$logs"

passed=0
failed=0

# check NAME COMMAND...: runs the command (or shell function) with its output in a log; prints
# ok/FAIL and, on failure, the end of the log.
check() {
  local name="$1"; shift
  local log="$logs/$(echo "$name" | tr -c 'A-Za-z0-9_-' '_').log"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    printf 'ok    %s\n' "$name"
  else
    failed=$((failed + 1))
    printf 'FAIL  %s\n' "$name"
    tail -n 15 "$log" | sed 's/^/      | /'
  fi
}

# Installs Debian packages that provide missing commands.
need() { # need COMMAND PACKAGE...
  command -v "$1" >/dev/null 2>&1 && return 0
  shift
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "check-bindings: installing $*"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"; } >"$logs/apt.log" 2>&1 ||
    { echo "check-bindings: apt-get install $* failed"; tail -n 5 "$logs/apt.log"; }
}
need go golang-go
need mcs mono-mcs
need mono mono-runtime

# ---------------------------------------------------------------- package
check "build libneedle and demo model" cmake --build "$build" --target needle needle_demo_model
check "cmake --install into a temporary prefix" cmake --install "$build" --prefix "$prefix"

libdir="$(dirname "$(find "$prefix" -name 'libneedle.so' -print -quit 2>/dev/null)")"
demo="$prefix/share/needle/needle-demo.cact"
export NEEDLE_LIB_DIR="$libdir" NEEDLE_DEMO_MODEL="$demo" NEEDLE_FIXTURES="$fixtures"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export CGO_CFLAGS="-I$prefix/include" CGO_LDFLAGS="-L$libdir -Wl,-rpath,$libdir"

consumer_cmake() {
  cmake -S "$repo/examples/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" &&
    cmake --build "$tmp/consumer" && "$tmp/consumer/needle-consumer" "$demo"
}
consumer_pkgconfig() {
  mkdir -p "$tmp/consumer-pc" && make -C "$repo/examples/consumer" OUT="$tmp/consumer-pc" &&
    env -u LD_LIBRARY_PATH "$tmp/consumer-pc/needle-consumer" "$demo"
}
check "consumer via find_package(needle)" consumer_cmake
check "consumer via pkg-config" consumer_pkgconfig

# ---------------------------------------------------------------- bindings
# example NAME OUTFILE COMMAND...: runs an example, keeps its output for the comparison below.
example() {
  local out="$2"; shift 2
  "$@" >"$out" && grep -q generated "$out"
}
outs="$tmp/outputs"
mkdir -p "$outs"

cd "$repo"
check "python: unittest" "$python" -m unittest discover -s bindings/python/tests
check "python: example (demo model)" example py "$outs/python.demo" "$python" bindings/python/example.py
check "python: example (tiny.cact)" example py "$outs/python.tiny" "$python" bindings/python/example.py "$tiny"

export CARGO_TARGET_DIR="$tmp/cargo"
cd "$repo/bindings/rust"
check "rust: cargo test --offline" cargo test --offline -q
check "rust: example (demo model)" example rs "$outs/rust.demo" cargo run --offline -q --example generate
check "rust: example (tiny.cact)" example rs "$outs/rust.tiny" cargo run --offline -q --example generate -- "$tiny"

cd "$repo/bindings/go"
check "go: go vet + go test" sh -c 'go vet ./... && go test -count=1 ./...'
check "go: build needle-generate" go build -o "$tmp/needle-generate" ./cmd/needle-generate
check "go: example (demo model)" example go "$outs/go.demo" "$tmp/needle-generate"
check "go: example (tiny.cact)" example go "$outs/go.tiny" "$tmp/needle-generate" "$tiny"

cd "$repo/bindings/csharp"
check "c#: build with mcs" env OUT="$tmp/csharp" ./build.sh
check "c#: test runner" mono "$tmp/csharp/Tests.exe"
check "c#: example (demo model)" example cs "$outs/csharp.demo" mono "$tmp/csharp/Example.exe"
check "c#: example (tiny.cact)" example cs "$outs/csharp.tiny" mono "$tmp/csharp/Example.exe" "$tiny"

# ---------------------------------------------------------------- cross-check
# Every example prints a header line, the streamed text, and a line of figures: the text between
# must be byte-identical across bindings (same prompt, temperature 0.8, seed 7, 32 tokens).
agree() {
  local model ref="" f body
  for model in demo tiny; do
    ref=""
    for f in "$outs"/*."$model"; do
      body="$(sed '1d;$d' "$f" | md5sum)"
      [ -n "$ref" ] || ref="$body"
      [ "$body" = "$ref" ] || { echo "$f differs from the others"; return 1; }
    done
    if [ -x "$build/needle-run" ]; then
      local path="$demo"
      [ "$model" = tiny ] && path="$tiny"
      # stdout is the text alone (the figures line goes to stderr)
      body="$("$build/needle-run" --model "$path" --max-tokens 32 --temperature 0.8 --seed 7 \
              "Once upon a time" 2>/dev/null | md5sum)"
      [ "$body" = "$ref" ] || { echo "needle-run ($model) differs from the bindings"; return 1; }
    fi
    echo "$model: $(ls "$outs"/*."$model" | wc -l) outputs agree"
  done
}
check "examples stream identical text in every binding" agree

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
