#!/usr/bin/env bash
# Where the CPU goes in the reference workload: `perf record` of the trainer
# and of shard 0 while ember-trainer runs 4 merged pipelines at 1 ms of
# compute (the run the profile shares in docs/ come from).
#   bench/profile.sh [OUT_DIR] [trainer flags...]     e.g. bench/profile.sh /tmp/p --dim=128
# Writes OUT_DIR/{trainer,shard}.data (perf's own files) and
# OUT_DIR/{trainer,shard}.top (the 30 hottest symbols, self time), and prints
# the .top files. $EMBER_BUILD_DIR picks the build (default build/),
# $EMBER_SHARD_FLAGS adds shard flags (e.g. --rpc_mode=sync).
# Needs perf (linux-perf) and permission to attach to one's own processes
# (kernel.perf_event_paranoid <= 2).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-/tmp/ember-profile}"
shift || true
BUILD="${EMBER_BUILD_DIR:-build}"
read -ra SHARD_FLAGS <<<"${EMBER_SHARD_FLAGS:-}"
command -v perf >/dev/null || { echo "profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$OUT"
source scripts/local_cluster.sh
trap 'stop_cluster >/dev/null 2>&1 || true' EXIT
start_shards 2 --worker_threads=4 "${SHARD_FLAGS[@]}" >/dev/null
trainer="$BUILD/bench/ember-trainer"
# Warm the tables, untimed.
"$trainer" --shards="$SHARD_ADDRESSES" --seconds=2 --compute_ms=1 --warmup_seconds=2 "$@" >/dev/null
# The run: three 12 s modes (no embeddings, prefetch off, prefetch on); the
# profile covers 6 s of the last one.
"$trainer" --shards="$SHARD_ADDRESSES" --seconds=12 --compute_ms=1 --pipelines=4 \
  --warmup_seconds=1 "$@" >"$OUT/trainer.txt" 2>&1 &
trainer_pid=$!
sleep 28
perf record -e cpu-clock -g -p "$trainer_pid" -o "$OUT/trainer.data" -- sleep 6 >/dev/null 2>&1 &
perf record -e cpu-clock -g -p "${SHARD_PIDS[0]}" -o "$OUT/shard.data" -- sleep 6 >/dev/null 2>&1
wait "$trainer_pid"
for x in trainer shard; do
  perf report -i "$OUT/$x.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
    grep -E '^ +[0-9]' | cut -c1-140 | head -30 >"$OUT/$x.top" || true
  echo "== $x (self time, top 30; perf report -i $OUT/$x.data for more)"
  cat "$OUT/$x.top"
done
grep -E '\| prefetch on \|' "$OUT/trainer.txt" || true
