#!/usr/bin/env bash
# Synchronous training beside staleness 1, measured side by side: one local
# 2-shard cluster, the reference trainer at --staleness=1 and --staleness=0
# (prefetch off, plain s = 0, early fetch, and the lockstep floor) run in
# alternation, ROUNDS rounds each, then the median efficiency and exposed
# wait of every row over the rounds. Issue 33's measurement.
#   bash bench/sync_bench.sh                 # 3 rounds, 3 s per run
#   ROUNDS=5 SECONDS_PER_RUN=4 bash bench/sync_bench.sh --dim=8
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-3}"
BUILD="${EMBER_BUILD_DIR:-build}"

source scripts/local_cluster.sh
start_shards 2 --worker_threads=4
OUT="$CLUSTER_DIR/rows.txt"
: >"$OUT"
for ((round = 1; round <= ROUNDS; round++)); do
  for s in 1 0; do
    echo "== round $round, staleness $s"
    "$BUILD/bench/ember-trainer" --shards="$SHARD_ADDRESSES" --seconds="$SECONDS_PER_RUN" \
      --warmup_seconds=1 --pipelines=4,1 --compute_ms=1,5 --staleness="$s" "$@" |
      grep -E '^\| [0-9]+ \| [0-9.]+ ms \|' | sed "s/^/| s=$s /" | tee -a "$OUT"
  done
done
stop_cluster

# Rows: | s=S | pipelines | compute | mode | steps/s | step ms | wait mean | wait p99 | efficiency | ...
echo
echo "Medians over $ROUNDS rounds (efficiency: no-embedding step time / step time):"
echo "| staleness | pipelines | compute | mode | efficiency | exposed wait ms mean |"
echo "| --- | --- | --- | --- | --- | --- |"
awk -F'|' -f bench/median.awk -f /dev/stdin "$OUT" <<'AWK'
  { gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $5)
    if ($5 == "no embeddings" || $5 == "prefetch off") next
    key = $2 "|" $3 "|" $4 "|" $5
    if (!(key in n)) order[++keys] = key
    eff[key, ++n[key]] = $10 + 0; wait[key, n[key]] = $8 + 0 }
  END {
    for (i = 1; i <= keys; i++) {
      split(order[i], f, "|")
      printf "| %s | %s | %s | %s | %.3f | %s |\n", f[1], f[2], f[3], f[4],
             median(eff, order[i], n[order[i]]),
             f[4] ~ /lockstep/ ? "-" : sprintf("%.3f", median(wait, order[i], n[order[i]]))
    }
  }
AWK
