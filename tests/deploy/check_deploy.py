#!/usr/bin/python3
"""Structural checks of deploy/ that a linter cannot make: what the rendered
Kubernetes manifests, the compose file and the Dockerfiles must agree on.
Run by tests/deploy/*.sh with Debian's python3 (python3-yaml comes with
yamllint). Each failed check is printed; the exit status is the count.

  check_deploy.py manifests BASE.yaml GPU.yaml   (kubectl kustomize output)
  check_deploy.py compose deploy/compose/docker-compose.yml
  check_deploy.py dockerfiles REPO_ROOT
"""
import os
import re
import sys

import yaml

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok   " if cond else "FAIL ") + what)


def by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def check_shards(docs, label):
    k = by_kind(docs)
    for kind in ["StatefulSet", "Service", "PodDisruptionBudget", "ServiceMonitor", "ConfigMap",
                 "PrometheusRule"]:
        check(len(k.get(kind, [])) == 1, f"{label}: exactly one {kind}")
    sts, svc, pdb, mon = (k["StatefulSet"][0], k["Service"][0], k["PodDisruptionBudget"][0],
                          k["ServiceMonitor"][0])
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    c = pod["containers"][0]
    env = env_of(c)
    check(spec["selector"]["matchLabels"].items() <= pod_labels.items(),
          f"{label}: the StatefulSet selects its own pods")
    check(str(spec["replicas"]) == env.get("EMBER_SHARD_COUNT"),
          f"{label}: EMBER_SHARD_COUNT equals replicas ({spec['replicas']})")
    check(env.get("POD_NAME") == {"fieldRef": {"fieldPath": "metadata.name"}},
          f"{label}: POD_NAME from the pod name (the shard index is its ordinal)")
    check("EMBER_SHARD_INDEX" not in env, f"{label}: no fixed EMBER_SHARD_INDEX in the template")
    check(spec["podManagementPolicy"] == "Parallel", f"{label}: shards start in parallel")
    # Headless Service named by serviceName, selecting the pods, with both ports.
    check(svc["metadata"]["name"] == spec["serviceName"], f"{label}: serviceName is the Service")
    check(svc["spec"].get("clusterIP") == "None", f"{label}: the Service is headless")
    check(svc["spec"]["selector"].items() <= pod_labels.items(), f"{label}: the Service selects the pods")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get("grpc") == 50051 and ports.get("metrics") == 9464,
          f"{label}: container ports grpc 50051 and metrics 9464")
    check({p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"},
          f"{label}: the Service exposes grpc and metrics")
    # gRPC probes on the gRPC port.
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
        check(c.get(probe, {}).get("grpc", {}).get("port") == 50051,
              f"{label}: {probe} is a gRPC health probe on 50051")
    res = c.get("resources", {})
    check("cpu" in res.get("requests", {}) and "memory" in res.get("requests", {}),
          f"{label}: cpu and memory requests")
    check("memory" in res.get("limits", {}), f"{label}: a memory limit")
    # Checkpoint volume: a claim template mounted at the data directory.
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    check("data" in claims and mounts.get("data") == "/var/lib/ember",
          f"{label}: a PersistentVolumeClaim template mounted at /var/lib/ember")
    args = c.get("args", [])
    ckpt = [a.split("=", 1)[1] for a in args if a.startswith("--checkpoint_dir=")]
    check(len(ckpt) == 1 and ckpt[0].startswith(mounts.get("data", "?") + "/"),
          f"{label}: --checkpoint_dir is on the PersistentVolumeClaim ({ckpt})")
    check("--restore_from=latest" in args, f"{label}: a restarted shard restores its latest checkpoint")
    # The table config: the generated ConfigMap (hashed name) holds the file
    # EMBER_TABLE_CONFIG names.
    cm = k["ConfigMap"][0]
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    check(vols.get("tables", {}).get("configMap", {}).get("name") == cm["metadata"]["name"],
          f"{label}: the tables volume is the generated ConfigMap ({cm['metadata']['name']})")
    path = env.get("EMBER_TABLE_CONFIG", "")
    check(os.path.dirname(path) == mounts.get("tables") and os.path.basename(path) in cm["data"],
          f"{label}: EMBER_TABLE_CONFIG ({path}) is a file of that ConfigMap")
    check(pod.get("terminationGracePeriodSeconds", 30) > 20,
          f"{label}: the grace period exceeds --shutdown_grace_seconds=20")
    check("--shutdown_grace_seconds=20" in c.get("args", []), f"{label}: shutdown grace set")
    # PDB and ServiceMonitor select the shards / their Service.
    check(pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
          and pdb["spec"].get("maxUnavailable") == 1, f"{label}: the PDB allows one shard away")
    check(mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(),
          f"{label}: the ServiceMonitor selects the Service")
    check([e["port"] for e in mon["spec"]["endpoints"]] == ["metrics"],
          f"{label}: the ServiceMonitor scrapes the metrics port")
    # The alert rules: the same groups as deploy/prometheus/ember-alerts.yml.
    alerts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                          "prometheus", "ember-alerts.yml")
    check(k["PrometheusRule"][0]["spec"]["groups"] == yaml.safe_load(open(alerts))["groups"],
          f"{label}: the PrometheusRule holds the rules of ember-alerts.yml")
    return c, pod


def manifests(base_path, gpu_path):
    base = [d for d in yaml.safe_load_all(open(base_path)) if d]
    gpu = [d for d in yaml.safe_load_all(open(gpu_path)) if d]
    c, _ = check_shards(base, "base")
    check(env_of(c).get("EMBER_DEVICE") == "cpu", "base: EMBER_DEVICE=cpu")
    check(c["image"] == "ember:0.1.0", f"base: image ember:0.1.0 (is {c['image']})")
    check("nvidia.com/gpu" not in c["resources"].get("limits", {}), "base: no GPU requested")
    c, pod = check_shards(gpu, "gpu")
    check(env_of(c).get("EMBER_DEVICE") == "cuda:0", "gpu: EMBER_DEVICE=cuda:0")
    check([e["name"] for e in c["env"]].count("EMBER_DEVICE") == 1, "gpu: EMBER_DEVICE set once")
    check(c["image"] == "ember-cuda:0.1.0", f"gpu: image ember-cuda:0.1.0 (is {c['image']})")
    check(c["resources"]["limits"].get("nvidia.com/gpu") == 1, "gpu: one GPU per shard")
    check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
          "gpu: tolerates GPU node taints")


def compose(path):
    root = os.path.dirname(os.path.abspath(path))
    doc = yaml.safe_load(open(path))
    services = doc["services"]
    shards = sorted(n for n in services if n.startswith("shard-"))
    check(len(shards) == 2, f"compose: 2 shards ({shards})")
    for i, name in enumerate(shards):
        env = services[name]["environment"]
        check(env.get("EMBER_SHARD_INDEX") == str(i) and env.get("EMBER_SHARD_COUNT") == str(len(shards)),
              f"compose: {name} is shard {i} of {len(shards)}")
        check("healthcheck" in services[name], f"compose: {name} has a health check")
        test = " ".join(services[name].get("healthcheck", {}).get("test", []))
        check("--address" not in test,
              f"compose: {name}'s health check follows EMBER_PORT (no --address: {test})")
        flags = services[name].get("command", [])
        mounts = [v.split(":")[1] for v in services[name].get("volumes", [])]
        dirs = [f.split("=", 1)[1] for f in flags if f.startswith("--checkpoint_dir=")]
        check(len(dirs) == 1 and any(dirs[0].startswith(m) for m in mounts),
              f"compose: {name} checkpoints onto its volume ({dirs} under {mounts})")
        check("--restore_from=latest" in flags, f"compose: {name} restores its latest checkpoint")
    check({"prometheus", "grafana"} <= services.keys(), "compose: Prometheus and Grafana")
    prom = yaml.safe_load(open(os.path.join(root, "prometheus.yml")))
    jobs = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]]
            for j in prom["scrape_configs"]}
    check(sorted(jobs.get("ember", [])) == [f"{s}:9464" for s in shards],
          "compose: Prometheus scrapes every shard's metrics port (job ember)")
    trainer_cmd = " ".join(services.get("trainer", {}).get("command", []))
    check(jobs.get("ember-trainer") == ["trainer:9465"] and "--metrics_port=9465" in trainer_cmd,
          "compose: Prometheus scrapes the trainer (job ember-trainer)")
    for name, svc in services.items():
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                check(os.path.exists(os.path.join(root, src)), f"compose: {name} mounts {src}, which exists")


def dockerfiles(repo):
    ignored = [l.strip().lstrip("/") for l in open(os.path.join(repo, ".dockerignore"))
               if l.strip() and not l.startswith("#")]
    for name in ["Dockerfile", "Dockerfile.cuda"]:
        text = open(os.path.join(repo, "deploy/docker", name)).read().replace("\\\n", " ")
        for m in re.finditer(r"^(COPY|ADD)\s+(.*)$", text, re.M):
            parts = [p for p in m.group(2).split() if not p.startswith("--")]
            if "--from=" in m.group(2):
                continue
            for src in parts[:-1]:
                if src.startswith("http"):
                    continue
                path = os.path.join(repo, src)
                check(os.path.exists(path), f"{name}: {m.group(1)} {src} exists in the repository")
                check(not any(src.startswith(i.rstrip("*")) for i in ignored if i),
                      f"{name}: {src} is not in .dockerignore")
        check("ENTRYPOINT [\"ember-shard\"]" in text, f"{name}: the entrypoint is ember-shard")
        check("HEALTHCHECK" in text and "ember-healthcheck" in text, f"{name}: a health check")
        health = re.search(r"^HEALTHCHECK.*$", text, re.M).group(0)
        check("--address" not in health and "50051" not in health,
              f"{name}: the health check follows EMBER_PORT (no fixed address)")
        check(re.search(r"^USER 10001$", text, re.M) is not None, f"{name}: runs as uid 10001")


def compose_shard_flags(path):
    """Prints shard-0's ember-server flags (its compose `command`), one per line."""
    for flag in yaml.safe_load(open(path))["services"]["shard-0"].get("command", []):
        print(flag)
    sys.exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "compose-shard-flags":
        compose_shard_flags(*sys.argv[2:])
    {"manifests": manifests, "compose": compose, "dockerfiles": dockerfiles}[sys.argv[1]](*sys.argv[2:])
    print(f"{len(failures)} failed" if failures else "all checks passed")
    sys.exit(min(len(failures), 100))
