"""Runs the seed model variants (tf2_seed_model.py, torch_seed_model.py) each
in its own process, `rounds` times in alternation, and prints the medians.
See seed_model_bench.sh."""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = [("tensorflow", "native", "tf2_seed_model.py"), ("tensorflow", "tfra", "tf2_seed_model.py"),
            ("tensorflow", "ember", "tf2_seed_model.py"), ("pytorch", "native", "torch_seed_model.py"),
            ("pytorch", "torchrec", "torch_seed_model.py"), ("pytorch", "ember", "torch_seed_model.py")]


def run(script, mode, args):
    cmd = [sys.executable, os.path.join(HERE, script), "--mode", mode, "--steps", str(args.steps),
           "--compute_ms", str(args.compute_ms), "--scale", str(args.scale)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
    return {"error": f"exit {proc.returncode}: {tail}"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--compute_ms", type=float, default=1.0)
    p.add_argument("--scale", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(f"# seed model: 17 features, batch 128, dim 8, cardinalities / {args.scale}, Adagrad, "
          f"{args.compute_ms} ms simulated compute, {args.steps} steps (30 warm-up), "
          f"{args.rounds} alternating rounds, {os.cpu_count()} cores, seed 1", flush=True)
    results = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            res = run(v[2], v[1], args)
            results[v].append(res)
            print(f"  round {r + 1} {v[0]} {v[1]}: "
                  + (res["error"] if "error" in res else f"{res['ms_per_step']:.2f} ms/step"),
                  flush=True)
    print()
    print(f"{'framework':<11} {'path':<9} {'ms/step':>8} {'cpu ms/step':>12} {'shards cpu':>11} "
          f"{'vs native':>10}  loss curve")
    for fw in ("tensorflow", "pytorch"):
        native = None
        for v in (x for x in VARIANTS if x[0] == fw):
            ok = [x for x in results[v] if "error" not in x]
            if not ok:
                print(f"{fw:<11} {v[1]:<9} failed: {results[v][-1]['error']}")
                continue
            ms = statistics.median(x["ms_per_step"] for x in ok)
            cpu = statistics.median(x["cpu_ms_per_step"] for x in ok)
            shard = statistics.median(x["shard_cpu_ms_per_step"] for x in ok)
            native = ms if v[1] == "native" else native
            speedup = f"{native / ms:9.2f}x" if native else f"{'':>10}"
            print(f"{fw:<11} {v[1]:<9} {ms:8.2f} {cpu:12.2f} {shard:11.2f} {speedup}  "
                  f"{ok[-1]['loss_curve']}")
    versions = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    wanted = ("tensorflow=", "tensorflow-recommenders-addons", "tf_keras", "tf-keras", "keras=", "torch=",
              "torchrec", "fbgemm", "numpy=")
    print("\n# wheels: " + ", ".join(l for l in versions.splitlines() if l.lower().startswith(wanted)))


if __name__ == "__main__":
    main()
