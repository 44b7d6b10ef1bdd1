#!/usr/bin/env bash
# Image build stage: configures and builds the programs the images ship
# (Release, no tests) and installs them into $1/bin.
#   deploy/docker/build-binaries.sh /out [-DEMBER_ENABLE_CUDA=ON ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$1"
shift
cmake -S . -B /tmp/ember-build -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_TESTS=OFF \
  -DEMBER_BUILD_BENCH=ON "$@"
cmake --build /tmp/ember-build -j "$(nproc)" --target ember-server ember-healthcheck \
  ember-checkpoint ember-export ember-trainer ember-move
install -d "$out/bin"
install -m 0755 -s /tmp/ember-build/server/ember-server /tmp/ember-build/server/ember-healthcheck \
  /tmp/ember-build/server/ember-checkpoint /tmp/ember-build/server/ember-export \
  /tmp/ember-build/bench/ember-trainer /tmp/ember-build/client/ember-move "$out/bin/"
install -m 0755 deploy/docker/ember-shard "$out/bin/"
