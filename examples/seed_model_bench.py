"""Runs the seed model variants (tf2_seed_model.py, torch_seed_model.py) each
in its own process, `rounds` times in alternation, and prints the medians.
With --replicas N > 1, the seed user's own setup instead: TensorFlow under
MirroredStrategy over N devices (tf2_seed_model_replicas.py: dense, native
as the seed user wrote it, Ember), with the ops each step executes; and
PyTorch on N torchrun ranks (torch_seed_model_ranks.py: DDP floor, DDP with
nn.EmbeddingBag, TorchRec DistributedModelParallel, Ember with DDP with and
without the node shuffle).
See seed_model_bench.sh."""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# (framework, label, script, mode, extra arguments). "dense" is each
# framework's floor (no embeddings); the peers are set up as their users run
# them (see the scripts); Ember runs on 2 ember-server shards and on 2 shards
# in the process, synchronous (s = 0, early fetch: the layers' default) and
# with s = 1.
EMBER_WAYS = [("servers", ()), ("inproc", ("--shards", "inproc:2"))]
VARIANTS = []
for _fw, _script, _peers in (("tensorflow", "tf2_seed_model.py", ["native", "tfra"]),
                             ("pytorch", "torch_seed_model.py", ["native", "torchrec"])):
    VARIANTS.append((_fw, "dense", _script, "dense", ()))
    VARIANTS += [(_fw, p, _script, p, ()) for p in _peers]
    for _way, _args in EMBER_WAYS:
        for _s in (0, 1):
            VARIANTS.append((_fw, f"ember {_way} s={_s}", _script, "ember",
                             _args + ("--staleness", str(_s))))
PEERS = {"native", "tfra", "torchrec"}


RANKS_SCRIPT = "torch_seed_model_ranks.py"  # run under torchrun, one process per rank


def replica_variants(replicas):
    """The seed user's setup: one TF process, MirroredStrategy over
    `replicas` devices; and PyTorch with `replicas` torchrun ranks (gloo),
    DDP for the dense part."""
    extra = ("--replicas", str(replicas))
    out = [("tensorflow", f"dense x{replicas}", "tf2_seed_model_replicas.py", "dense", extra),
           ("tensorflow", f"native x{replicas}", "tf2_seed_model_replicas.py", "native", extra),
           ("tensorflow", f"native best x{replicas}", "tf2_seed_model_replicas.py", "native_best",
            extra),
           ("tensorflow", f"tfra x{replicas}", "tf2_seed_model_replicas.py", "tfra", extra)]
    for way, args in EMBER_WAYS:
        out.append(("tensorflow", f"ember {way} x{replicas}", "tf2_seed_model_replicas.py",
                    "ember", args + extra))
    out += [("pytorch", f"dense x{replicas}", RANKS_SCRIPT, "dense", ()),
            ("pytorch", f"native x{replicas}", RANKS_SCRIPT, "native", ())]
    for sharding in ("table_wise", "column_wise", "row_wise"):
        out.append(("pytorch", f"torchrec {sharding}", RANKS_SCRIPT, "torchrec",
                    ("--sharding", sharding)))
    for s in (0, 1):
        out.append(("pytorch", f"ember shuffle s={s}", RANKS_SCRIPT, "ember",
                    ("--staleness", str(s))))
        out.append(("pytorch", f"ember no shuffle s={s}", RANKS_SCRIPT, "ember",
                    ("--no_shuffle", "--staleness", str(s))))
    return out


def run(variant, args):
    _, _, script, mode, extra = variant
    launcher = [sys.executable]
    if script == RANKS_SCRIPT:
        launcher += ["-m", "torch.distributed.run", "--standalone",
                     f"--nproc_per_node={args.replicas}"]
    cmd = launcher + [os.path.join(HERE, script), "--mode", mode, "--steps", str(args.steps),
                      "--compute_ms", str(args.compute_ms), "--scale", str(args.scale)] + list(extra)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    lines = (proc.stdout + proc.stderr).splitlines()
    # The cause, not the launcher's wrapper (torchrun's ChildFailedError).
    errors = [l for l in lines if "Error: " in l and "ChildFailedError" not in l]
    tail = errors[-1] if errors else "\n".join(lines[-15:])
    return {"error": f"exit {proc.returncode}: {tail}"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--compute_ms", type=float, default=1.0)
    p.add_argument("--scale", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replicas", type=int, default=1,
                   help="N > 1: TensorFlow under MirroredStrategy over N logical devices, "
                        "PyTorch on N torchrun ranks")
    p.add_argument("--framework", choices=["tensorflow", "pytorch"],
                   help="run only this framework's variants")
    args = p.parse_args()
    global VARIANTS, PEERS
    if args.replicas > 1:
        VARIANTS = replica_variants(args.replicas)
        PEERS = {f"native x{args.replicas}", f"native best x{args.replicas}",
                 f"tfra x{args.replicas}", "torchrec table_wise", "torchrec column_wise",
                 "torchrec row_wise"}
    if args.framework:
        VARIANTS = [v for v in VARIANTS if v[0] == args.framework]
    print(f"# seed model: 17 features, batch 128, dim 8, cardinalities / {args.scale}, Adagrad, "
          f"{args.compute_ms} ms simulated compute, {args.steps} steps (30 warm-up), "
          f"{args.rounds} alternating rounds, {os.cpu_count()} cores, seed 1", flush=True)
    results = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            res = run(v, args)
            results[v].append(res)
            print(f"  round {r + 1} {v[0]} {v[1]}: "
                  + (res["error"] if "error" in res else f"{res['ms_per_step']:.2f} ms/step"),
                  flush=True)
    print()
    print("ms/step and CPU ms/step: medians; over dense: ms/step above the framework's step "
          "without embeddings; vs peer: the fastest peer's ms/step over this one's; cost/peer: "
          "over dense against the fastest peer's over dense")
    print(f"{'framework':<11} {'path':<22} {'ms/step':>8} {'cpu ms':>7} {'shards cpu':>10} "
          f"{'over dense':>10} {'vs peer':>8} {'cost/peer':>9}  loss curve")
    configs = []
    for fw in ("tensorflow", "pytorch"):
        rows = {}
        for v in (x for x in VARIANTS if x[0] == fw):
            ok = [x for x in results[v] if "error" not in x]
            if ok:
                rows[v[1]] = (statistics.median(x["ms_per_step"] for x in ok),
                              statistics.median(x["cpu_ms_per_step"] for x in ok),
                              statistics.median(x["shard_cpu_ms_per_step"] for x in ok), ok[-1])
        peer = min((rows[p][0] for p in rows if p in PEERS), default=None)
        dense = rows.get("dense", rows.get(f"dense x{args.replicas}", (None,)))[0]
        for v in (x for x in VARIANTS if x[0] == fw):
            if v[1] not in rows:
                print(f"{fw:<11} {v[1]:<22} failed: {results[v][-1]['error']}")
                continue
            ms, cpu, shard, last = rows[v[1]]
            over = f"{ms - dense:10.2f}" if dense is not None else f"{'':>10}"
            vs = f"{peer / ms:7.2f}x" if peer else f"{'':>8}"
            cost = (f"{(ms - dense) / (peer - dense):9.2f}"
                    if peer and dense is not None and peer > dense else f"{'':>9}")
            print(f"{fw:<11} {v[1]:<22} {ms:8.2f} {cpu:7.2f} {shard:10.2f} {over} {vs} {cost}  "
                  f"{last['loss_curve']}")
            configs.append(f"  {fw} {v[1]}: {last.get('config', '')}")
        if peer and dense:
            print(f"{fw:<11} {'(no embeddings)':<22} the most any path can reach vs the fastest "
                  f"peer: {peer / dense:.2f}x")
    if args.replicas > 1:
        print("\n# ops per node step (TensorFlow's profiler, 2 steps; DeserializeSparse grows "
              "with replicas x features)")
        for v in (x for x in VARIANTS if x[0] == "tensorflow"):
            ok = [x for x in results[v] if "error" not in x]
            if ok:
                print(f"  {v[1]:<19} {ok[-1].get('ops', {})}")
    print("\n# configurations\n" + "\n".join(configs))
    versions = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    wanted = ("tensorflow=", "tensorflow-recommenders-addons", "tf_keras", "tf-keras", "keras=", "torch=",
              "torchrec", "fbgemm", "numpy=")
    print("\n# wheels: " + ", ".join(l for l in versions.splitlines() if l.lower().startswith(wanted)))


if __name__ == "__main__":
    main()
