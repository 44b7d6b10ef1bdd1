#!/usr/bin/env bash
# What the shard's metrics cost: the lookup benchmark (WORKLOAD.md item 2,
# Ember Lookup over gRPC, 1 and 4 pipelines) against two 2-shard clusters
# running side by side, one with --metrics_port (and scraped every round, as
# Prometheus would) and one without, alternating rounds. Prints the median
# keys/s of each and their ratio. The bar: metrics cost at most 3%.
#   bench/metrics_overhead.sh            # EMBER_ROUNDS (default 5), EMBER_BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${EMBER_ROUNDS:-5}"
BUILD="${EMBER_BUILD_DIR:-build}"
source scripts/local_cluster.sh

start_shards 2 --metrics_port=0 >/dev/null
WITH="$SHARD_ADDRESSES"
IFS=, read -r -a METRICS <<<"$SHARD_METRICS_PORTS"
start_shards 2 >/dev/null
WITHOUT="$SHARD_ADDRESSES"

bench() {  # cluster -> "keys/s at 1 pipeline, keys/s at 4"
  "$BUILD/bench/ember-lookup-bench" --shards="$1" --rounds=1 --steps=300 --pipelines=1,4 |
    awk -F'|' '/Ember Lookup \(gRPC\)/ {gsub(/ /, "", $2); gsub(/ /, "", $4); v[$2] = $4}
               END {print v["1"], v["4"]}'
}
declare -a on1 on4 off1 off4
echo "rounds: $ROUNDS (alternating), cores: $(nproc)"
for ((r = 1; r <= ROUNDS; r++)); do
  read -r a b < <(bench "$WITH")
  for p in "${METRICS[@]}"; do  # a scrape, as Prometheus makes them
    exec 3<>"/dev/tcp/127.0.0.1/$p"; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3 >/dev/null
    exec 3<&-
  done
  read -r c d < <(bench "$WITHOUT")
  on1+=("$a"); on4+=("$b"); off1+=("$c"); off4+=("$d")
  echo "round $r: metrics on $a / $b keys/s, off $c / $d keys/s (1 / 4 pipelines)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
m_on1=$(median "${on1[@]}"); m_off1=$(median "${off1[@]}")
m_on4=$(median "${on4[@]}"); m_off4=$(median "${off4[@]}")
echo "| pipelines | metrics on keys/s | metrics off keys/s | on / off |"
echo "|---|---|---|---|"
awk -v a="$m_on1" -v b="$m_off1" 'BEGIN {printf "| 1 | %d | %d | %.3f |\n", a, b, a / b}'
awk -v a="$m_on4" -v b="$m_off4" 'BEGIN {printf "| 4 | %d | %d | %.3f |\n", a, b, a / b}'
stop_cluster >/dev/null
