#!/usr/bin/env bash
# The seed model in every framework, side by side: for TensorFlow 2 and
# PyTorch, the step without embeddings (the floor), the native path and the
# in-framework peer (TFRA / TorchRec), each set up as its users run it, and
# Ember (2 shard servers and 2 shards in the process, s = 0 and s = 1), same
# batches, Adagrad, 1 ms of simulated compute per step; prints ms/step and
# CPU ms/step of each, their loss curves, configurations and wheels.
#   examples/seed_model_bench.sh [--steps 300] [--compute_ms 1] [--rounds 2]
#   examples/seed_model_bench.sh --replicas 4   # TF under MirroredStrategy, 4 replicas
# Sets up what it needs: the Python environment with the peers
# (scripts/python_env.sh bench) and the build with the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="$(bash scripts/python_env.sh bench | tail -1)"
EMBER_TARGETS="ember-server ember_python" scripts/build.sh \
  -DEMBER_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PYTHON" >/dev/null
PYTHONPATH="$PWD/build/python" exec "$PYTHON" examples/seed_model_bench.py "$@"
