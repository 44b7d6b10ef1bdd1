#!/usr/bin/env bash
# The reference benchmark of WORKLOAD.md items 2 and 3 on this machine:
# a local 2-shard cluster and, when redis-server is installed, two Redis
# peers holding the same rows; then
#   ember-lookup-bench  lookup and push over gRPC beside Redis MGET, 1 and 4 pipelines
#   ember-trainer       the reference trainer, compute 0/1/5 ms, prefetch off/on
# Prints both tables. Assumes a build in build/ (scripts/build.sh).
#   bash bench/run_reference_bench.sh
#   EMBER_DIM=32 EMBER_SECONDS=8 bash bench/run_reference_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DIM="${EMBER_DIM:-8}"
SECONDS_PER_RUN="${EMBER_SECONDS:-4}"
EMBER_TARGETS="ember-server ember-trainer ember-lookup-bench" bash scripts/build.sh

source scripts/local_cluster.sh
start_shards 2 --worker_threads=4
redis_flag=""
if command -v redis-server >/dev/null; then
  start_redis 2
  redis_flag="--redis=$REDIS_ADDRESSES"
else
  echo "redis-server not installed: the Redis peer is skipped"
fi
echo "== lookup and push over gRPC (WORKLOAD.md item 2)"
"${EMBER_BUILD_DIR:-build}/bench/ember-lookup-bench" --shards="$SHARD_ADDRESSES" $redis_flag --dim="$DIM"
echo
echo "== the reference trainer (WORKLOAD.md item 3)"
"${EMBER_BUILD_DIR:-build}/bench/ember-trainer" --shards="$SHARD_ADDRESSES" --seconds="$SECONDS_PER_RUN" --dim="$DIM"
stop_cluster
