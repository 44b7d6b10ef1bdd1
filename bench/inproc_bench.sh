#!/usr/bin/env bash
# Shard servers beside shards in the trainer's process, measured side by
# side: per round and dim, the reference trainer (4 merged pipelines,
# staleness 1) against a fresh 2-shard cluster on 127.0.0.1, then with
# --shards=inproc:2 --inproc_threads=0 (each call's shards on the calling
# thread), then with --shards=inproc:2 (on a pool, the default); then the medians over
# the rounds of the CPU per pipeline-step (trainer and shards together, with
# no compute) and of the efficiency at 1 ms of compute. Issue 34's measurement.
#   bash bench/inproc_bench.sh                       # dims 8,32,128, 3 rounds, 3 s per run
#   ROUNDS=5 DIMS=8 SECONDS_PER_RUN=4 bash bench/inproc_bench.sh --pipelines=1
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-3}"
IFS=, read -ra DIM_LIST <<<"${DIMS:-8,32,128}"
BUILD="${EMBER_BUILD_DIR:-build}"

source scripts/local_cluster.sh
OUT="$CLUSTER_DIR/rows.txt"
: >"$OUT"
for ((round = 1; round <= ROUNDS; round++)); do
  for dim in "${DIM_LIST[@]}"; do
    for way in servers in-process in-process-pool; do
      case "$way" in
        servers)
          start_shards 2 --worker_threads=4 >/dev/null
          flags=(--shards="$SHARD_ADDRESSES") ;;
        in-process) flags=(--shards=inproc:2 --inproc_threads=0) ;;
        in-process-pool) flags=(--shards=inproc:2) ;;
      esac
      echo "== round $round, dim $dim, $way"
      "$BUILD/bench/ember-trainer" "${flags[@]}" --dim="$dim" --seconds="$SECONDS_PER_RUN" \
        --warmup_seconds=2 --pipelines=4 --compute_ms=0,1 --staleness=1 \
        --modes=no_embeddings,on "$@" |
        grep -E '^\| [0-9]+ \| [0-9.]+ ms \| prefetch on' | sed "s/^/| $way | $dim /" | tee -a "$OUT"
      [ "$way" = servers ] && stop_cluster >/dev/null
    done
  done
done

# Rows: | way | dim | pipelines | compute | mode | steps/s | step ms | wait mean | wait p99 |
#       efficiency | keys | KB | RPCs | trainer CPU | shards CPU | total CPU |
echo
echo "Medians over $ROUNDS rounds (CPU: trainer and shards, ms per pipeline-step, no compute;"
echo "efficiency at 1 ms of compute: no-embedding step time / step time):"
echo "| dim | way | CPU ms per pipeline-step | vs servers | efficiency at 1 ms |"
echo "| --- | --- | --- | --- | --- |"
awk -F'|' -f bench/median.awk -f /dev/stdin "$OUT" <<'AWK'
  { for (i = 2; i <= 17; i++) gsub(/^ +| +$/, "", $i)
    key = $3 "|" $2
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    if ($5 == "0 ms") cpu[key, ++nc[key]] = $17 + 0; else eff[key, ++ne[key]] = $11 + 0 }
  END {
    for (i = 1; i <= n; i++) {
      split(order[i], f, "|")
      c = median(cpu, order[i], nc[order[i]])
      s = median(cpu, f[1] "|servers", nc[f[1] "|servers"])
      printf "| %s | %s | %.3f | %.2fx | %.3f |\n", f[1], f[2], c, (s > 0 ? c / s : 0),
             median(eff, order[i], ne[order[i]])
    }
  }
AWK
