#!/usr/bin/env bash
# The container files, without a Docker engine (none runs here):
#  - runtime-packages.txt holds every Debian package whose libraries the
#    image's programs load (ldd of the built binaries), beyond debian:12-slim;
#  - the Dockerfiles copy only files that exist and .dockerignore keeps;
#  - the compose file agrees with its Prometheus config, which
#    `promtool check config` accepts with the alert rules;
#  - the entrypoint (ember-shard) starts the real ember-server as the shard
#    its pod name's ordinal says, healthy per ember-healthcheck, and refuses
#    to start without a shard index or count.
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
"$healthcheck" --address="127.0.0.1:$port"
echo "ok   pod ember-1 started shard 1 of 2 with the ConfigMap's tables, healthy"
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "ok   it stopped on SIGTERM with status 0"

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
