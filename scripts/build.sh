#!/usr/bin/env bash
# Configures and builds Ember into build/ (or $EMBER_BUILD_DIR), incrementally.
# CUDA code is built when nvcc is found (EMBER_ENABLE_CUDA=OFF to skip it).
#   scripts/build.sh [extra cmake -D options...]
#   EMBER_TARGETS="store_test shard_test" scripts/build.sh   # only these targets
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${EMBER_BUILD_DIR:-build}"
JOBS="${EMBER_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
TARGETS=()
if [ -n "${EMBER_TARGETS:-}" ]; then
  for t in $EMBER_TARGETS; do TARGETS+=(--target "$t"); done
fi
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"
