#!/usr/bin/env bash
# The main job: builds Ember, starts a local 2-shard cluster on the CPU store
# (127.0.0.1, ports chosen at run time), runs the reference trainer
# (WORKLOAD.md: 4 step pipelines, then 1, 17 Zipf features, dim 8) with simulated
# compute of 0, 1 and 5 ms, each with no embeddings, prefetch off and
# prefetch on, at staleness 1 and then at staleness 0 (synchronous: plain,
# and with the early fetch that brings the next step's rows forward
# exactly), prints steps/s, the exposed embedding wait per step and the
# efficiency, then the two side by side, and stops the cluster with SIGTERM.
# Then the same trainer with the shards in its own process (--shards=inproc:N:
# the same shard code, no network), and both ways side by side: efficiency,
# and the CPU a pipeline-step costs trainer and shards together.
# About six minutes.
#   bash examples/run_local_cluster.sh
#   EMBER_SECONDS=10 EMBER_SHARDS=3 bash examples/run_local_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SHARDS="${EMBER_SHARDS:-2}"
SECONDS_PER_RUN="${EMBER_SECONDS:-4}"

bash deploy/install-deps.sh
EMBER_TARGETS="ember-server ember-trainer" bash scripts/build.sh

source scripts/local_cluster.sh
start_shards "$SHARDS" --worker_threads=4
trainer() {
  "${EMBER_BUILD_DIR:-build}/bench/ember-trainer" --seconds="$SECONDS_PER_RUN" --pipelines=4,1 \
    --dim=8 "$@"
}
echo "== staleness 1: the fetch of step t + 1 overlaps step t"
trainer --shards="$SHARD_ADDRESSES" --compute_ms=0,1,5 --staleness=1 | tee "$CLUSTER_DIR/s1.txt"
echo
echo "== staleness 0 (synchronous): every step sees every earlier push"
trainer --shards="$SHARD_ADDRESSES" --compute_ms=1,5 --staleness=0 | tee "$CLUSTER_DIR/s0.txt"
stop_cluster
echo
echo "== the same with $SHARDS shards in the trainer's process (--shards=inproc:$SHARDS), staleness 1"
trainer --shards="inproc:$SHARDS" --compute_ms=1,5 --staleness=1 | tee "$CLUSTER_DIR/p1.txt"
echo
echo "== in the trainer's process, staleness 0"
trainer --shards="inproc:$SHARDS" --compute_ms=1,5 --staleness=0 | tee "$CLUSTER_DIR/p0.txt"

# Efficiency (no-embedding step time / step time) of the two runs' rows,
# side by side; the tables' columns: | pipelines | compute | mode | ... |
# efficiency is the 9th field.
echo
echo "Synchronous training beside staleness 1, shard servers and shards in the trainer's process"
echo "(efficiency: 1 = embeddings cost nothing; CPU: trainer and shards together, ms per pipeline-step):"
echo "| pipelines | compute | servers: s = 1 | s = 0 plain | s = 0 early fetch | CPU at s = 1 |" \
  "in-process: s = 1 | s = 0 plain | s = 0 early fetch | CPU at s = 1 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
# The tables' columns: | pipelines | compute | mode | ... efficiency is the
# 9th field, total CPU ms/step the 15th.
awk -F'|' '
  FNR == 1 { file++ }
  $4 ~ /prefetch on|early fetch/ && $3 !~ /^ *0 ms/ {
    key = $2 "|" $3; mode = $4; gsub(/^ +| +$/, "", mode)
    eff[file, key, mode] = $9; cpu[file, key, mode] = $15
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
  }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]
      printf "|%s| %s | %s | %s | %s | %s | %s | %s | %s |\n", k,
             eff[1, k, "prefetch on"], eff[2, k, "prefetch on"], eff[2, k, "early fetch"],
             cpu[1, k, "prefetch on"], eff[3, k, "prefetch on"], eff[4, k, "prefetch on"],
             eff[4, k, "early fetch"], cpu[3, k, "prefetch on"]
    }
  }' "$CLUSTER_DIR/s1.txt" "$CLUSTER_DIR/s0.txt" "$CLUSTER_DIR/p1.txt" "$CLUSTER_DIR/p0.txt"
