#!/usr/bin/env bash
# The whole test suite: installs what it needs (Debian packages, and a Python
# virtual environment in .venv), checks the include layers and the paths
# named in comments (tests/checks/), builds, runs every CTest test (unit,
# integration with real ember-server processes, the Python package's pytest
# suites; GPU tests skip without a GPU), then the concurrency tests again under ThreadSanitizer (metrics,
# store stress, shard and SSP, the client against real shards, and the
# integration suites against a TSan-built shard), and the store,
# shard, server and client tests under AddressSanitizer + UBSan, then each
# libFuzzer target for a bounded time (tests/fuzz/run_fuzzers.sh).
#   bash tests/run_tests.sh          # everything
#   EMBER_SKIP_TSAN=1 EMBER_SKIP_ASAN=1 EMBER_SKIP_FUZZ=1 bash tests/run_tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's wall time, printed as it ends and summed up at the end
# (docs/testing.md keeps the table).
STAGES=""
STAGE_START=$SECONDS
STAGE_NAME=""
stage() {
  if [ -n "$STAGE_NAME" ]; then
    local took=$((SECONDS - STAGE_START))
    echo "== stage '$STAGE_NAME' took ${took}s"
    STAGES="$STAGES$(printf '%-28s %6ss' "$STAGE_NAME" "$took")"$'\n'
  fi
  STAGE_NAME="$1"
  STAGE_START=$SECONDS
}

# A sanitizer's own build tree, of the targets its stage runs only.
sanitizer_tree() {  # sanitizer_tree DIR "TARGETS" -DEMBER_<SANITIZER>=ON
  EMBER_BUILD_DIR="$1" EMBER_TARGETS="$2" \
    scripts/build.sh "$3" -DEMBER_ENABLE_CUDA=OFF -DEMBER_BUILD_BENCH=OFF
}

stage "install and environments"
bash deploy/install-deps.sh
# libember_c.so's static gRPC/protobuf/Abseil/OpenSSL/re2/zlib (the Python
# package beside TensorFlow and PyTorch; ctest c_api_symbols checks it).
bash scripts/pic_deps.sh
# The house rules first (seconds): include layers, paths named in comments.
bash tests/checks/layers.sh
python3 tests/checks/comment_paths.py
# The Python package's environment (.venv: numpy, pytest, PyTorch, TensorFlow).
PYTHON="$(bash scripts/python_env.sh | tail -1)"
NEWEST_PYTHON="$(bash scripts/python_env.sh newest | tail -1)"
stage "build"
bash scripts/build.sh -DEMBER_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PYTHON" \
  -DEMBER_NEWEST_PYTHON="$NEWEST_PYTHON"
stage "ctest"
(cd build && ctest --output-on-failure -j "$(nproc)")

if [ "${EMBER_SKIP_TSAN:-0}" != "1" ]; then
  stage "tsan"
  echo "== ThreadSanitizer: metrics, store, shard, SSP, client and shard-process concurrency tests"
  sanitizer_tree build-tsan "common_test store_test shard_test client_test \
    client_integration_test exchange_stream_test ember-server" -DEMBER_TSAN=ON
  TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/common_test --gtest_filter='Metrics*:-*Death*'
  TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/store_test --gtest_filter='*Stress*'
  TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/shard_test
  # The client under TSan talks to regular shard processes; gRPC and Abseil
  # are not TSan-built, tests/tsan.supp says which of their reports to drop.
  export EMBER_SERVER_BIN="$PWD/build/server/ember-server"
  TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" build-tsan/tests/client_test
  TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" \
    build-tsan/tests/client_integration_test
  TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" \
    build-tsan/tests/exchange_stream_test
  # The shard under TSan (its async server's completion thread and pool,
  # and online moves replacing its tables while it serves): the regular
  # integration suites against a TSan-built ember-server, whose first
  # report ends it (and so fails the test).
  export EMBER_SERVER_BIN="$PWD/build-tsan/server/ember-server"
  for suite in server_integration_test exchange_stream_test client_integration_test \
      move_integration_test; do
    TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" build/tests/$suite
  done
  unset EMBER_SERVER_BIN
fi
if [ "${EMBER_SKIP_ASAN:-0}" != "1" ]; then
  stage "asan"
  echo "== AddressSanitizer + UBSan: common, store, shard, server, client and checkpoint tests"
  ASAN_SUITES="common_test store_test shard_test server_integration_test client_test \
    client_integration_test exchange_stream_test checkpoint_integration_test"
  sanitizer_tree build-asan "$ASAN_SUITES" -DEMBER_ASAN=ON
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  for suite in $ASAN_SUITES; do
    build-asan/tests/$suite
  done
fi
if [ "${EMBER_SKIP_FUZZ:-0}" != "1" ]; then
  stage "fuzz"
  echo "== Fuzzing: every libFuzzer target for ${EMBER_FUZZ_SECONDS:-60}s (Clang, ASan + UBSan)"
  bash tests/fuzz/run_fuzzers.sh "${EMBER_FUZZ_SECONDS:-60}"
fi
stage ""
printf '== stage times (total %ss)\n%s' "$SECONDS" "$STAGES"
echo "== all tests passed"
