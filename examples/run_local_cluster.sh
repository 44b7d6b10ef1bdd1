#!/usr/bin/env bash
# The main job: builds Ember, starts a local 2-shard cluster on the CPU store
# (127.0.0.1, ports chosen at run time), drives it with the reference
# workload's tables for a bounded time, prints what it achieved, and stops
# the cluster with SIGTERM.
#   bash examples/run_local_cluster.sh            # 20 s
#   EMBER_SECONDS=60 EMBER_SHARDS=3 bash examples/run_local_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SHARDS="${EMBER_SHARDS:-2}"
SECONDS_TO_RUN="${EMBER_SECONDS:-20}"

bash deploy/install-deps.sh
EMBER_TARGETS="ember-server ember-smoke" bash scripts/build.sh

workdir="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT

addresses=()
for ((i = 0; i < SHARDS; i++)); do
  build/server/ember-server --address=127.0.0.1 --port=0 --shard_index="$i" \
    --shard_count="$SHARDS" --worker_threads=4 \
    >"$workdir/shard$i.out" 2>"$workdir/shard$i.log" &
  pids+=($!)
done
for ((i = 0; i < SHARDS; i++)); do
  for _ in $(seq 1 100); do
    port="$(sed -n 's/^EMBER_READY port=\([0-9]*\)$/\1/p' "$workdir/shard$i.out")"
    [ -n "$port" ] && break
    kill -0 "${pids[$i]}" 2>/dev/null || { cat "$workdir/shard$i.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "shard $i did not start" >&2; exit 1; }
  addresses+=("127.0.0.1:$port")
  echo "shard $i of $SHARDS serving on 127.0.0.1:$port"
done

IFS=, eval 'joined="${addresses[*]}"'
build/bench/ember-smoke --shards="$joined" --seconds="$SECONDS_TO_RUN"

echo "stopping the cluster (SIGTERM)"
for pid in "${pids[@]}"; do kill -TERM "$pid"; done
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then echo "shard $i stopped cleanly"; else echo "shard $i exited with $?" >&2; exit 1; fi
done
pids=()
