#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan, no recovery) and runs each for
# a fixed time, seeded from the small checked-in corpus fuzz/corpus/<target>/.
#
#   scripts/fuzz.sh [seconds-per-target]      (default 60)
#
# Environment:
#   NEEDLE_FUZZ_BUILD   build/work folder (default ./build-fuzz): objects, binaries, the growing
#                       working corpus (copied from fuzz/corpus, which is never modified) and
#                       artifacts/<target>/ with every crash, leak, OOM or timeout input.
#   NEEDLE_FUZZ_TARGETS targets to run (default "fuzz_load fuzz_tokenizer fuzz_tokenizer_blob fuzz_grammar
#                       fuzz_chat"; at the default 60 s each, about 5 minutes of fuzzing)
#   NEEDLE_FUZZ_JOBS    parallel compile jobs (default: number of cores)
#   CXX_FUZZ            clang++ to use (default clang++-14, else clang++)
# A finding can be replayed with: build-fuzz/<target> build-fuzz/artifacts/<target>/crash-...
#
# Exit status: 0 when no target found anything, 1 otherwise (2 for a build error).
# The engine is compiled directly here, independent of the CMake build (which uses g++).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${1:-60}
OUT=${NEEDLE_FUZZ_BUILD:-$ROOT/build-fuzz}
TARGETS=${NEEDLE_FUZZ_TARGETS:-"fuzz_load fuzz_tokenizer fuzz_tokenizer_blob fuzz_grammar fuzz_chat"}
JOBS=${NEEDLE_FUZZ_JOBS:-$(nproc)}
find_clang() { command -v clang++-14 || command -v clang++ || true; }
CXX=${CXX_FUZZ:-$(find_clang)}
if [ -z "$CXX" ]; then
  # A fresh CI machine has g++ only: Debian's clang and its sanitizer/libFuzzer runtime.
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "fuzz: installing clang libclang-rt-dev"
  { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang libclang-rt-dev; } >/dev/null ||
    { echo "fuzz: apt-get install clang failed" >&2; exit 2; }
  CXX=$(find_clang)
  [ -n "$CXX" ] || { echo "fuzz: clang++ not found after install" >&2; exit 2; }
fi

SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CXXFLAGS="-std=c++17 -O1 -g $SAN -ffp-contract=off -fno-fast-math -I$ROOT/include -I$ROOT/src -I$ROOT/tools"
XSIMD_INC=""  # xsimd and TBB headers are found in the default include path

mkdir -p "$OUT/obj"

# ---------------------------------------------------------------- compile (only what changed)
# Every engine source, the per-ISA kernels (as the CMake build makes them), the model writer (for
# the tokenizer target's in-memory model) and the targets. "object source" pairs; the flags of
# each object come from flags_for.
units=()
for src in "$ROOT"/src/{core,container,kernels,model,tokenizer,generate,chat,capi}/*.cpp; do
  [ -e "$src" ] || continue
  rel=${src#"$ROOT"/}
  units+=("$OUT/obj/${rel//\//_}.o $src")
done
case "$(uname -m)" in
  x86_64|amd64) ISAS="sse4_2 avx2" ;;
  aarch64|arm64) ISAS="neon" ;;
  *) ISAS="" ;;
esac
for isa in $ISAS; do units+=("$OUT/obj/isa_$isa.o $ROOT/src/kernels/isa/kernels_simd.cpp"); done
for isa in $ISAS; do units+=("$OUT/obj/rowmath_isa_$isa.o $ROOT/src/kernels/isa/kernels_rowmath.cpp"); done
# The FAST (int8) kernels, one object per ISA with the same flags (no AVX-512 here, so no VNNI).
for isa in $ISAS; do units+=("$OUT/obj/i8_isa_$isa.o $ROOT/src/kernels/isa/kernels_i8.cpp"); done
units+=("$OUT/obj/cact_writer.o $ROOT/tools/cact_writer.cpp")
for t in $TARGETS; do units+=("$OUT/obj/$t.o $ROOT/fuzz/$t.cpp"); done

# Any newer header (or this script) rebuilds everything: coarse, but the build is small.
# shellcheck disable=SC2046
newest_dep=$(ls -t $(find "$ROOT/include" "$ROOT/src" "$ROOT/tools" "$ROOT/fuzz" -name '*.h') "$0" | head -1)

compile() {  # "object source"
  local obj=${1%% *} src=${1#* }
  local -a flags=()
  case "$obj" in
    */isa_*.o | */i8_isa_*.o | */rowmath_isa_*.o)
      local isa=${obj##*isa_}; isa=${isa%.o}
      flags=(-DNEEDLE_ISA_NS="isa_$isa" -DNEEDLE_ISA_NAME="\"$isa\"")
      case $isa in
        sse4_2) flags+=(-msse4.2 "-DNEEDLE_XSIMD_ARCH=xsimd::sse4_2") ;;
        avx2) flags+=(-mavx2 -mfma "-DNEEDLE_XSIMD_ARCH=xsimd::fma3<xsimd::avx2>") ;;
        neon) flags+=("-DNEEDLE_XSIMD_ARCH=xsimd::neon64") ;;
      esac ;;
    */cact_writer.o) ;;
    */fuzz_*.o) flags=(-fsanitize=fuzzer-no-link) ;;
    *)
      flags=(-fsanitize=fuzzer-no-link -DNEEDLE_BUILDING_LIBRARY -DNEEDLE_VERSION_STRING='"fuzz"')
      for isa in $ISAS; do flags+=("-DNEEDLE_HAVE_ISA_$isa"); done ;;
  esac
  if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest_dep" ]; then return 0; fi
  echo "fuzz: compiling ${src#"$ROOT"/} -> ${obj##*/}"
  # shellcheck disable=SC2086
  $CXX $CXXFLAGS $XSIMD_INC "${flags[@]}" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"
}
export -f compile
export ROOT CXX CXXFLAGS XSIMD_INC ISAS newest_dep
if ! printf '%s\n' "${units[@]}" | xargs -d '\n' -P "$JOBS" -n 1 bash -c 'compile "$1"' _; then
  echo "fuzz: build failed" >&2
  exit 2
fi

engine_objs=()
for u in "${units[@]}"; do
  obj=${u%% *}
  case "$obj" in */fuzz_*.o) ;; *) engine_objs+=("$obj") ;; esac
done
for t in $TARGETS; do
  if [ ! -x "$OUT/$t" ] || [ -n "$(find "$OUT/obj" -name '*.o' -newer "$OUT/$t" | head -1)" ]; then
    echo "fuzz: linking $t"
    # shellcheck disable=SC2086
    $CXX $SAN -fsanitize=fuzzer "$OUT/obj/$t.o" "${engine_objs[@]}" -ltbb -lpthread -o "$OUT/$t" || exit 2
  fi
done

# ---------------------------------------------------------------- run
passed=0
failed=0
for t in $TARGETS; do
  corpus="$OUT/corpus/$t"
  artifacts="$OUT/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  cp -n "$ROOT/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  before=$(find "$artifacts" -type f | wc -l)
  log="$OUT/$t.log"
  echo "fuzz: running $t for ${SECS}s (corpus $(ls "$corpus" | wc -l) inputs)"
  set +e
  # -rss_limit_mb / -malloc_limit_mb: any single allocation above 2 GB is a finding (validation
  # before allocation); -timeout: one input running over 60 s is a finding.
  dict=()
  dict_file="$ROOT/fuzz/$t.dict"
  # fuzz_chat reads the same (tools_json NUL rest) layout as fuzz_grammar: the same keywords.
  [ "$t" = fuzz_chat ] && dict_file="$ROOT/fuzz/fuzz_grammar.dict"
  [ -f "$dict_file" ] && dict=(-dict="$dict_file")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$OUT/$t" -max_total_time="$SECS" -timeout=60 -rss_limit_mb=3072 -malloc_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  after=$(find "$artifacts" -type f | wc -l)
  findings=$((after - before))
  if [ "$rc" -ne 0 ] || [ "$findings" -gt 0 ]; then
    failed=$((failed + 1))
    echo "fuzz: $t: FAILED (exit $rc), ${execs:-?} executions, $findings new finding(s) in $artifacts; log $log"
    grep -E '^==[0-9]+==ERROR|runtime error|fuzz invariant broken|^SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/  /'
  else
    passed=$((passed + 1))
    echo "fuzz: $t: ok, ${execs:-?} executions, coverage ${cov:-?} edges, 0 findings"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
