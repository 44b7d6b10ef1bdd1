#!/usr/bin/env bash
# Builds the static, position-independent archives that libember_c.so links
# so that it imports no gRPC, protobuf, Abseil, OpenSSL, re2 or zlib symbol
# from the process (TensorFlow and PyTorch carry their own copies, exported
# into the global scope: docs/python.md, "One C ABI, sharing nothing with
# the frameworks").
#
# Debian ships libgrpc*.a, libupb.a, libgpr.a, libaddress_sorting.a,
# libcares.a, libssl.a and libcrypto.a position-independent, but not
# libprotobuf.a, libre2.a, libabsl_*.a and libz.a (local-exec TLS, PC32
# relocations: they cannot go into a shared object). This script builds those
# four from Debian's own source packages (the same versions and patches as
# the -dev packages the rest of Ember compiles against, so the headers match)
# with -fPIC, into a prefix:
#   scripts/pic_deps.sh [PREFIX]      # default $EMBER_PIC_DEPS or /opt/ember-pic-deps
# Idempotent: a stamp names what was built. Needs Debian's source archive
# (deb-src; added when run as root and missing), dpkg-dev and cmake.
# Takes about 3 minutes on 2 cores (2 min 53 s measured on 2026-12-07).
set -euo pipefail
PREFIX="${1:-${EMBER_PIC_DEPS:-/opt/ember-pic-deps}}"
# The -dev packages whose source is rebuilt (their headers are the ones
# Ember compiles against).
DEV_PACKAGES=(libabsl-dev libprotobuf-dev libre2-dev zlib1g-dev)
JOBS="${EMBER_JOBS:-$(nproc)}"

# "source=version" of each installed -dev package's source package.
sources() {
  for p in "${DEV_PACKAGES[@]}"; do
    dpkg-query -W -f='${source:Package}=${source:Version}\n' "$p" || {
      echo "pic_deps: $p is not installed (deploy/install-deps.sh build)" >&2
      exit 1
    }
  done
}

if ! apt-cache showsrc abseil 2>/dev/null | grep -q '^Version:'; then
  if [ "$(id -u)" != 0 ]; then
    echo "pic_deps: Debian's source archive (deb-src) is not configured; run as root once" >&2
    exit 1
  fi
  cat > /etc/apt/sources.list.d/ember-deb-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt-get update -qq
fi
# dpkg-source unpacks the sources; re2 regenerates its Unicode tables from
# unicode-data, as Debian's own build does.
missing=()
for p in dpkg-dev unicode-data python3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "pic_deps: missing ${missing[*]}: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    > /dev/null
fi

want="$(sources)"
if [ -f "$PREFIX/.ember-pic-deps" ] && [ "$(cat "$PREFIX/.ember-pic-deps")" = "$want" ]; then
  echo "pic_deps: $PREFIX is up to date"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get source -qq $want > source.log 2>&1 || { cat source.log >&2; exit 1; }

# One CMake project: configure, build and install it into $PREFIX, static
# and position-independent, with its tests and tools off.
build() {
  local dir="$1"
  shift
  cmake -S "$dir" -B "$dir/_build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF \
    -DBUILD_TESTING=OFF "$@" > "$dir.log" 2>&1 || { tail -30 "$dir.log" >&2; exit 1; }
  cmake --build "$dir/_build" -j "$JOBS" --target install >> "$dir.log" 2>&1 ||
    { tail -30 "$dir.log" >&2; exit 1; }
}

rm -rf "$PREFIX"
mkdir -p "$PREFIX"
echo "pic_deps: building $(echo $want | tr '\n' ' ')into $PREFIX" >&2
build abseil-*/ -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON
build protobuf-*/ -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF \
  -Dprotobuf_BUILD_LIBPROTOC=OFF -Dprotobuf_WITH_ZLIB=OFF
# re2's CMake build has no way to regenerate the tables the dfsg source
# leaves out; its Makefile does (REBUILD_TABLES).
make -C re2-*/ -j "$JOBS" REBUILD_TABLES=1 CXXFLAGS="-O2 -fPIC -pthread -std=c++11" obj/libre2.a \
  > re2.log 2>&1 || { tail -30 re2.log >&2; exit 1; }
install -m 644 re2-*/obj/libre2.a "$PREFIX/lib/"
# zlib's dfsg source lacks what its CMake build wants (win32/); its own
# configure builds the archive.
(cd zlib-*/ && CFLAGS="-O2 -fPIC" ./configure --static && make -j "$JOBS" libz.a) > zlib.log 2>&1 ||
  { tail -30 zlib.log >&2; exit 1; }
install -m 644 zlib-*/libz.a "$PREFIX/lib/"
echo "$want" > "$PREFIX/.ember-pic-deps"
echo "pic_deps: done" >&2
