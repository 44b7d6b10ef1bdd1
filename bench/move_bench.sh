#!/usr/bin/env bash
# An online move under the reference trainer's pipelines (bench/move_bench.cc):
# starts 2 shards and a third with --join on 127.0.0.1, each with its own
# checkpoint directory (one machine: every part of the cut is readable by
# every shard), runs move_bench against them, and stops them.
#   bash bench/move_bench.sh [move_bench flags, e.g. --scale_down=100]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${EMBER_BUILD_DIR:-build}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
start() {  # start <log name> <flags...>: prints the port once ready
  local log="$work/$1.log"; shift
  "$BUILD/server/ember-server" --port=0 --metrics_port=-1 "$@" > "$log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 1 200); do
    if grep -q "EMBER_READY port=" "$log"; then
      grep -o "EMBER_READY port=[0-9]*" "$log" | cut -d= -f2
      return
    fi
    sleep 0.05
  done
  echo "move_bench.sh: shard $1 did not start: $(cat "$log")" >&2
  exit 1
}
p0=$(start s0 --shard_index=0 --shard_count=2 --checkpoint_dir="$work/c0")
p1=$(start s1 --shard_index=1 --shard_count=2 --checkpoint_dir="$work/c1")
p2=$(start s2 --join --checkpoint_dir="$work/c2")
"$BUILD/bench/move_bench" --shards="127.0.0.1:$p0,127.0.0.1:$p1" --join="127.0.0.1:$p2" "$@"
