#!/usr/bin/env bash
# Builds the libFuzzer targets with Clang (ASan + UBSan) into build-fuzz/ and
# runs each for a bounded time on its corpus: the seeds fuzz_corpus writes,
# what earlier runs found (build-fuzz/corpus/<target>, kept between runs) and
# the inputs that once failed (tests/fuzz/regressions/<target>, checked in).
# Fails on the first crash, leak, timeout or broken invariant, leaving the
# input as build-fuzz/artifacts/<target>/crash-*. Prints executions and
# coverage per target.
#   bash tests/fuzz/run_fuzzers.sh [seconds per target, default 60] [targets...]
#   bash tests/fuzz/run_fuzzers.sh 1200      # the long run (docs/testing.md)
# Reproduce a finding: build-fuzz/tests/fuzz/<target> <crash file>
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(shard_fuzzer checkpoint_fuzzer table_config_fuzzer wire_fuzzer
  in_place_parse_fuzzer)

CC=clang CXX=clang++ EMBER_BUILD_DIR=build-fuzz EMBER_TARGETS="${TARGETS[*]} fuzz_corpus" \
  bash scripts/build.sh -DEMBER_FUZZ=ON -DEMBER_ENABLE_CUDA=OFF -DEMBER_BUILD_BENCH=OFF \
  -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_PYTHON=OFF >/dev/null
rm -rf build-fuzz/seeds
build-fuzz/tests/fuzz/fuzz_corpus build-fuzz/seeds >/dev/null

summary=()
for t in "${TARGETS[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  log="build-fuzz/artifacts/$t/last_run.log"
  # Inputs that once failed (checked in): run first, like every corpus unit.
  regressions=()
  [ -d "tests/fuzz/regressions/$t" ] && regressions=("tests/fuzz/regressions/$t")
  echo "== fuzzing $t for ${SECONDS_PER_TARGET}s"
  if ! "build-fuzz/tests/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t/" \
      "build-fuzz/corpus/$t" "build-fuzz/seeds/$t" "${regressions[@]}" >"$log" 2>&1; then
    grep -v "^#[0-9]" "$log" | tail -60
    echo "run_fuzzers: $t found a failure; input saved under build-fuzz/artifacts/$t/" >&2
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  feats=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(ls "build-fuzz/corpus/$t" | wc -l)
  summary+=("$(printf '%-20s %12s %10s %8s %9s %8s' "$t" "$execs" "$rate" "$cov" "$feats" "$corpus")")
done
printf '%-20s %12s %10s %8s %9s %8s\n' target executions exec/s edges features corpus
printf '%s\n' "${summary[@]}"
echo "run_fuzzers: no failure in ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET}s each"
