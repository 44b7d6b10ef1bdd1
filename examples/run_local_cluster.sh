#!/usr/bin/env bash
# The main job: builds Ember, starts a local 2-shard cluster on the CPU store
# (127.0.0.1, ports chosen at run time), runs the reference trainer
# (WORKLOAD.md: 4 step pipelines, then 1, 17 Zipf features, dim 8) with simulated
# compute of 0, 1 and 5 ms, each with no embeddings, prefetch off and
# prefetch on, prints steps/s, the exposed embedding wait per step and the
# efficiency, and stops the cluster with SIGTERM. About two minutes.
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
"${EMBER_BUILD_DIR:-build}/bench/ember-trainer" --shards="$SHARD_ADDRESSES" --seconds="$SECONDS_PER_RUN" \
  --pipelines=4,1 --dim=8 --compute_ms=0,1,5 --staleness=1
stop_cluster
