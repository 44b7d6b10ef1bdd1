#!/usr/bin/env bash
# Makes (or updates) the project's Python environment: a virtual environment
# in .venv (or $EMBER_VENV) with python/requirements-test.txt installed, and
# with `bench` also the seed model's framework peers (TensorFlow
# Recommenders-Addons, TorchRec). Idempotent: a stamp file records what was
# installed, so a second run with the same requirements does nothing.
#   scripts/python_env.sh           # tests
#   scripts/python_env.sh bench     # tests + peers for examples/seed_model_bench.sh
#   scripts/python_env.sh newest    # the newest TensorFlow and PyTorch, in .venv-newest
# Prints the environment's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-test}"
if [ "$WHAT" = newest ]; then
  VENV="${EMBER_NEWEST_VENV:-$PWD/.venv-newest}"
else
  VENV="${EMBER_VENV:-$PWD/.venv}"
fi
PYTHON="${EMBER_PYTHON:-python3}"
REQUIREMENTS=python/requirements-test.txt
[ "$WHAT" = newest ] && REQUIREMENTS=python/requirements-newest.txt

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" >&2 || {
    echo "python_env: '$PYTHON -m venv' failed; on Debian: apt-get install python3-venv python3-dev" >&2
    exit 1
  }
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

stamp="$VENV/.ember-$WHAT"
want="$(cat "$REQUIREMENTS"; [ "$WHAT" = bench ] && cat python/requirements-bench.txt || true)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
"${PIP[@]}" -r "$REQUIREMENTS" >&2
if [ "$WHAT" = bench ]; then
  # Both peers declare dependencies that would replace the wheels above
  # (tf-keras pulls a second TensorFlow, torchrec the CUDA fbgemm-gpu):
  # installed without them, their real needs are listed in the file.
  "${PIP[@]}" --no-deps -r python/requirements-bench.txt >&2
fi
echo "$want" > "$stamp"
echo "$VENV/bin/python"
