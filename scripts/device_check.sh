#!/usr/bin/env bash
# The GPU check: on a machine with a GPU, runs every GPU test of Ember, the
# GPU store benchmark (HierarchicalKV's protocol, WORKLOAD.md item 5) and the
# client's device-path benchmark, and writes a short report.
#
#   scripts/device_check.sh                  # builds with CUDA here first
#                                            # (deploy/install-deps.sh for deps)
#   EMBER_DEVICE_BUNDLE=.devbundle.tar.xz scripts/device_check.sh
#                                            # runs binaries packed elsewhere by
#                                            # scripts/device_bundle.sh
# Environment: REPORT (default device_report.md; also copied to $OUT when
# set), EMBER_BENCH_CAPACITY (rows per benchmark table, default 64M).
# Exit status: 0 when every test passed and no GPU test skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT="${REPORT:-device_report.md}"
LOGS="$(mktemp -d)"
CAPACITY="${EMBER_BENCH_CAPACITY:-67108864}"

if [ -n "${EMBER_DEVICE_BUNDLE:-}" ]; then
  UNPACK="$(mktemp -d)"
  if [ -d "$EMBER_DEVICE_BUNDLE" ]; then cp -r "$EMBER_DEVICE_BUNDLE" "$UNPACK/bundle"
  else tar -C "$UNPACK" -xJf "$EMBER_DEVICE_BUNDLE"; fi
  BIN="$UNPACK/bundle/bin"
  # NCCL: the GPU machine's own (its Python wheel), else the system's.
  NCCL_DIR="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
  export LD_LIBRARY_PATH="$UNPACK/bundle/lib${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  HOW="prebuilt bundle $EMBER_DEVICE_BUNDLE"
else
  BUILD_DIR="${EMBER_BUILD_DIR:-build-gpu}"
  EMBER_BUILD_DIR="$BUILD_DIR" scripts/build.sh -DEMBER_ENABLE_CUDA=ON >"$LOGS/build.log" 2>&1 \
    || { tail -30 "$LOGS/build.log"; echo "device_check: build failed" >&2; exit 1; }
  BIN="$LOGS/bin"
  mkdir -p "$BIN"
  for t in store_test server_integration_test client_integration_test nccl_test ember-server \
           gpu_store_bench device_path_bench; do
    ln -s "$(realpath "$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -1)")" "$BIN/$t"
  done
  HOW="built here in $BUILD_DIR"
fi
export EMBER_SERVER_BIN="$BIN/ember-server"

{
  echo "# Ember device check"
  echo
  echo "- date: $(date -u +%FT%TZ); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); binaries: $HOW"
  echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not available')"
  echo "- CPU cores: $(nproc)"
  echo
  echo "## Tests"
  echo
  echo "| suite | filter | passed | failed | skipped |"
  echo "|---|---|---|---|---|"
} >"$REPORT"

status=0
run_suite() {  # name filter
  local name="$1" filter="$2" log="$LOGS/$1.log"
  timeout 900 "$BIN/$name" --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local passed failed skipped
  passed="$(grep -c '^\[       OK \]' "$log")"
  failed="$(grep -c '^\[  FAILED  \] .*(' "$log")"
  skipped="$(grep -c '^\[  SKIPPED \] .*(' "$log")"
  echo "| $name | \`$filter\` | $passed | $failed | $skipped |" >>"$REPORT"
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$skipped" -ne 0 ]; then
    status=1
    { echo; echo "<details><summary>$name (exit $rc)</summary>"; echo; echo '```';
      grep -E '^\[  (FAILED|SKIPPED) \]|Failure|Skipped|error' "$log" | head -40; echo '```';
      echo "</details>"; echo; } >>"$LOGS/failures.md"
  fi
}
# Every test that touches the GPU (the CPU store's cases of the typed suites
# come along: the CUDA store is compared against them).
run_suite store_test '*'
run_suite server_integration_test '*cuda0*:ServerStartupTest.*'
run_suite client_integration_test '*Device*'
run_suite nccl_test '*'
[ -f "$LOGS/failures.md" ] && cat "$LOGS/failures.md" >>"$REPORT"

{
  echo
  echo "## GPU store, HierarchicalKV's protocol"
  echo
  echo "Command: \`gpu_store_bench --capacity=$CAPACITY\` (anchors: find at dim 8 >= 4.8 B rows/s on an H200,"
  echo "find_or_insert >= 1.5, fused push at dim 32 >= 1.2)."
  echo
  timeout 600 "$BIN/gpu_store_bench" --capacity="$CAPACITY" 2>&1 || echo "(gpu_store_bench exit $?)"
  echo
  echo "## Client device path per step"
  echo
  echo "Command: \`device_path_bench\` (reference workload, batch 128, dim 8)."
  echo
  timeout 300 "$BIN/device_path_bench" 2>&1 || echo "(device_path_bench exit $?)"
  echo
  echo "Overall: $([ $status -eq 0 ] && echo 'all GPU tests passed, none skipped' || echo 'FAILURES or skips above')"
} >>"$REPORT"

cat "$REPORT"
if [ -n "${OUT:-}" ]; then cp "$REPORT" "$OUT/"; cp "$LOGS"/*.log "$OUT/" 2>/dev/null; fi
exit $status
