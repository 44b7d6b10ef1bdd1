#!/usr/bin/env bash
# Compares two builds of ember-server or of ember-trainer on the reference
# trainer (4 pipelines, dim 8), alternating them round by round, because on a
# shared 2-core machine only side-by-side figures mean anything.
#   bench/ab_compare.sh server  A/ember-server  B/ember-server   # shards' CPU ms per step
#   bench/ab_compare.sh trainer A/ember-trainer B/ember-trainer  # steps/s, prefetch on
# The other program comes from $EMBER_BUILD_DIR (default build/). The build
# comparisons quoted in docs/ were measured this way, 3 rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="$1"; A="$2"; B="$3"
ROUNDS="${EMBER_ROUNDS:-3}"
BUILD="${EMBER_BUILD_DIR:-build}"
source scripts/local_cluster.sh

shard_ticks() {  # utime + stime of the shards, in clock ticks
  local t=0 pid
  for pid in "${SHARD_PIDS[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  echo "$t"
}

for ((round = 1; round <= ROUNDS; round++)); do
  for bin in "$A" "$B"; do
    if [ "$MODE" = server ]; then
      EMBER_SERVER_BIN="$bin" start_shards 2 --worker_threads=4 >/dev/null
      trainer="$BUILD/bench/ember-trainer"
      "$trainer" --shards="$SHARD_ADDRESSES" --seconds=2 --compute_ms=1 --warmup_seconds=3 >/dev/null
      before=$(shard_ticks)
      rows=$("$trainer" --shards="$SHARD_ADDRESSES" --seconds=4 --compute_ms=1 \
        --warmup_seconds=0 | grep -E '\| prefetch o(n|ff) \|')
      after=$(shard_ticks)
      steps=$(echo "$rows" | awk -F'|' '{s += $5 * 4} END {print s}')
      echo "round $round $bin: shards' CPU $(( (after - before) * 1000 / $(getconf CLK_TCK) )) ms" \
        "for $steps steps = $(awk -v t=$((after - before)) -v s="$steps" -v hz="$(getconf CLK_TCK)" \
        'BEGIN {printf "%.3f", t * 1000 / hz / s}') ms/step"
    else
      start_shards 2 --worker_threads=4 >/dev/null
      echo "round $round $bin:"
      "$bin" --shards="$SHARD_ADDRESSES" --seconds=4 --pipelines=4 --compute_ms=1,5 \
        --warmup_seconds=2 | grep -E '\| prefetch on \|'
    fi
    stop_cluster >/dev/null
  done
done
