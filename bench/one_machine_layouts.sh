#!/usr/bin/env bash
# One machine, 4 trainer pipelines, three layouts side by side, round by
# round: (a) one trainer process with 4 merged pipelines and the 2 shards in
# its process (--shards=inproc:2); (b) the same process against 2 shard
# servers on 127.0.0.1; (c) two trainer processes of 2 merged pipelines
# each (as PyTorch DDP runs one process per GPU, which cannot share
# in-process shards) against the 2 shard servers. Staleness 1, 1 ms of
# compute, dim 8; prints each round's steps/s over all pipelines and the
# mean efficiency, then the medians. Issue 34's multi-process measurement.
#   bash bench/one_machine_layouts.sh        # ROUNDS=3 SECONDS_PER_RUN=4
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-4}"
BUILD="${EMBER_BUILD_DIR:-build}"

source scripts/local_cluster.sh
OUT="$CLUSTER_DIR/layouts.txt"
: >"$OUT"
trainer() {  # trainer PIPELINES SHARDS WORKER_BASE: the prefetch-on row
  "$BUILD/bench/ember-trainer" --shards="$2" --pipelines="$1" --worker_id_base="$3" \
    --seconds="$SECONDS_PER_RUN" --warmup_seconds=2 --compute_ms=1 --staleness=1 --dim=8 \
    --modes=no_embeddings,on | grep -E '^\| [0-9]+ \| 1 ms \| prefetch on'
}
for ((round = 1; round <= ROUNDS; round++)); do
  # Columns of a row: | pipelines | compute | mode | steps/s | step ms | wait | p99 | efficiency | ...
  row=$(trainer 4 inproc:2 0)
  echo "$row" | awk -F'|' -v r="$round" '{printf "%s|in-process, 1 process x 4|%s|%s\n", r, $5, $9}' | tee -a "$OUT"
  start_shards 2 --worker_threads=4 >/dev/null
  row=$(trainer 4 "$SHARD_ADDRESSES" 0)
  echo "$row" | awk -F'|' -v r="$round" '{printf "%s|servers, 1 process x 4|%s|%s\n", r, $5, $9}' | tee -a "$OUT"
  trainer 2 "$SHARD_ADDRESSES" 1000 >"$CLUSTER_DIR/a.txt" &
  first=$!
  trainer 2 "$SHARD_ADDRESSES" 2000 >"$CLUSTER_DIR/b.txt"
  wait "$first"
  cat "$CLUSTER_DIR/a.txt" "$CLUSTER_DIR/b.txt" |
    awk -F'|' -v r="$round" '{s += $5; e += $9} END {printf "%s|servers, 2 processes x 2|%s|%.3f\n", r, s, e / 2}' |
    tee -a "$OUT"
  stop_cluster >/dev/null
done

echo
echo "Medians over $ROUNDS rounds (4 pipelines in all, 1 ms of compute, staleness 1):"
echo "| layout | steps/s (all pipelines) | efficiency |"
echo "| --- | --- | --- |"
awk -F'|' -f bench/median.awk -f /dev/stdin "$OUT" <<'AWK'
  { if (!($2 in n)) order[++k] = $2
    rate[$2, ++n[$2]] = $3 + 0; eff[$2, n[$2]] = $4 + 0 }
  END {
    for (i = 1; i <= k; i++)
      printf "| %s | %.0f | %.3f |\n", order[i], median(rate, order[i], n[order[i]]),
             median(eff, order[i], n[order[i]])
  }
AWK
