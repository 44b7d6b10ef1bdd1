"""The rendered StatefulSet's pod template as the Pods Kubernetes would make
of it, for `podman kube play` (which runs Pods, not StatefulSets).

    statefulset_pods.py RENDERED.yaml IMAGE TAG > pods.yaml

Each replica i becomes Pod ember-smoke-TAG-i: the template's spec with the
image given, POD_NAME set to the pod's name (what the template's fieldRef
gives), the claim template as a claim of its own per pod (podman makes a
volume for it), the ConfigMap it mounts copied beside. The gRPC probes are
left out (podman runs exec probes only; the test probes the pods with
ember-healthcheck instead), and so are the container ports, which podman
would publish on the host, where the two pods' 50051 clash. Everything else (the read-only root, dropped
capabilities, uid 10001, the memory limit, the args) is the template's.
"""

import copy
import sys

import yaml


def main(rendered, image, tag):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    out = []
    used = set()
    for i in range(sts["spec"]["replicas"]):
        name = f"ember-smoke-{tag}-{i}"
        spec = copy.deepcopy(sts["spec"]["template"]["spec"])
        for c in spec["containers"]:
            c["image"] = image
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                c.pop(probe, None)
            # Declarations in Kubernetes (pods have their own addresses);
            # podman would publish each on this host, where two pods clash.
            c.pop("ports", None)
            for env in c.get("env", []):
                if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    env.pop("valueFrom")
                    env["value"] = name
        for claim in sts["spec"].get("volumeClaimTemplates", []):
            spec.setdefault("volumes", []).append({
                "name": claim["metadata"]["name"],
                "persistentVolumeClaim": {"claimName": f"{claim['metadata']['name']}-{name}"}})
        for v in spec.get("volumes", []):
            if "configMap" in v:
                used.add(v["configMap"]["name"])
        labels = dict(sts["spec"]["template"]["metadata"].get("labels", {}))
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": labels}, "spec": spec})
    out = [configmaps[n] for n in sorted(used)] + out
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
