"""The reference workload of ../shared/WORKLOAD.md for the Python seed model
examples: 17 sparse features (Zipf 1.05 ids, hashed to 64 bits; features
0-11 one id per example, 12-16 one to eight ids pooled by mean), batch 128,
a label a small model can learn, and the timing every variant reports.

Every variant (tf2_seed_model.py, torch_seed_model.py) trains on the same
batches from the same seed, prints its loss curve and one JSON line of
figures; seed_model_bench.py runs them side by side.
"""

import argparse
import json
import os
import time

import numpy as np

CARDINALITIES = [10_000_000, 5_000_000, 2_000_000, 1_000_000, 1_000_000, 500_000, 200_000,
                 100_000, 50_000, 20_000, 10_000, 5_000, 1_000, 500, 100, 50, 10]
NUM_FEATURES = len(CARDINALITIES)
MULTI_HOT = set(range(12, 17))  # 1..8 ids per example, mean-pooled
DIM = 8
BATCH = 128
ZIPF = 1.05
LEARNING_RATE = 0.01
INITIAL_ACCUMULATOR = 0.1


def combiner(feature: int) -> str:
    return "mean" if feature in MULTI_HOT else "sum"


def cardinalities(scale: int):
    return [max(c // scale, 1) for c in CARDINALITIES]


def splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashed_id(feature: int, rank: np.ndarray) -> np.ndarray:
    """The 64-bit id of rank `rank` of feature `feature`, as int64 bits."""
    return splitmix64((np.uint64(feature) << np.uint64(40)) | rank.astype(np.uint64)).view(np.int64)


class Batch:
    """One batch: per feature (lengths int64 [batch], ids int64 [sum]), and
    labels float32 [batch, 1]."""

    def __init__(self, features, labels):
        self.features = features
        self.labels = labels

    def offsets(self, f: int) -> np.ndarray:
        lengths = self.features[f][0]
        out = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=out[1:])
        return out


def make_batches(num_batches: int, scale: int = 100, seed: int = 1, batch: int = BATCH):
    rng = np.random.default_rng(seed)
    cards = cardinalities(scale)
    cdfs = []
    for n in cards:
        p = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** ZIPF
        cdfs.append(np.cumsum(p / p.sum()))
    batches = []
    for _ in range(num_batches):
        features = []
        score = rng.normal(scale=0.3, size=batch)
        for f, cdf in enumerate(cdfs):
            lengths = (rng.integers(1, 9, size=batch) if f in MULTI_HOT
                       else np.ones(batch, dtype=np.int64)).astype(np.int64)
            ranks = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), len(cdf) - 1)
            ids = hashed_id(f, ranks)
            if f < 4:
                # The label depends on the ids of the first features: a value
                # in [-1, 1) per id that the embeddings can learn.
                u = (splitmix64(ids.view(np.uint64) ^ np.uint64(0x5EED)) >> np.uint64(11))
                score += u.astype(np.float64) / float(1 << 53) * 2 - 1
            features.append((lengths, ids))
        labels = (score > 0).astype(np.float32).reshape(batch, 1)
        batches.append(Batch(features, labels))
    return batches


def bucket(ids: np.ndarray, n: int) -> np.ndarray:
    """Id hashing of a native model's fixed-size table: the id mod n."""
    return (ids.view(np.uint64) % np.uint64(n)).astype(np.int64)


def shard_cpu_seconds(pids) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Meter:
    """Wall time and process CPU of the timed steps (after `warmup`), the
    shards' CPU when their pids are given, and the loss curve."""

    def __init__(self, warmup: int, shard_pids=()):
        self.warmup = warmup
        self.shard_pids = list(shard_pids)
        self.losses = []
        self._start = None

    def step(self, index: int, loss: float):
        self.losses.append(loss)
        if index == self.warmup - 1:
            self._start = (time.perf_counter(), time.process_time(),
                           shard_cpu_seconds(self.shard_pids))
            self._steps = 0
        elif self._start is not None:
            self._steps += 1

    def result(self, **extra) -> dict:
        wall0, cpu0, shard0 = self._start
        n = max(self._steps, 1)
        out = {
            "ms_per_step": (time.perf_counter() - wall0) * 1e3 / n,
            "cpu_ms_per_step": (time.process_time() - cpu0) * 1e3 / n,
            "shard_cpu_ms_per_step": ((shard_cpu_seconds(self.shard_pids) - shard0) * 1e3 / n
                                      if self.shard_pids else 0.0),
            "timed_steps": n,
            "loss_curve": loss_curve(self.losses),
        }
        out.update(extra)
        return out


def loss_curve(losses, points: int = 8):
    """Mean loss over `points` equal windows of the run."""
    chunks = np.array_split(np.asarray(losses, dtype=np.float64), points)
    return [round(float(c.mean()), 4) for c in chunks if len(c)]


def arguments(description: str, modes, extra=None):
    """The variants' common flags; `extra(parser)` adds a script's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--mode", choices=modes, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--compute_ms", type=float, default=1.0,
                   help="simulated accelerator compute per step (sleep; the host is free)")
    p.add_argument("--scale", type=int, default=100,
                   help="cardinalities divided by this (100: the tests' variant; 1: the full 20M ids)")
    p.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    p.add_argument("--batches", type=int, default=64, help="distinct batches, cycled")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shards", default="",
                   help="host:port,...; inproc:N for N shards in the process; "
                        "empty: start a local 2-shard cluster")
    p.add_argument("--staleness", type=int, default=0,
                   help="Ember's staleness bound (0, the layers' default: synchronous, early fetch)")
    if extra:
        extra(p)
    return p.parse_args()


def ember_config(args) -> str:
    """How an Ember variant ran, for the benchmark's table."""
    where = (f"{args.shards[len('inproc:'):]} shards in the process" if args.shards.startswith("inproc:")
             else "2 ember-server shards on 127.0.0.1" if not args.shards else f"shards {args.shards}")
    sync = "s = 0, early fetch" if args.staleness == 0 else f"s = {args.staleness}"
    return f"{where}, {sync}, Adagrad on the shards"


def run_on_ember(args, train) -> dict:
    """Runs train(client, meter) -> extra figures on the cluster of
    --shards, or on a local 2-shard cluster started (and stopped) here, and
    returns the meter's result with the shards' CPU when their pids are known."""
    import ember
    from ember.local_cluster import LocalCluster
    cluster = None
    if args.shards.startswith("inproc:"):
        # The shards' CPU is the process's own.
        meter = Meter(args.warmup)
        extra = train(ember.Client(inproc=int(args.shards[len("inproc:"):])), meter)
        return meter.result(**extra)
    if args.shards:
        addresses, pids = args.shards.split(","), []
    else:
        cluster = LocalCluster(shards=2)
        addresses, pids = cluster.addresses, cluster.pids
    try:
        meter = Meter(args.warmup, pids)
        extra = train(ember.Client(addresses), meter)
        return meter.result(**extra)
    finally:
        if cluster:
            cluster.stop()


def emit(result: dict):
    print("RESULT " + json.dumps(result), flush=True)
