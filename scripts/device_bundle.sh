#!/usr/bin/env bash
# Packs what scripts/device_check.sh runs into one archive, for a GPU machine
# that cannot build Ember (no Debian packages, no network): the GPU test and
# benchmark binaries, stripped, with the shared libraries they load beside
# them (glibc, the driver and NCCL excepted: the GPU machine has those).
#   scripts/device_bundle.sh [archive]     # default .devbundle.tar.xz
# Builds the targets first (EMBER_BUILD_DIR, default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE="${1:-.devbundle.tar.xz}"
BUILD_DIR="${EMBER_BUILD_DIR:-build}"
TARGETS="store_test server_integration_test client_integration_test nccl_test ember-server gpu_store_bench device_path_bench"
EMBER_BUILD_DIR="$BUILD_DIR" EMBER_TARGETS="$TARGETS" scripts/build.sh -DEMBER_ENABLE_CUDA=ON

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bundle/bin" "$STAGE/bundle/lib"
for t in $TARGETS; do
  bin="$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$bin" ] || { echo "device_bundle: $t was not built" >&2; exit 1; }
  strip -s -o "$STAGE/bundle/bin/$t" "$bin"
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
      *) cp -L -n "$lib" "$STAGE/bundle/lib/" ;;
    esac
  done
done
tar -C "$STAGE" -cJf "$ARCHIVE" bundle
echo "device_bundle: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
