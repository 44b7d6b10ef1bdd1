"""Per-step cost of Ember's Python layers beyond the C++ pipeline.

One process, one local 2-shard cluster, the reference workload (17 features,
batch 128, dim 8, cardinalities / 100, Adagrad), s = 0, no simulated compute.
Each variant runs the same steps on its own pipeline; rounds alternate them,
and the table gives medians of wall and process-CPU ms per step:

  c++ loop      prefetch(t+1) / wait(t) / push(t) in C++ over the C ABI
                (StepPipeline._run_native_loop: no Python per step)
  python        the same loop in Python (ember.StepPipeline)
  python out=   the same, waiting into preallocated arrays
  torch module  ember.torch.EmbeddingBagCollection: KeyedJaggedTensor in,
                forward, values().sum().backward(), with prefetching
  torch floor   the torch module's step without Ember: the same
                KeyedJaggedTensors iterated, values().sum().backward() on a
                [batch, sum of dims] leaf. Every PyTorch model pays this; the
                module's own cost is what it adds over this plus the C++ loop.
  tf input      (--framework tf) the TF layer's input pipeline and step
                function without Ember: tf.data slicing the same 17 ragged
                features, a map dropping them, next(iterator) inside a
                tf.function. Every TF model pays this; the TF layer's own
                cost is what it adds over this plus the C++ loop.
  tf layer      ember.tf.EmbeddingLayer under tf.function with that tf.data
                input pipeline, its 17 outputs concatenated as a model's
                first dense layer takes them (--framework tf; its own
                process, as TensorFlow and PyTorch are best not mixed in one)
  tf packed     the same with EmbeddingLayer(packed=True): one
                [batch, sum of dims] output and one gradient

    PYTHONPATH=build/python .venv/bin/python bench/python_overhead.py [--framework tf]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import seed_workload as w  # noqa: E402

import ember  # noqa: E402
from ember.local_cluster import LocalCluster  # noqa: E402

NAMES = [f"f{f}" for f in range(w.NUM_FEATURES)]


def csr_batches(batches):
    return [[(b.offsets(f), b.features[f][1]) for f in range(w.NUM_FEATURES)] for b in batches]


class Runner:
    def __init__(self, client, steps):
        self.client = client
        self.steps = steps
        self.worker = 0

    def pipeline(self):
        self.worker += 1
        return ember.StepPipeline(client=self.client, worker_id=self.worker, staleness=0,
                                  features=[(n, f"ov_t{f}", w.combiner(f)) for f, n in enumerate(NAMES)])

    def native(self, csr):
        with self.pipeline() as pipe:
            pipe._run_native_loop(csr, 0, self.steps)

    def python(self, csr, out=False):
        zeros = [np.zeros((w.BATCH, w.DIM), np.float32) for _ in NAMES]
        bufs = [np.empty((w.BATCH, w.DIM), np.float32) for _ in NAMES] if out else None
        with self.pipeline() as pipe:
            pipe.prefetch(0, csr[0])
            for t in range(self.steps):
                if t + 1 < self.steps:
                    pipe.prefetch(t + 1, csr[(t + 1) % len(csr)])
                pipe.wait(t, out=bufs)
                pipe.push(t, zeros)

    @staticmethod
    def kjts(batches):
        import torch
        import ember.torch as et
        return [et.KeyedJaggedTensor(
            NAMES, torch.from_numpy(np.concatenate([ids for _, ids in b.features])),
            torch.from_numpy(np.concatenate([ls for ls, _ in b.features]))) for b in batches]

    def torch_module(self, batches):
        import ember.torch as et
        kjts = self.kjts(batches)
        tables = [et.EmbeddingBagConfig(f"ov_t{f}", w.DIM, [n], pooling=w.combiner(f),
                                        optimizer={"adagrad": {"learning_rate": 0.01}})
                  for f, n in enumerate(NAMES)]
        self.worker += 1
        with et.EmbeddingBagCollection(self.client, tables, staleness=0, worker_id=self.worker,
                                       create_tables=False) as ebc:
            stream = (kjts[t % len(kjts)] for t in range(self.steps))
            for kjt in et.prefetching(stream, ebc):
                ebc(kjt).values().sum().backward()

    def torch_floor(self, batches):
        import torch
        kjts = self.kjts(batches)
        for t in range(self.steps):
            kjt = kjts[t % len(kjts)]
            kjt.values()
            x = torch.zeros((w.BATCH, w.NUM_FEATURES * w.DIM), requires_grad=True)
            x.sum().backward()

    def tf_dataset(self, batches):
        """[num_batches, batch, (ids)] per feature, sliced per step by tf.data."""
        import tensorflow as tf
        stacked = {n: tf.RaggedTensor.from_row_lengths(
            tf.RaggedTensor.from_row_lengths(np.concatenate([b.features[f][1] for b in batches]),
                                             np.concatenate([b.features[f][0] for b in batches])),
            np.full(len(batches), w.BATCH, dtype=np.int64)) for f, n in enumerate(NAMES)}
        return tf.data.Dataset.from_tensor_slices(stacked).repeat().take(self.steps)

    def tf_input(self, batches):
        import tensorflow as tf
        ds = self.tf_dataset(batches).enumerate().map(
            lambda step, x: (step, tf.zeros([], tf.int8))).prefetch(2)
        iterator = iter(ds)

        @tf.function
        def step_fn():
            step, _ = next(iterator)
            return step

        for _ in range(self.steps):
            step_fn()

    def tf_layer(self, batches, packed=False):
        import tensorflow as tf
        import ember.tf as etf
        self.worker += 1
        layer = etf.EmbeddingLayer(self.client, [(n, f"ov_t{f}", w.combiner(f))
                                                 for f, n in enumerate(NAMES)],
                                   staleness=0, worker_id=self.worker, packed=packed)

        def ids(x):
            return x

        def nothing(x):  # the step needs no inputs but its number
            return tf.zeros([], tf.int8)

        ds = layer.prefetch(self.tf_dataset(batches), ids, then=nothing).prefetch(2)

        # The iterator inside the step function, as TF2 users run it: the
        # step's number never crosses into Python.
        iterator = iter(ds)

        @tf.function
        def step_fn():
            step, _ = next(iterator)
            with tf.GradientTape() as tape:
                pooled = layer(step)
                # A model's first dense layer takes the features side by side.
                x = pooled if packed else tf.concat([pooled[n] for n in NAMES], 1)
                loss = tf.reduce_sum(x)
            return tape.gradient(loss, [layer.anchor])

        for _ in range(self.steps):
            step_fn()
        layer.close()


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--framework", choices=["torch", "tf"], default="torch")
    args = p.parse_args()
    batches = w.make_batches(64, 100, seed=1)
    csr = csr_batches(batches)
    print(f"# {os.cpu_count()} cores; reference workload / 100, batch {w.BATCH}, dim {w.DIM}, "
          f"s = 0, {args.steps} steps x {args.rounds} rounds, seed 1", flush=True)
    with LocalCluster(shards=2) as cluster:
        client = ember.Client(cluster.addresses)
        for f in range(w.NUM_FEATURES):
            client.create_table(f"ov_t{f}", w.DIM, optimizer={"adagrad": {"learning_rate": 0.01}},
                                initializer={"normal": {"stddev": 1.0}, "seed": f})
        run = Runner(client, args.steps)
        variants = {"c++ loop": lambda: run.native(csr), "python": lambda: run.python(csr),
                    "python out=": lambda: run.python(csr, out=True)}
        if args.framework == "torch":
            variants["torch floor"] = lambda: run.torch_floor(batches)
            variants["torch module"] = lambda: run.torch_module(batches)
        else:
            variants["tf input"] = lambda: run.tf_input(batches)
            variants["tf layer"] = lambda: run.tf_layer(batches)
            variants["tf packed"] = lambda: run.tf_layer(batches, packed=True)
        for fn in variants.values():  # warm the tables and the code
            fn()
        results = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                results[name].append(timed(fn))
    base_wall = statistics.median(r[0] for r in results["c++ loop"]) * 1e3 / args.steps
    base_cpu = statistics.median(r[1] for r in results["c++ loop"]) * 1e3 / args.steps
    print(f"{'variant':<14} {'ms/step':>8} {'cpu ms/step':>12} {'+ms vs c++':>11} {'+cpu ms':>8}")
    for name, rs in results.items():
        wall = statistics.median(r[0] for r in rs) * 1e3 / args.steps
        cpu = statistics.median(r[1] for r in rs) * 1e3 / args.steps
        print(f"{name:<14} {wall:8.3f} {cpu:12.3f} {wall - base_wall:11.3f} {cpu - base_cpu:8.3f}")
    med = {name: (statistics.median(r[0] for r in rs) * 1e3 / args.steps,
                  statistics.median(r[1] for r in rs) * 1e3 / args.steps)
           for name, rs in results.items()}
    floor = "tf input" if args.framework == "tf" else "torch floor"
    for name in ("tf layer", "tf packed", "torch module"):
        if name in med:
            own = [med[name][i] - med[floor][i] - med["c++ loop"][i] for i in (0, 1)]
            print(f"{name}'s own cost ({name} - {floor} - c++ loop): {own[0]:.3f} ms/step, "
                  f"{own[1]:.3f} cpu ms/step")


if __name__ == "__main__":
    main()
