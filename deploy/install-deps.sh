#!/usr/bin/env bash
# Installs the Debian 12 packages Ember builds, tests and runs with.
# Idempotent: only missing packages are installed. Needs root (or sudo).
#   deploy/install-deps.sh          # everything: build, tests, tools
#   deploy/install-deps.sh build    # only what building needs (image build stage)
#   deploy/install-deps.sh python   # what `pip install ./python` needs: the build
#                                   # packages, Python's headers, and the static
#                                   # libraries libember_c.so links (scripts/pic_deps.sh)
# The images' run-time libraries are in deploy/docker/runtime-packages.txt.
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake pkgconf git
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libspdlog-dev libcivetweb-dev libjemalloc-dev
)
# Tests and tools: GoogleTest; Redis for the peer comparison; promtool and
# Prometheus for the metrics tests; yamllint and kubectl for the manifests;
# Python's venv and headers for the Python package (its wheels come from PyPI);
# openssl makes the TLS tests' certificates; Clang and its runtime (libFuzzer,
# ASan) build the fuzz targets; podman (with runc, netavark, which needs
# iptables, aardvark-dns for compose's service names, catatonit for kube
# play's pause image, and podman-compose) and debootstrap build and run the
# images in the container smoke test.
TEST_PACKAGES=(
  libgtest-dev libgmock-dev openssl clang libclang-rt-14-dev
  redis-server libhiredis-dev
  prometheus yamllint
  python3-venv python3-dev
  podman runc netavark iptables aardvark-dns catatonit debootstrap podman-compose
)

PACKAGES=("${BUILD_PACKAGES[@]}")
ROLE="${1:-all}"
if [ "$ROLE" = "python" ]; then
  PACKAGES+=(python3-venv python3-dev)
elif [ "$ROLE" = "all" ]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
  # Debian's kubectl (kubernetes-client) unless one is installed already: a
  # kubectl from another repository owns the same path.
  command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
elif [ "$ROLE" != "build" ]; then
  echo "install-deps: expected 'all', 'build' or 'python', received '$ROLE'" >&2
  exit 2
fi

# After the packages: the position-independent archives of the Python
# package's libember_c.so.
pic_deps() {
  if [ "$ROLE" = "python" ]; then
    local as_root=()
    [ "$(id -u)" -eq 0 ] || as_root=(sudo)
    "${as_root[@]}" bash "$(dirname "$0")/../scripts/pic_deps.sh"
  fi
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  pic_deps
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
pic_deps
