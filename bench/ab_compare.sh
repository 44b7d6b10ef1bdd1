#!/usr/bin/env bash
# Compares two builds on the reference trainer (4 pipelines, dim 8, 2 shards),
# alternating them round by round, because on a shared 2-core machine only
# side-by-side figures mean anything.
#   bench/ab_compare.sh server  A/ember-server  B/ember-server [trainer flags...]  # shards' CPU ms per step
#   bench/ab_compare.sh trainer A/ember-trainer B/ember-trainer  # steps/s, prefetch on
#   bench/ab_compare.sh build   A_BUILD_DIR     B_BUILD_DIR [trainer flags...]
#   bench/ab_compare.sh flags   "A FLAGS"       "B FLAGS"   [trainer flags...]
#   bench/ab_compare.sh shard-flags "A FLAGS"   "B FLAGS"   [trainer flags...]
#   bench/ab_compare.sh dims    8,32,128,256    [trainer flags...]
#   bench/ab_compare.sh lookup-dims 8,32,128,256 [ember-lookup-bench flags...]
# `server` and `trainer` take the other program from $EMBER_BUILD_DIR
# (default build/). `build` runs each build's own ember-server and
# ember-trainer (e.g. a checkout of an older commit built into its own
# directory): per round and build, the prefetch-on rows (steps/s, efficiency,
# wait p99, trainer CPU) and the CPU per pipeline-step of the trainer, of
# the shards (from /proc, so older builds are measured the same way) and of
# both, and at the end each variant's means and their ratios to the first
# variant's. `flags` does the same with one build ($EMBER_BUILD_DIR) and two
# sets of trainer flags (e.g. "--exchange_streams=false" "--exchange_streams=true").
# `shard-flags` is `flags` with the two sets given to the shards instead
# (e.g. "--rpc_mode=sync" "--rpc_mode=async"). $EMBER_SHARD_FLAGS, if set,
# goes to every shard of every mode (e.g. --rpc_mode=sync for `build`).
# `dims` is `flags` with one variant per embedding dim (--dim=D), and ends
# with each dim's mean CPU per pipeline-step and its ratio to the first dim's.
# `lookup-dims` alternates ember-lookup-bench runs of one round each, one per
# dim on a fresh cluster, and ends with each dim's mean CPU per step request
# (bench client + shards) of the streamed lookups and of the pushes, 4
# pipelines, and their ratios to the first dim's.
# Rounds: $EMBER_ROUNDS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="$1"
if [ "$MODE" = dims ] || [ "$MODE" = lookup-dims ]; then
  IFS=, read -ra VARIANTS <<<"$2"
  shift 2
else
  VARIANTS=("$2" "$3")
  shift 3
fi
declare -A CPU_SUM=() TRAINER_SUM=() SHARDS_SUM=() LOOKUP_SUM=() PUSH_SUM=()
ROUNDS="${EMBER_ROUNDS:-3}"
BUILD="${EMBER_BUILD_DIR:-build}"
read -ra SHARD_FLAGS <<<"${EMBER_SHARD_FLAGS:-}"
source scripts/local_cluster.sh

shard_ticks() {  # utime + stime of the shards, in clock ticks
  local t=0 pid
  for pid in "${SHARD_PIDS[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  echo "$t"
}
HZ=$(getconf CLK_TCK)

for ((round = 1; round <= ROUNDS; round++)); do
  for bin in "${VARIANTS[@]}"; do
    if [ "$MODE" = server ]; then
      EMBER_SERVER_BIN="$bin" start_shards 2 --worker_threads=4 "${SHARD_FLAGS[@]}" >/dev/null
      trainer="$BUILD/bench/ember-trainer"
      "$trainer" --shards="$SHARD_ADDRESSES" --seconds=2 --compute_ms=1 --warmup_seconds=3 "$@" \
        >/dev/null
      before=$(shard_ticks)
      rows=$("$trainer" --shards="$SHARD_ADDRESSES" --seconds=4 --compute_ms=1 \
        --warmup_seconds=0 "$@" | grep -E '\| prefetch o(n|ff) \|')
      after=$(shard_ticks)
      steps=$(echo "$rows" | awk -F'|' '{s += $5 * 4} END {print s}')
      echo "round $round $bin: shards' CPU $(( (after - before) * 1000 / HZ )) ms" \
        "for $steps steps = $(awk -v t=$((after - before)) -v s="$steps" -v hz="$HZ" \
        'BEGIN {printf "%.3f", t * 1000 / hz / s}') ms/step"
    elif [ "$MODE" = build ] || [ "$MODE" = flags ] || [ "$MODE" = dims ] ||
      [ "$MODE" = shard-flags ]; then
      shard_flags=("${SHARD_FLAGS[@]}")
      if [ "$MODE" = build ]; then
        dir="$bin"; flags=()
      elif [ "$MODE" = dims ]; then
        dir="$BUILD"; flags=("--dim=$bin")
      elif [ "$MODE" = shard-flags ]; then
        dir="$BUILD"; flags=(); read -ra more <<<"$bin"; shard_flags+=("${more[@]}")
      else
        dir="$BUILD"; read -ra flags <<<"$bin"
      fi
      EMBER_SERVER_BIN="$dir/server/ember-server" start_shards 2 --worker_threads=4 \
        "${shard_flags[@]}" >/dev/null
      trainer="$dir/bench/ember-trainer"
      # Warm the tables first, untimed, so that both builds serve hot keys.
      "$trainer" --shards="$SHARD_ADDRESSES" --seconds=1 --compute_ms=1 --warmup_seconds=3 \
        ${flags[@]+"${flags[@]}"} "$@" >/dev/null
      before=$(shard_ticks)
      out=$("$trainer" --shards="$SHARD_ADDRESSES" --seconds=4 --pipelines=4 \
        --compute_ms=0.5,1 --warmup_seconds=0 ${flags[@]+"${flags[@]}"} "$@")
      after=$(shard_ticks)
      rows=$(echo "$out" | grep -E '\| prefetch o(n|ff) \|')
      # Columns: 5 steps/s, 7 wait mean, 8 wait p99, 9 efficiency, 13 trainer CPU ms/step.
      steps=$(echo "$rows" | awk -F'|' '{s += $5 * 4} END {print s}')
      trainer_cpu=$(echo "$rows" | awk -F'|' '{c += $13 * $5 * 4; s += $5 * 4} END {printf "%.3f", c / s}')
      shards_cpu=$(awk -v t=$((after - before)) -v s="$steps" -v hz="$HZ" \
        'BEGIN {printf "%.3f", t * 1000 / hz / s}')
      echo "round $round $bin:"
      echo "$rows" | grep 'prefetch on' | awk -F'|' '{printf "  compute %s prefetch on: %s steps/s, efficiency %s, wait p99 %s ms, trainer CPU %s ms/step\n", $3, $5, $9, $8, $13}'
      total=$(awk -v a="$trainer_cpu" -v b="$shards_cpu" 'BEGIN {printf "%.3f", a + b}')
      echo "  CPU per pipeline-step over both modes: trainer $trainer_cpu ms + shards $shards_cpu ms" \
        "= $total ms"
      CPU_SUM[$bin]=$(awk -v a="${CPU_SUM[$bin]:-0}" -v b="$total" 'BEGIN {print a + b}')
      TRAINER_SUM[$bin]=$(awk -v a="${TRAINER_SUM[$bin]:-0}" -v b="$trainer_cpu" 'BEGIN {print a + b}')
      SHARDS_SUM[$bin]=$(awk -v a="${SHARDS_SUM[$bin]:-0}" -v b="$shards_cpu" 'BEGIN {print a + b}')
    elif [ "$MODE" = lookup-dims ]; then
      start_shards 2 --worker_threads=4 "${SHARD_FLAGS[@]}" >/dev/null
      out=$("$BUILD/bench/ember-lookup-bench" --shards="$SHARD_ADDRESSES" --dim="$bin" \
        --pipelines=4 --rounds=1 "$@")
      # Column 10: CPU ms per step request (bench client + shards).
      lookup=$(echo "$out" | awk -F'|' '$3 ~ /Ember lookup on ExchangeStream/ {gsub(/ /, "", $10); print $10}')
      push=$(echo "$out" | awk -F'|' '$3 ~ /Ember Push/ {gsub(/ /, "", $10); print $10}')
      echo "round $round dim $bin: CPU ms per step request: streamed lookup $lookup, push $push"
      LOOKUP_SUM[$bin]=$(awk -v a="${LOOKUP_SUM[$bin]:-0}" -v b="$lookup" 'BEGIN {print a + b}')
      PUSH_SUM[$bin]=$(awk -v a="${PUSH_SUM[$bin]:-0}" -v b="$push" 'BEGIN {print a + b}')
    else
      start_shards 2 --worker_threads=4 "${SHARD_FLAGS[@]}" >/dev/null
      echo "round $round $bin:"
      "$bin" --shards="$SHARD_ADDRESSES" --seconds=4 --pipelines=4 --compute_ms=1,5 \
        --warmup_seconds=2 | grep -E '\| prefetch on \|'
    fi
    stop_cluster >/dev/null
  done
done
if [ "$MODE" = dims ]; then
  first="${VARIANTS[0]}"
  echo "dim | CPU ms per pipeline-step (mean of $ROUNDS rounds) | vs dim $first"
  for d in "${VARIANTS[@]}"; do
    awk -v d="$d" -v s="${CPU_SUM[$d]}" -v f="${CPU_SUM[$first]}" -v r="$ROUNDS" \
      'BEGIN {printf "%s | %.3f | %.2fx\n", d, s / r, s / f}'
  done
fi
if [ "$MODE" = build ] || [ "$MODE" = flags ] || [ "$MODE" = shard-flags ]; then
  first="${VARIANTS[0]}"
  echo "variant | trainer | shards | total: CPU ms per pipeline-step, means of $ROUNDS rounds | vs the first (total, trainer, shards)"
  for v in "${VARIANTS[@]}"; do
    awk -v v="$v" -v t="${TRAINER_SUM[$v]}" -v s="${SHARDS_SUM[$v]}" -v c="${CPU_SUM[$v]}" \
      -v ft="${TRAINER_SUM[$first]}" -v fs="${SHARDS_SUM[$first]}" -v fc="${CPU_SUM[$first]}" \
      -v r="$ROUNDS" 'BEGIN {printf "%s | %.3f | %.3f | %.3f | %.2f, %.2f, %.2f\n", v, t / r, s / r,
        c / r, c / fc, t / ft, s / fs}'
  done
fi
if [ "$MODE" = lookup-dims ]; then
  first="${VARIANTS[0]}"
  echo "dim | lookup CPU ms per step request | vs dim $first | push CPU ms per step request | vs dim $first (means of $ROUNDS rounds)"
  for d in "${VARIANTS[@]}"; do
    awk -v d="$d" -v l="${LOOKUP_SUM[$d]}" -v lf="${LOOKUP_SUM[$first]}" -v p="${PUSH_SUM[$d]}" \
      -v pf="${PUSH_SUM[$first]}" -v r="$ROUNDS" \
      'BEGIN {printf "%s | %.3f | %.2fx | %.3f | %.2fx\n", d, l / r, l / lf, p / r, p / pf}'
  done
fi
