#!/usr/bin/env bash
# What the shard's metrics cost: the lookup benchmark (WORKLOAD.md item 2,
# Ember Lookup over gRPC, 1 and 4 pipelines) against two 2-shard clusters
# running side by side, one with --metrics_port (and scraped every round, as
# Prometheus would) and one without, alternating rounds. Prints the median
# keys/s of each and their ratio, and the shards' CPU time for the same work
# (every round sends both clusters the same keys), which is far less noisy on
# a shared machine than throughput, and the shards' CPU per RPC (for
# bench/metrics_record_bench's cost per recorded RPC). The bar: metrics cost
# at most 3%.
#   bench/metrics_overhead.sh            # EMBER_ROUNDS (default 5), EMBER_BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${EMBER_ROUNDS:-5}"
BUILD="${EMBER_BUILD_DIR:-build}"
source scripts/local_cluster.sh

start_shards 2 --metrics_port=0 >/dev/null
WITH="$SHARD_ADDRESSES"
WITH_PIDS="$CLUSTER_PIDS"
IFS=, read -r -a METRICS <<<"$SHARD_METRICS_PORTS"
start_shards 2 >/dev/null
WITHOUT="$SHARD_ADDRESSES"
WITHOUT_PIDS="$CLUSTER_PIDS"

cpu_ticks() {  # user + system clock ticks of the given pids
  local t=0 pid f
  for pid in "$@"; do
    read -r -a f < "/proc/$pid/stat"
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}

bench() {  # cluster -> "keys/s at 1 pipeline, keys/s at 4"
  "$BUILD/bench/ember-lookup-bench" --shards="$1" --rounds=1 --steps=300 --pipelines=1,4 |
    awk -F'|' '/Ember Lookup \(gRPC\)/ {gsub(/ /, "", $2); gsub(/ /, "", $4); v[$2] = $4}
               END {print v["1"], v["4"]}'
}
declare -a on1 on4 off1 off4 cpu_on cpu_off
echo "rounds: $ROUNDS (alternating), cores: $(nproc)"
run_on() {  # one round on the metrics cluster, then a scrape: sets a b t
  local t0 p
  # shellcheck disable=SC2086
  t0=$(cpu_ticks $WITH_PIDS)
  read -r a b < <(bench "$WITH")
  for p in "${METRICS[@]}"; do  # a scrape, as Prometheus makes them
    exec 3<>"/dev/tcp/127.0.0.1/$p"; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3 >/dev/null
    exec 3<&-
  done
  # shellcheck disable=SC2086
  t=$(($(cpu_ticks $WITH_PIDS) - t0))
}
run_off() {  # one round on the other cluster: sets c d u
  local u0
  # shellcheck disable=SC2086
  u0=$(cpu_ticks $WITHOUT_PIDS)
  read -r c d < <(bench "$WITHOUT")
  # shellcheck disable=SC2086
  u=$(($(cpu_ticks $WITHOUT_PIDS) - u0))
}
for ((r = 1; r <= ROUNDS; r++)); do
  # Which cluster goes first alternates too, so that neither always runs
  # on a machine the other just warmed (or heated).
  if ((r % 2)); then run_on; run_off; else run_off; run_on; fi
  on1+=("$a"); on4+=("$b"); off1+=("$c"); off4+=("$d")
  cpu_on+=("$t"); cpu_off+=("$u")
  echo "round $r: metrics on $a / $b keys/s, off $c / $d keys/s (1 / 4 pipelines);" \
    "shard CPU on $t / off $u ticks"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
m_on1=$(median "${on1[@]}"); m_off1=$(median "${off1[@]}")
m_on4=$(median "${on4[@]}"); m_off4=$(median "${off4[@]}")
echo "| pipelines | metrics on keys/s | metrics off keys/s | on / off |"
echo "|---|---|---|---|"
awk -v a="$m_on1" -v b="$m_off1" 'BEGIN {printf "| 1 | %d | %d | %.3f |\n", a, b, a / b}'
awk -v a="$m_on4" -v b="$m_off4" 'BEGIN {printf "| 4 | %d | %d | %.3f |\n", a, b, a / b}'
sum() { local t=0 v; for v in "$@"; do t=$((t + v)); done; echo "$t"; }
c_on=$(sum "${cpu_on[@]}"); c_off=$(sum "${cpu_off[@]}")
echo
echo "shard CPU for the same keys, all rounds: metrics on $c_on ticks, off $c_off ticks," \
  "on / off $(awk -v a="$c_on" -v b="$c_off" 'BEGIN {printf "%.3f", a / b}')" \
  "(a tick is 1/$(getconf CLK_TCK) s)"
# The metrics cluster's own account: CPU seconds per RPC served, to set
# against bench/metrics_record_bench's ns per recorded RPC.
cpu=0 rpcs=0
for p in "${METRICS[@]}"; do
  exec 3<>"/dev/tcp/127.0.0.1/$p"; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
  read -r c n < <(awk '/^process_cpu_seconds_total / {c = $2} /^ember_rpc_requests_total\{/ {n += $2}
                         END {print c, n}' <&3)
  exec 3<&-
  cpu=$(awk -v a="$cpu" -v b="$c" 'BEGIN {print a + b}'); rpcs=$((rpcs + n))
done
echo "shards with metrics: $rpcs RPCs, $cpu CPU s:" \
  "$(awk -v c="$cpu" -v n="$rpcs" 'BEGIN {printf "%.1f", 1e6 * c / n}') us of shard CPU per RPC"
stop_cluster >/dev/null
