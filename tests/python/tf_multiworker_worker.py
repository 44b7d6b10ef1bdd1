"""One worker of the MultiWorkerMirroredStrategy test (test_tf_distribute.py):
a TF process of a two-worker cluster (TF_CONFIG from the test), one replica
each on the CPU, the ember.tf layer made in the strategy's scope (its SSP
worker: the task id), a dense variable all-reduced across the workers each
step. Writes "ok" to OUT/worker<task>.done when done.

    TF_CONFIG=... python tf_multiworker_worker.py SHARDS TABLE STEPS SEED OUT
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ember  # noqa: E402
import ember.tf as etf  # noqa: E402

DIM, BATCH, VOCAB = 3, 5, 30


def stream(seed, task, steps):
    """Worker `task`'s batches: (ids_a, ids_b, y_a, y_b) per step, the y in
    quarters (their sums are exact in float32, in any order)."""
    rng = np.random.default_rng([seed, task])
    out = []
    for _ in range(steps):
        parts = []
        for _ in range(2):
            lengths = rng.integers(0, 4, size=BATCH)
            parts.append((lengths.astype(np.int64),
                          rng.integers(0, VOCAB, size=int(lengths.sum())).astype(np.int64)))
        ys = [(rng.integers(-4, 5, size=(BATCH, DIM)) / 4).astype(np.float32) for _ in range(2)]
        out.append((parts[0], parts[1], ys[0], ys[1]))
    return out


def main():
    shards, table, steps, seed, out = sys.argv[1:6]
    steps, seed = int(steps), int(seed)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    client = ember.Client(shards.split(","))
    with strategy.scope():
        layer = etf.EmbeddingLayer(client, [("a", table), ("b", table)])
        w = tf.Variable(tf.ones([DIM]))
    assert layer.replicas == 1, layer.replicas
    data = stream(seed, task, steps)

    def dataset_fn(ctx):
        assert ctx.input_pipeline_id == task, (ctx.input_pipeline_id, task)
        def ragged(i):
            return tf.stack([tf.RaggedTensor.from_row_lengths(d[i][1], d[i][0]) for d in data])
        ds = tf.data.Dataset.from_tensor_slices(
            (ragged(0), ragged(1), np.stack([d[2] for d in data]), np.stack([d[3] for d in data])))
        return layer.prefetch(ds, lambda a, b, ya, yb: {"a": a, "b": b},
                              then=lambda a, b, ya, yb: (ya, yb))

    dist = strategy.distribute_datasets_from_function(dataset_fn)

    def replica_step(step, y):
        with tf.GradientTape() as tape:
            out_rows = layer(step)
            loss = (tf.reduce_sum(out_rows["a"] * y[0]) + tf.reduce_sum(out_rows["b"] * y[1])
                    + tf.reduce_sum(w * w) + tf.reduce_sum(w * tf.reduce_sum(y[0], 0)))
        g_anchor, g_w = tape.gradient(loss, [layer.anchor, w])
        # The dense part crosses the workers: one all-reduce per step (its
        # gradient depends on the worker's batch: without the all-reduce
        # the workers' w would differ).
        w.assign_sub(0.01 * tf.distribute.get_replica_context().all_reduce("sum", g_w))

    @tf.function
    def train(it):
        strategy.run(replica_step, args=next(it))

    it = iter(dist)
    for _ in range(steps):
        train(it)
    layer.close()
    with open(os.path.join(out, f"worker{task}.done"), "w") as f:
        f.write(" ".join(str(v) for v in w.numpy()))


if __name__ == "__main__":
    main()
