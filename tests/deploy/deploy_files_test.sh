#!/usr/bin/env bash
# The container files, without a Docker engine (none runs here):
#  - runtime-packages.txt holds every Debian package whose libraries the
#    image's programs load (ldd of the built binaries), beyond debian:12-slim;
#  - the Dockerfiles copy only files that exist and .dockerignore keeps;
#  - the compose file agrees with its Prometheus config, which
#    `promtool check config` accepts with the alert rules;
#  - the entrypoint (ember-shard) starts the real ember-server as the shard
#    its pod name's ordinal says, healthy per ember-healthcheck run as the
#    images' HEALTHCHECK runs it (no --address: $EMBER_PORT), and refuses
#    to start without a shard index or count;
#  - the compose shards' flags keep checkpoints on their volumes: a shard
#    started with them writes one on SIGTERM and restores it when started
#    again;
#  - ember-checkpoint list refuses a checkpoint whose data file is damaged;
#  - ember-trainer (the compose trainer) stops on SIGTERM at a step boundary
#    with status 0, printing what it measured.
#   tests/deploy/deploy_files_test.sh EMBER_SERVER EMBER_HEALTHCHECK EMBER_TRAINER [TOOL...]
# (the further programs the images ship: their libraries are checked too)
set -euo pipefail
cd "$(dirname "$0")/../.."
server="$1" healthcheck="$2" trainer="$3"
shift 3
tools=("$@")
out="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT

# Packages debian:12-slim already has.
base="libc6 libgcc-s1 libstdc++6 zlib1g"
listed="$(grep -v '^#' deploy/docker/runtime-packages.txt | tr '\n' ' ')"
missing=0
for bin in "$server" "$healthcheck" "$trainer" "${tools[@]}"; do
  for path in $(ldd "$bin" | awk '$2 == "=>" {print $3}'); do
    lib="$(basename "$path")"
    pkg=""
    # dpkg knows the path it installed: /lib or /usr/lib (merged /usr), the
    # link or its target.
    for p in "$path" "/usr$path" "$(readlink -f "$path")" "${path#/usr}"; do
      pkg="$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1)" && [ -n "$pkg" ] && break
    done
    if [ -z "$pkg" ]; then
      echo "FAIL $(basename "$bin") loads $lib, which no Debian package provides" >&2
      missing=1
    elif ! [[ " $base $listed " == *" $pkg "* ]]; then
      echo "FAIL $(basename "$bin") loads $lib from $pkg, not in runtime-packages.txt" >&2
      missing=1
    fi
  done
done
[ "$missing" = 0 ]
echo "ok   runtime-packages.txt covers the libraries of all three programs"

/usr/bin/python3 tests/deploy/check_deploy.py dockerfiles "$PWD"
/usr/bin/python3 tests/deploy/check_deploy.py compose deploy/compose/docker-compose.yml
cp deploy/compose/prometheus.yml deploy/prometheus/ember-alerts.yml "$out/"
promtool check config "$out/prometheus.yml"

# The entrypoint, as pod "ember-1" of 2, on free ports of 127.0.0.1.
EMBER_SERVER_BIN="$server" POD_NAME=ember-1 EMBER_SHARD_COUNT=2 EMBER_ADDRESS=127.0.0.1 \
  EMBER_PORT=0 EMBER_METRICS_PORT=0 EMBER_TABLE_CONFIG=deploy/k8s/base/tables.textproto \
  deploy/docker/ember-shard > "$out/shard.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/^EMBER_READY port=\([0-9]*\).*/\1/p' "$out/shard.log")"
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { cat "$out/shard.log" >&2; echo "FAIL the entrypoint's server did not start" >&2; exit 1; }
grep -q "shard 1/2 serving" "$out/shard.log" || { cat "$out/shard.log" >&2; exit 1; }
grep -q "created table 'user_id'" "$out/shard.log" || { cat "$out/shard.log" >&2; exit 1; }
EMBER_PORT="$port" "$healthcheck"
echo "ok   pod ember-1 started shard 1 of 2 with the ConfigMap's tables, healthy on \$EMBER_PORT"
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "ok   it stopped on SIGTERM with status 0"

# A compose shard: the entrypoint with the compose file's shard flags, its
# volume (/var/lib/ember) in a temporary directory.
volume="$out/volume"
mkdir -p "$volume"
mapfile -t compose_flags < <(/usr/bin/python3 tests/deploy/check_deploy.py compose-shard-flags \
  deploy/compose/docker-compose.yml | sed "s|/var/lib/ember|$volume|g")
start_compose_shard() {
  EMBER_SERVER_BIN="$server" EMBER_SHARD_INDEX=0 EMBER_SHARD_COUNT=1 EMBER_ADDRESS=127.0.0.1 \
    EMBER_PORT=0 EMBER_METRICS_PORT=-1 EMBER_TABLE_CONFIG=deploy/k8s/base/tables.textproto \
    deploy/docker/ember-shard "${compose_flags[@]}" > "$out/compose-shard.log" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 1 100); do
    port="$(sed -n 's/^EMBER_READY port=\([0-9]*\).*/\1/p' "$out/compose-shard.log")"
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$out/compose-shard.log" >&2; echo "FAIL the compose shard did not start" >&2; exit 1; }
}
start_compose_shard

# The compose trainer's program: stopped by SIGTERM (as `docker compose
# stop` sends it to process 1) in the middle of a 60 s run.
"$trainer" --shards="127.0.0.1:$port" --pipelines=1 --compute_ms=1 --seconds=60 \
  --warmup_seconds=0 --modes=on > "$out/trainer.log" 2>&1 &
trainer_pid=$!
sleep 3
kill -TERM "$trainer_pid"
trainer_rc=0
for _ in $(seq 1 100); do kill -0 "$trainer_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$trainer_pid" 2>/dev/null; then
  kill -KILL "$trainer_pid"
  cat "$out/trainer.log" >&2
  echo "FAIL ember-trainer was still running 10 s after SIGTERM" >&2
  exit 1
fi
wait "$trainer_pid" || trainer_rc=$?
[ "$trainer_rc" = 0 ] || { cat "$out/trainer.log" >&2; echo "FAIL ember-trainer exited $trainer_rc on SIGTERM" >&2; exit 1; }
grep -q "prefetch on" "$out/trainer.log" || { cat "$out/trainer.log" >&2; echo "FAIL no result printed" >&2; exit 1; }
echo "ok   ember-trainer stopped on SIGTERM within 10 s, status 0, with its results"

kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
ls "$volume"/checkpoints/*/MANIFEST > /dev/null 2>&1 || {
  ls -R "$volume" >&2; cat "$out/compose-shard.log" >&2; echo "FAIL no checkpoint on the volume" >&2; exit 1; }
start_compose_shard
grep -q "restored" "$out/compose-shard.log" || { cat "$out/compose-shard.log" >&2; echo "FAIL not restored" >&2; exit 1; }
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "ok   a compose shard wrote its checkpoint on its volume at SIGTERM and restored it on restart"

# ember-checkpoint list (the image's tool) reads every data file: a flipped
# byte in one makes its checkpoint refused, naming the file; the other stays.
checkpoint_tool="${tools[0]}"
"$checkpoint_tool" list --dir="$volume/checkpoints" > "$out/list.txt"
[ "$(grep -c '^| ckpt-' "$out/list.txt")" = 2 ] || { cat "$out/list.txt" >&2; echo "FAIL expected 2 checkpoints" >&2; exit 1; }
newest="$(ls -d "$volume"/checkpoints/ckpt-* | sort | tail -1)"
damaged="$(ls "$newest"/*.rows | head -1)"
printf '\xff' | dd of="$damaged" bs=1 seek=40 conv=notrunc status=none
"$checkpoint_tool" list --dir="$volume/checkpoints" > "$out/list.txt"
[ "$(grep -c '^| ckpt-' "$out/list.txt")" = 1 ] &&
  grep -q "^refused: $(basename "$newest"): .*$(basename "$damaged")" "$out/list.txt" || {
  cat "$out/list.txt" >&2; echo "FAIL the damaged checkpoint was listed as valid" >&2; exit 1; }
oldest="$(ls -d "$volume"/checkpoints/ckpt-* | sort | head -1)"
"$checkpoint_tool" verify "$oldest" > /dev/null || fail_verify=1
if "$checkpoint_tool" verify "$newest" > "$out/verify.txt" 2>&1 || [ -n "${fail_verify:-}" ]; then
  cat "$out/verify.txt" >&2; echo "FAIL ember-checkpoint verify: 0 for the intact, non-zero for the damaged" >&2; exit 1
fi
grep -q "$(basename "$damaged")" "$out/verify.txt" || { cat "$out/verify.txt" >&2; exit 1; }
echo "ok   ember-checkpoint list refuses a checkpoint with a damaged data file, naming it; verify exits 1 naming it (0 for the intact one)"

expect_refusal() {  # expect_refusal MESSAGE env...
  local message="$1"
  shift
  if env "$@" EMBER_SERVER_BIN=/bin/false deploy/docker/ember-shard > "$out/refused.log" 2>&1; then
    echo "FAIL ember-shard started with $*" >&2
    exit 1
  fi
  grep -q "$message" "$out/refused.log" || { cat "$out/refused.log" >&2; exit 1; }
  echo "ok   refused ($*): $(cat "$out/refused.log")"
}
expect_refusal "no shard index" POD_NAME=ember EMBER_SHARD_COUNT=2
expect_refusal "no shard index" POD_NAME=ember-x EMBER_SHARD_COUNT=2
expect_refusal "set EMBER_SHARD_COUNT" POD_NAME=ember-0
