#!/usr/bin/env bash
# The Kubernetes manifests: `kubectl kustomize` renders the base and the GPU
# overlay, yamllint accepts deploy/ and the rendered output, and
# check_deploy.py checks what the parts must agree on (shard count and
# replicas, probes, claim, PDB, ServiceMonitor, alert rules, GPU resources);
# the PrometheusRule is the generated copy of the alert rules and promtool
# accepts it. A broken overlay (replicas without EMBER_SHARD_COUNT) must be
# caught.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in kubectl yamllint promtool /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found: bash deploy/install-deps.sh installs it" >&2; exit 1; }
done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
kubectl version --client 2>/dev/null | head -1 || true

kubectl kustomize deploy/k8s/base > "$out/base.yaml"
kubectl kustomize deploy/k8s/overlays/gpu > "$out/gpu.yaml"
echo "rendered: base $(grep -c '^kind:' "$out/base.yaml") objects, gpu $(grep -c '^kind:' "$out/gpu.yaml") objects"
yamllint -c deploy/.yamllint deploy/ "$out/base.yaml" "$out/gpu.yaml"
echo "yamllint: deploy/ and the rendered manifests are clean"
/usr/bin/python3 tests/deploy/check_deploy.py manifests "$out/base.yaml" "$out/gpu.yaml"
/usr/bin/python3 deploy/prometheus/make_prometheus_rule.py --check
# The rendered PrometheusRule's groups pass promtool as a rules file.
/usr/bin/python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "PrometheusRule"]
yaml.safe_dump({"groups": docs[0]["spec"]["groups"]}, open(sys.argv[2], "w"))' \
  "$out/base.yaml" "$out/rules.yml"
promtool check rules "$out/rules.yml"

# The checker itself: scaling to 3 replicas without EMBER_SHARD_COUNT fails.
# (kustomize takes no absolute base path: the overlay goes beside a copy.)
cp -r deploy/k8s "$out/k8s"
mkdir "$out/k8s/broken"
cat > "$out/k8s/broken/kustomization.yaml" <<YAML
bases:
  - ../base
patchesStrategicMerge:
  - replicas.yaml
YAML
cat > "$out/k8s/broken/replicas.yaml" <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: ember
spec:
  replicas: 3
YAML
kubectl kustomize "$out/k8s/broken" > "$out/broken.yaml"
if /usr/bin/python3 tests/deploy/check_deploy.py manifests "$out/broken.yaml" "$out/gpu.yaml" > "$out/broken.log"; then
  echo "FAIL: check_deploy.py accepted 3 replicas with EMBER_SHARD_COUNT=2" >&2
  exit 1
fi
grep -q "FAIL base: EMBER_SHARD_COUNT equals replicas (3)" "$out/broken.log"
echo "ok   a StatefulSet scaled without EMBER_SHARD_COUNT is caught"
