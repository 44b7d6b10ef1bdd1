#!/bin/sh
# Image runtime stage: the shared libraries of runtime-packages.txt, the
# unprivileged user (uid 10001) and the data directory (checkpoints' PVC).
set -eu
# No debconf prompt can be answered during an image build.
export DEBIAN_FRONTEND=noninteractive
apt-get update
grep -v '^#' "$(dirname "$0")/runtime-packages.txt" |
  xargs apt-get install -y --no-install-recommends ca-certificates
rm -rf /var/lib/apt/lists/*
useradd --system --uid 10001 --home-dir /var/lib/ember --shell /usr/sbin/nologin ember
mkdir -p /var/lib/ember /etc/ember
chown ember /var/lib/ember
