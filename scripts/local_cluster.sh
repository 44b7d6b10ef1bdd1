# Helpers to run a local Ember cluster (and Redis peers) on 127.0.0.1 with
# ports chosen at run time. Source it from a bash script:
#   source scripts/local_cluster.sh
#   start_shards 2            # sets SHARD_ADDRESSES=host:port,host:port
#   start_shards 2 --metrics_port=0   # also SHARD_METRICS_PORTS=port,port
#   start_redis 2             # sets REDIS_ADDRESSES (needs redis-server)
#   ...
#   stop_cluster              # SIGTERM; fails if a shard did not exit cleanly
# An EXIT trap kills whatever is still running.

CLUSTER_DIR="$(mktemp -d)"
SHARD_PIDS=()
REDIS_PIDS=()
SHARD_ADDRESSES=""
SHARD_METRICS_PORTS=""
CLUSTER_PIDS=""
REDIS_ADDRESSES=""

_cluster_cleanup() {
  for pid in "${SHARD_PIDS[@]}" "${REDIS_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${SHARD_PIDS[@]}" "${REDIS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$CLUSTER_DIR"
}
trap _cluster_cleanup EXIT

# start_shards N [extra ember-server flags...]; $EMBER_SERVER_BIN overrides the binary.
# May be called again for a second cluster; SHARD_ADDRESSES,
# SHARD_METRICS_PORTS and CLUSTER_PIDS describe the latest one.
start_shards() {
  local n="$1"
  shift
  local addresses=() metrics=() pids=() i port first="${#SHARD_PIDS[@]}" k
  for ((i = 0; i < n; i++)); do
    k=$((first + i))
    "${EMBER_SERVER_BIN:-${EMBER_BUILD_DIR:-build}/server/ember-server}" --address=127.0.0.1 --port=0 --shard_index="$i" \
      --shard_count="$n" "$@" >"$CLUSTER_DIR/shard$k.out" 2>"$CLUSTER_DIR/shard$k.log" &
    SHARD_PIDS+=($!)
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    k=$((first + i))
    port=""
    for _ in $(seq 1 200); do
      port="$(sed -n 's/^EMBER_READY port=\([0-9]*\).*$/\1/p' "$CLUSTER_DIR/shard$k.out")"
      [ -n "$port" ] && break
      kill -0 "${SHARD_PIDS[$k]}" 2>/dev/null || { cat "$CLUSTER_DIR/shard$k.log" >&2; return 1; }
      sleep 0.05
    done
    [ -n "$port" ] || { echo "shard $i did not start" >&2; return 1; }
    addresses+=("127.0.0.1:$port")
    metrics+=("$(sed -n 's/^EMBER_READY .*metrics_port=\(-\?[0-9]*\).*$/\1/p' "$CLUSTER_DIR/shard$k.out")")
    echo "shard $i of $n serving on 127.0.0.1:$port"
  done
  SHARD_ADDRESSES="$(IFS=,; echo "${addresses[*]}")"
  SHARD_METRICS_PORTS="$(IFS=,; echo "${metrics[*]}")"
  CLUSTER_PIDS="${pids[*]}"
}

# A TCP port on 127.0.0.1 that nothing listens on now.
_free_port() {
  local p
  for _ in $(seq 1 100); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}

# start_redis N: N redis-server processes, persistence off.
start_redis() {
  local n="$1" addresses=() i port
  for ((i = 0; i < n; i++)); do
    port="$(_free_port)"
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
      >"$CLUSTER_DIR/redis$i.log" 2>&1 &
    REDIS_PIDS+=($!)
    for _ in $(seq 1 200); do
      [ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ] && break
      kill -0 "${REDIS_PIDS[$i]}" 2>/dev/null || { cat "$CLUSTER_DIR/redis$i.log" >&2; return 1; }
      sleep 0.05
    done
    addresses+=("127.0.0.1:$port")
    echo "redis $i of $n serving on 127.0.0.1:$port"
  done
  REDIS_ADDRESSES="$(IFS=,; echo "${addresses[*]}")"
}

stop_cluster() {
  local i rc=0
  echo "stopping the cluster (SIGTERM)"
  for pid in "${SHARD_PIDS[@]}" "${REDIS_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for i in "${!SHARD_PIDS[@]}"; do
    if wait "${SHARD_PIDS[$i]}"; then echo "shard $i stopped cleanly"; else
      echo "shard $i exited with $?" >&2
      rc=1
    fi
  done
  for pid in "${REDIS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SHARD_PIDS=()
  REDIS_PIDS=()
  return $rc
}
