#!/usr/bin/env bash
# The CPU image under a real container engine (podman, which Debian ships):
#  - a Debian 12 base: pulled where a registry answers, else debootstrapped
#    from this machine's Debian mirror and imported (kept in podman's
#    storage, so later runs reuse it, as they reuse the build's layers);
#  - deploy/docker/Dockerfile built with the Docker image format, so that
#    its HEALTHCHECK is kept, running as uid 10001;
#  - one shard from the image on a port other than the default: healthy by
#    the image's own HEALTHCHECK (podman healthcheck run), /metrics scraped,
#    the image's ember-trainer trained against it and stopped by `podman
#    stop` (SIGTERM) with status 0 and its results; the shard stopped the
#    same way writes its checkpoint onto its volume, and restores it when
#    started again on the same volume;
#  - the compose pair (deploy/compose/docker-compose.yml's two shards, under
#    podman-compose, on their published ports 50051 and 50052): healthy,
#    the compose trainer's command against them by service name, stopped on
#    SIGTERM with status 0; stopped, each shard's volume holds a checkpoint,
#    and started again, each restores it;
#  - the rendered StatefulSet's pod template, converted to two Pods (the
#    ordinal in the pod name, the ConfigMap's tables, a volume per pod),
#    under `podman kube play`: each pod serves as its shard of 2.
# Skips (exit 77) with the reason when podman is missing or cannot run a
# container here.
#   tests/deploy/container_smoke_test.sh
#   EMBER_SMOKE_IMAGE=localhost/ember:0.1.0 tests/deploy/container_smoke_test.sh  # an image built before
set -euo pipefail
cd "$(dirname "$0")/../.."

skip() {
  echo "SKIP container smoke test: $*"
  exit 77
}
command -v podman > /dev/null || skip "podman is not installed (deploy/install-deps.sh installs it)"
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman)"

work="$(mktemp -d)"
tag="$$"
image="localhost/ember:smoke"
base="docker.io/library/debian:12"
containers=()
volume="ember-smoke-$tag"
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" > /dev/null 2>&1 || true; done
  podman volume rm -f "$volume" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
step() { echo "ok   $*"; }
fail() {
  echo "FAIL $*" >&2
  exit 1
}

# Engine settings. Some hosts (gVisor sandboxes such as this project's
# machines) refuse the default runtime's rlimits: crun cannot raise
# RLIMIT_NOFILE, and runc needs explicit limits no higher than the host's.
# A containers.conf of this run's own carries what works, so that every
# podman command below (and the build's RUN steps) use it.
export CONTAINERS_CONF="$work/containers.conf"
: > "$CONTAINERS_CONF"

# The base: pulled, or made from the Debian mirror apt uses.
mirror() {
  local uri
  uri="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')"
  [ -n "$uri" ] || uri="$(grep -hs '^deb ' /etc/apt/sources.list | head -1 | awk '{print $2}')"
  echo "${uri:-http://deb.debian.org/debian}"
}
if ! podman image exists "$base"; then
  if timeout 120 podman pull -q "$base" > "$work/pull.log" 2>&1; then
    step "pulled $base"
  else
    command -v debootstrap > /dev/null ||
      skip "no registry answers ($(tail -1 "$work/pull.log")) and debootstrap is not installed"
    debootstrap --variant=minbase bookworm "$work/rootfs" "$(mirror)" > "$work/debootstrap.log" 2>&1 ||
      { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap of bookworm from $(mirror)"; }
    tar -C "$work/rootfs" -c . | podman import -q - "$base" > /dev/null
    rm -rf "$work/rootfs"
    step "no registry answers: made $base with debootstrap from $(mirror)"
  fi
fi
# The runtime stage's base: the same Debian where none was pulled.
podman image exists docker.io/library/debian:12-slim ||
  timeout 120 podman pull -q docker.io/library/debian:12-slim > /dev/null 2>&1 ||
  podman tag "$base" docker.io/library/debian:12-slim

if ! podman run --rm --pull=never "$base" true > "$work/probe.log" 2>&1; then
  nofile="$(ulimit -Hn)"
  [ "$nofile" = unlimited ] && nofile=1048576
  cat > "$CONTAINERS_CONF" << EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
  podman run --rm --pull=never "$base" true > "$work/probe2.log" 2>&1 ||
    skip "podman cannot run a container here: $(tail -1 "$work/probe.log"); with runc and explicit ulimits: $(tail -1 "$work/probe2.log")"
  step "the default runtime cannot run containers here ($(tail -1 "$work/probe.log" | cut -c1-120)); using runc with nofile=$nofile, nproc=4096"
else
  step "podman runs containers with its defaults"
fi

# The image, Docker format (the OCI format has no HEALTHCHECK).
if [ -n "${EMBER_SMOKE_IMAGE:-}" ]; then
  image="$EMBER_SMOKE_IMAGE"
  step "checking the image $image built before (EMBER_SMOKE_IMAGE)"
else
  start=$SECONDS
  podman build -q --format docker --pull=never -f deploy/docker/Dockerfile -t "$image" . \
    > "$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; fail "podman build"; }
  step "built $image in $((SECONDS - start)) s"
  # The build stage's image (about 1 GB) is left dangling by every build.
  podman image prune -f > /dev/null 2>&1 || true
fi
step "image size $(podman image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
health="$(podman image inspect "$image" --format '{{json .Config.Healthcheck}}')"
[[ "$health" == *ember-healthcheck* ]] || fail "the image has no HEALTHCHECK: $health"
[ "$(podman image inspect "$image" --format '{{.Config.User}}')" = 10001 ] || fail "the image does not run as uid 10001"
step "the image keeps its HEALTHCHECK ($health) and runs as uid 10001"

# Whether CONTAINER's log holds PATTERN. The log is read whole first: with
# pipefail, `podman logs | grep -q` fails when grep stops reading early.
log_has() {
  podman logs "$1" > "$work/container.log" 2>&1
  grep -q "$2" "$work/container.log"
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port="$(free_port)"
metrics="$(free_port)"
# The compose file's shard flags and health check, as compose runs them.
mapfile -t shard_flags < <(python3 tests/deploy/check_deploy.py compose-shard-flags \
  deploy/compose/docker-compose.yml)

podman volume create "$volume" > /dev/null
# Host networking: the shard's ports are this machine's, chosen now.
run_shard() {
  local name="ember-smoke-shard-$tag-$1"
  containers+=("$name")
  podman run -d --name "$name" --network host --health-interval=disable -v "$volume:/var/lib/ember" \
    -e EMBER_SHARD_COUNT=1 -e EMBER_SHARD_INDEX=0 -e EMBER_ADDRESS=127.0.0.1 \
    -e EMBER_PORT="$port" -e EMBER_METRICS_PORT="$metrics" \
    -e EMBER_TABLE_CONFIG=/etc/ember/tables.textproto "$image" "${shard_flags[@]}" > /dev/null
  for _ in $(seq 1 60); do
    podman healthcheck run "$name" > /dev/null 2>&1 && { echo "$name"; return; }
    [ "$(podman inspect "$name" --format '{{.State.Running}}')" = true ] || break
    sleep 1
  done
  podman logs "$name" >&2
  fail "$name did not become healthy by its HEALTHCHECK within 60 s"
}
shard="$(run_shard 1)"
step "a shard from the image on port $port (EMBER_PORT) is healthy by the image's HEALTHCHECK"

python3 - "$metrics" << 'EOF' || fail "scraping /metrics"
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
assert 'ember_build_info{' in text, text[:500]
assert 'ember_table_rows{table="user_id"' in text, "no series of the image's tables"
EOF
step "its /metrics on port $metrics serves ember_build_info and the image's tables"

# The image's trainer, stopped the way `docker compose stop` stops it.
trainer="ember-smoke-trainer-$tag"
containers+=("$trainer")
podman run -d --name "$trainer" --network host --entrypoint ember-trainer "$image" \
  --shards="127.0.0.1:$port" --pipelines=1 --compute_ms=1 --seconds=60 --warmup_seconds=0 \
  --modes=on > /dev/null
sleep 4
podman stop -t 20 "$trainer" > /dev/null
code="$(podman inspect "$trainer" --format '{{.State.ExitCode}}')"
podman logs "$trainer" > "$work/trainer.log" 2>&1
[ "$code" = 0 ] || { cat "$work/trainer.log" >&2; fail "the trainer exited $code on podman stop"; }
grep -q "prefetch on" "$work/trainer.log" || { cat "$work/trainer.log" >&2; fail "the trainer printed no results"; }
step "the image's trainer trained against it and stopped on podman stop (SIGTERM) with status 0"

podman stop -t 60 "$shard" > /dev/null
[ "$(podman inspect "$shard" --format '{{.State.ExitCode}}')" = 0 ] || fail "the shard exited non-zero on stop"
podman run --rm --entrypoint ember-checkpoint -v "$volume:/var/lib/ember" "$image" \
  list --dir=/var/lib/ember/checkpoints > "$work/list.txt" 2>&1
grep -q '^| ckpt-' "$work/list.txt" || { cat "$work/list.txt" >&2; fail "no checkpoint on the volume"; }
step "the shard wrote its checkpoint onto its volume on podman stop ($(grep -c '^| ckpt-' "$work/list.txt") listed)"

shard="$(run_shard 2)"
log_has "$shard" "restored" || { podman logs "$shard" >&2; fail "the restarted shard did not restore"; }
step "started again on the same volume, the shard restored its checkpoint"
podman stop -t 60 "$shard" > /dev/null

# The compose pair, with this run's image.
if command -v podman-compose > /dev/null; then
  project="embersmoke$tag"
  sed "s|image: ember:0.1.0|image: $image|" deploy/compose/docker-compose.yml > "$work/compose.yml"
  compose() { podman-compose -f "$work/compose.yml" -p "$project" "$@" > "$work/compose.log" 2>&1; }
  compose_down() {
    compose down -v || true
    podman network rm -f "${project}_default" > /dev/null 2>&1 || true
  }
  trap 'compose_down; cleanup' EXIT
  wait_healthy() {  # container...
    local c
    for c in "$@"; do
      for _ in $(seq 1 60); do
        podman healthcheck run "$c" > /dev/null 2>&1 && continue 2
        sleep 1
      done
      podman logs "$c" >&2
      fail "$c did not become healthy within 60 s"
    done
  }
  shards=("${project}_shard-0_1" "${project}_shard-1_1")
  compose up -d shard-0 shard-1 || { cat "$work/compose.log" >&2; fail "podman-compose up"; }
  wait_healthy "${shards[@]}"
  build/server/ember-healthcheck --address=127.0.0.1:50052 > /dev/null 2>&1 ||
    python3 -c 'import socket; socket.create_connection(("127.0.0.1", 50052), 5)' ||
    fail "shard-1's published port 127.0.0.1:50052 does not answer"
  step "the compose pair is up and healthy by the image's HEALTHCHECK, shard-1 on 127.0.0.1:50052"

  mapfile -t trainer_cmd < <(python3 -c 'import sys, yaml
for a in yaml.safe_load(open(sys.argv[1]))["services"]["trainer"]["command"]: print(a)' \
    deploy/compose/docker-compose.yml)
  trainer="ember-smoke-compose-trainer-$tag"
  containers+=("$trainer")
  podman run -d --name "$trainer" --network "${project}_default" --entrypoint ember-trainer \
    "$image" "${trainer_cmd[@]}" > /dev/null
  sleep 3
  podman stop -t 20 "$trainer" > /dev/null
  code="$(podman inspect "$trainer" --format '{{.State.ExitCode}}')"
  [ "$code" = 0 ] || { podman logs "$trainer" >&2; fail "the compose trainer exited $code on SIGTERM"; }
  step "the compose trainer's command (${trainer_cmd[0]} ...) reached both shards by name and stopped on SIGTERM with status 0"

  compose stop || { cat "$work/compose.log" >&2; fail "podman-compose stop"; }
  for i in 0 1; do
    podman run --rm --entrypoint ember-checkpoint -v "${project}_shard-$i-data:/var/lib/ember" \
      "$image" list --dir=/var/lib/ember/checkpoints > "$work/list-$i.txt" 2>&1
    grep -q '^| ckpt-' "$work/list-$i.txt" || { cat "$work/list-$i.txt" >&2; fail "no checkpoint on shard-$i's volume"; }
  done
  compose start || { cat "$work/compose.log" >&2; fail "podman-compose start"; }
  wait_healthy "${shards[@]}"
  for c in "${shards[@]}"; do
    log_has "$c" "restored" || { podman logs "$c" >&2; fail "$c did not restore"; }
  done
  step "stopped, each compose shard left a checkpoint on its volume; started again, each restored it"
  compose_down
else
  echo "SKIP the compose pair: podman-compose is not installed (apt-get install podman-compose)"
fi

# The StatefulSet's pod template as two Pods under podman kube play.
if command -v kubectl > /dev/null; then
  kubectl kustomize deploy/k8s/base > "$work/rendered.yaml"
  python3 tests/deploy/statefulset_pods.py "$work/rendered.yaml" "$image" "$tag" > "$work/pods.yaml"
  podman kube play "$work/pods.yaml" > "$work/kube.log" 2>&1 || { cat "$work/kube.log" >&2; fail "podman kube play"; }
  trap 'podman kube down "$work/pods.yaml" > /dev/null 2>&1 || true; cleanup' EXIT
  for i in 0 1; do
    container="ember-smoke-$tag-$i-shard"  # pod name - container name
    for _ in $(seq 1 60); do
      podman exec "$container" ember-healthcheck > /dev/null 2>&1 && break
      sleep 1
    done
    podman exec "$container" ember-healthcheck > /dev/null 2>&1 || { podman logs "$container" >&2; fail "pod $i did not serve"; }
    log_has "$container" "shard $i/2 serving" || { podman logs "$container" >&2; fail "pod $i is not shard $i of 2"; }
  done
  step "the StatefulSet's pod template runs under podman kube play: pods ember-...-0 and -1 serve as shards 0 and 1 of 2"
  # A restart (SIGTERM, then start): the read-only root and uid 10001 still
  # write the checkpoint onto the claim's volume, and read it back.
  for i in 0 1; do
    podman pod stop -t 60 "ember-smoke-$tag-$i" > /dev/null
    podman pod start "ember-smoke-$tag-$i" > /dev/null
  done
  for i in 0 1; do
    container="ember-smoke-$tag-$i-shard"
    for _ in $(seq 1 60); do
      podman exec "$container" ember-healthcheck > /dev/null 2>&1 && break
      sleep 1
    done
    log_has "$container" "restored" || { podman logs "$container" >&2; fail "pod $i did not restore its checkpoint"; }
  done
  step "restarted, each pod restored the checkpoint it wrote on SIGTERM to its claim's volume"
  podman kube down "$work/pods.yaml" > /dev/null 2>&1 || true
  # kube down leaves the volumes it made: the claims' and the ConfigMap's.
  for v in "data-ember-smoke-$tag-0" "data-ember-smoke-$tag-1" \
    $(python3 -c 'import sys, yaml
print(*[d["metadata"]["name"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"])' "$work/pods.yaml"); do
    podman volume rm -f "$v" > /dev/null 2>&1 || true
  done
else
  echo "SKIP the StatefulSet's pods: kubectl (to render deploy/k8s/base) is not installed"
fi
echo "all container checks passed"
