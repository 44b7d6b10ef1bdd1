#!/usr/bin/env bash
# Installs the Debian 12 packages Ember builds, tests and runs with.
# Idempotent: only missing packages are installed. Needs root (or sudo).
# The container images install the same list.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkgconf git
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev
  redis-server libhiredis-dev libjemalloc-dev
  libcivetweb-dev prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
