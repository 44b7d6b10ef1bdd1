"""ember.tf under tf.distribute: one layer, four replicas of one process
(MirroredStrategy over four logical CPU devices), merged into one request
per shard per node step. The rows end bit-identical to four merged
ember.StepPipelines fed the same batch streams, and equal one replica fed
the concatenated global batch (bit-identical where the sums are exact,
within the stated rounding bound otherwise); Keras' fit trains for several
epochs with and without the strategy."""

import itertools
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed in this environment")

REPLICAS = 4
# Before any TF op runs: four logical CPU devices for MirroredStrategy.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)])

import ember  # noqa: E402
import ember.tf as etf  # noqa: E402
from ember.local_cluster import LocalCluster  # noqa: E402
from threads_and_metrics import exchange_requests, run_threads  # noqa: E402

_names = (f"dist{i}" for i in itertools.count())
_workers = itertools.count(300)


def mirrored():
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def new_table(client, dim, optimizer=None, init=None):
    """A fresh table; tables made with the same arguments start identical."""
    table = next(_names)
    client.create_table(table, dim, optimizer=optimizer or {"adagrad": {"learning_rate": 0.1}},
                        initializer=init or {"uniform": {"min": -1, "max": 1}, "seed": 11})
    return table


def ragged(rng, batch, vocab, max_ids=4):
    lengths = rng.integers(0, max_ids + 1, size=batch)
    values = rng.integers(0, vocab, size=int(lengths.sum())).astype(np.int64)
    return tf.RaggedTensor.from_row_lengths(values, lengths.astype(np.int64))


def streams(rng, steps, batch, dim, vocab=40, dyadic=False):
    """Per step and replica (ids_a, ids_b, y_a, y_b): two features over one
    table, and the d(pooled) each pushes (the loss sum(pooled * y))."""
    def grads():
        if dyadic:  # sums of these are exact in float32
            return (rng.integers(-4, 5, size=(batch, dim)) / 4).astype(np.float32)
        return rng.normal(size=(batch, dim)).astype(np.float32)
    return [[(ragged(rng, batch, vocab), ragged(rng, batch, vocab), grads(), grads())
             for _ in range(REPLICAS)] for _ in range(steps)]


def dataset(elements):
    """tf.data over a list of (ids_a, ids_b, y_a, y_b) batches, in order."""
    return tf.data.Dataset.from_tensor_slices(
        (tf.stack([e[0] for e in elements]), tf.stack([e[1] for e in elements]),
         np.stack([e[2] for e in elements]), np.stack([e[3] for e in elements])))


def features(a, b, ya, yb):
    return {"a": a, "b": b}


def targets(a, b, ya, yb):
    return ya, yb


def concat(parts):
    """One global batch from the replicas' batches, in replica order."""
    return (tf.concat([p[0] for p in parts], 0), tf.concat([p[1] for p in parts], 0),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))


def push_y(layer, step, y):
    """One step of the loss sum(pooled * y): pushes d(pooled) = y."""
    with tf.GradientTape() as tape:
        out = layer(step)
        loss = tf.reduce_sum(out["a"] * y[0]) + tf.reduce_sum(out["b"] * y[1])
    tape.gradient(loss, [layer.anchor])


def train_under_strategy(client, table, data, per_replica_input=True):
    """Trains `data` with a layer made in a MirroredStrategy's scope, each
    replica pushing d(pooled) = its y; returns the layer's merger stats."""
    strategy = mirrored()
    with strategy.scope():
        layer = etf.EmbeddingLayer(client, [("a", table), ("b", table)],
                                   worker_id=next(_workers))
    assert layer.replicas == REPLICAS
    if per_replica_input:
        flat = [part for step in data for part in step]
        dist = strategy.distribute_datasets_from_function(
            lambda ctx: layer.prefetch(dataset(flat), features, then=targets))
    else:
        global_ds = dataset([concat(step) for step in data])
        dist = strategy.experimental_distribute_dataset(
            layer.prefetch(global_ds, features, then=targets, step_per_example=True,
                           global_batches=True))

    def replica_step(step, y):
        push_y(layer, step, y)

    @tf.function
    def train(it):
        strategy.run(replica_step, args=next(it))

    it = iter(dist)
    for _ in data:
        train(it)
    layer.flush()
    stats = layer.merger.stats()
    layer.close()
    return stats


def train_merged_pipelines(client, table, data):
    """The same batch streams through four ember.StepPipelines sharing one
    ember.StepMerger, each rank on its own thread."""
    merger = ember.StepMerger(client, REPLICAS, worker_id=next(_workers))
    pipes = [ember.StepPipeline(client, [("a", table), ("b", table)], merger=merger, rank=r)
             for r in range(REPLICAS)]
    def rank(r):
        p, depth, steps = pipes[r], pipes[r].prefetch_depth, len(data)

        def batch(t):
            a, b, _, _ = data[t][r]
            return [(a.row_splits.numpy(), a.values.numpy()),
                    (b.row_splits.numpy(), b.values.numpy())]
        for t in range(min(depth + 1, steps)):
            p.prefetch(t, batch(t))
        for t in range(steps):
            p.wait(t)
            p.push(t, [data[t][r][2], data[t][r][3]])
            if t + depth + 1 < steps:
                p.prefetch(t + depth + 1, batch(t + depth + 1))
        p.flush()
        p.close()

    run_threads(rank, REPLICAS)


def keys_of(data):
    return np.unique(np.concatenate([np.concatenate([p[0].values.numpy(), p[1].values.numpy()])
                                     for step in data for p in step])).astype(np.int64)


@pytest.mark.parametrize("per_replica_input", [True, False], ids=["from_function", "global"])
def test_four_replicas_end_bit_identical_to_four_merged_pipelines(client, per_replica_input):
    """Adagrad, random gradients: the strategy's rows equal, bit for bit,
    those of the C++ StepMerger (through ember.StepPipeline) fed the same
    four batch streams; one row off would fail it. Input from
    distribute_datasets_from_function (per-replica batches dealt in turn) or
    experimental_distribute_dataset (global batches split by TF)."""
    rng = np.random.default_rng(31)
    data = streams(rng, steps=8, batch=6, dim=4)
    ours, theirs = new_table(client, 4), new_table(client, 4)
    stats = train_under_strategy(client, ours, data, per_replica_input)
    train_merged_pipelines(client, theirs, data)
    keys = keys_of(data)
    before = client.lookup_rows(new_table(client, 4), keys, read_only=False)
    got, want = client.lookup_rows(ours, keys), client.lookup_rows(theirs, keys)
    assert not np.array_equal(got, before), "the rows did not train"
    assert np.array_equal(got, want), np.max(np.abs(got - want))
    # One merged exchange per node step (plus the final flush's).
    assert len(data) <= stats["fetch_rounds"] <= stats["rounds"] <= len(data) + 2, stats


def train_one_replica(client, table, data):
    """One replica (no strategy) fed each step's concatenated global batch."""
    layer = etf.EmbeddingLayer(client, [("a", table), ("b", table)], worker_id=next(_workers))
    assert layer.replicas == 1 and layer.merger is None
    ds = layer.prefetch(dataset([concat(step) for step in data]), features, then=targets)

    @tf.function
    def train(step, y):
        push_y(layer, step, y)

    for step, y in ds:
        train(step, y)
    layer.flush()
    layer.close()


def test_four_replicas_equal_one_replica_on_the_global_batch_bit_for_bit_when_sums_are_exact(
        client):
    """Gradients in quarters (their sums are exact in float32): the merged
    node's rank-order sums and one replica's example-order sums are the same
    numbers, so Adagrad's rows match bit for bit."""
    rng = np.random.default_rng(32)
    data = streams(rng, steps=6, batch=5, dim=3, dyadic=True)
    ours, single = new_table(client, 3), new_table(client, 3)
    train_under_strategy(client, ours, data, per_replica_input=True)
    train_one_replica(client, single, data)
    keys = keys_of(data)
    assert np.array_equal(client.lookup_rows(ours, keys), client.lookup_rows(single, keys))


def test_four_replicas_equal_one_replica_on_the_global_batch_within_the_sum_order_bound(client):
    """Random gradients, SGD (learning rate lr): a key's gradient in a step
    is a sum of n terms, which the node adds per replica, then across
    replicas in replica order, and one replica adds in example order. Each
    order is within gamma_n * sum|g| of the exact sum (gamma_n = n u / (1 -
    n u), u = 2^-24), so two orders differ by at most 2 gamma_n sum|g|; the
    update row - lr * g adds its own rounding (u |row| each side). Over the
    steps the bound per row element is the sum of those: the test computes
    it from the data and asserts the rows are within it (and not equal to
    the start)."""
    rng = np.random.default_rng(33)
    lr, dim = 0.5, 4
    data = streams(rng, steps=6, batch=6, dim=dim)
    opt = {"sgd": {"learning_rate": lr}}
    ours, single = new_table(client, dim, opt), new_table(client, dim, opt)
    train_under_strategy(client, ours, data, per_replica_input=True)
    train_one_replica(client, single, data)
    keys = keys_of(data)
    got, want = client.lookup_rows(ours, keys), client.lookup_rows(single, keys)

    u = 2.0 ** -24
    index = {int(k): i for i, k in enumerate(keys)}
    bound = np.zeros_like(want, dtype=np.float64)
    for step in data:
        a, b, ya, yb = concat(step)
        abs_sum = np.zeros_like(bound)
        terms = np.zeros(len(keys))
        for ids, y in ((a, ya), (b, yb)):
            for row, example_ids in enumerate(ids.to_list()):
                for k in example_ids:
                    abs_sum[index[k]] += np.abs(y[row])
                    terms[index[k]] += 1
        gamma = terms * u / (1 - terms * u)
        bound += 2 * gamma[:, None] * lr * abs_sum + 2 * u * (np.abs(want) + lr * abs_sum)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound), np.max(np.abs(got - want))


def keras_model(layer, keras):
    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = layer
            self.out = keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, step):
            return self.out(self.embed(step)["f"])

    return Model()


@pytest.mark.parametrize("strategy", ["mirrored", "none"])
def test_keras_fit_three_epochs_loss_falls_each_epoch_and_rows_move(client, strategy):
    """model.fit(epochs=3) over one prefetched dataset: the steps carry on
    across epochs (no 'expected step' error at the second), the element
    Keras draws before training under a strategy is skipped, every step is
    pushed, the loss falls each epoch, and the rows move. Under
    MirroredStrategy the global batches are split by TF
    (global_batches=True). steps_per_execution=2 without the strategy only:
    with it, Keras 3.15 on TF 2.16 fails on a plain Dense model too ("You
    must feed a value for placeholder tensor 'while/cond/Placeholder'")."""
    import keras
    table = new_table(client, 4, {"adagrad": {"learning_rate": 0.3}},
                      init={"constant": {"value": 0.0}})
    rng = np.random.default_rng(34)
    batches, global_batch = 6, 16
    ids = [ragged(rng, global_batch, vocab=30) for _ in range(batches)]
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.stack(ids), np.ones((batches, global_batch, 1), np.float32)))
    dist = tf.distribute.get_strategy() if strategy == "none" else mirrored()
    with dist.scope():
        layer = etf.EmbeddingLayer(client, [("f", table)], worker_id=next(_workers))
        model = keras_model(layer, keras)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                      steps_per_execution=2 if strategy == "none" else 1)
    assert layer.replicas == (1 if strategy == "none" else REPLICAS)
    ds = layer.prefetch(ds, features=lambda x, y: {"f": x}, then=lambda x, y: y,
                        step_per_example=True, global_batches=strategy != "none")
    history = model.fit(ds, epochs=3, verbose=0)
    layer.flush()
    losses = history.history["loss"]
    assert losses[0] > losses[1] > losses[2], losses
    assert all(p.stats()["steps_pushed"] == 3 * batches for p in layer.pipelines)
    keys = np.unique(np.concatenate([i.values.numpy() for i in ids]))
    assert np.abs(client.lookup_rows(table, keys)).sum() > 0
    layer.close()


def test_a_custom_loop_over_several_epochs_with_a_new_prefetch_per_epoch(client):
    """A new layer.prefetch(ds) each epoch (and a second pass over the same
    one) carries on with the pipeline's steps instead of starting again at
    first_step."""
    table = new_table(client, 2)
    layer = etf.EmbeddingLayer(client, [("a", table), ("b", table)], worker_id=next(_workers))
    rng = np.random.default_rng(35)
    data = [step[0] for step in streams(rng, steps=3, batch=4, dim=2)]

    @tf.function
    def train(step, y):
        push_y(layer, step, y)

    seen = []
    reused = layer.prefetch(dataset(data), features, then=targets)
    for epoch in range(4):
        ds = reused if epoch % 2 else layer.prefetch(dataset(data), features, then=targets)
        for step, y in ds:
            seen.append(int(step))
            train(step, y)
    layer.flush()
    assert seen == list(range(12))
    assert layer.pipeline.stats()["steps_pushed"] == 12
    layer.close()


def test_the_shards_receive_one_request_per_shard_per_node_step():
    """Four replicas, 10 node steps, two shard processes: each shard's own
    counter of Exchange calls grows by one per node step (plus the final
    flush), not by one per replica. A push whose next batch the input
    pipeline has not staged yet goes alone, and that fetch in a round of
    its own (seen on a loaded machine: 13 for 10 steps), so the bound is a
    push and a fetch per node step; four unmerged replicas would send at
    least 4 per node step."""
    steps = 10
    with LocalCluster(shards=2, extra_args=["--metrics_port=0"]) as cluster:
        client = ember.Client(cluster.addresses)
        table = new_table(client, 4)
        data = streams(np.random.default_rng(36), steps=steps, batch=6, dim=4)
        before = exchange_requests(cluster.metrics_addresses)
        train_under_strategy(client, table, data, per_replica_input=True)
        after = exchange_requests(cluster.metrics_addresses)
    grew = [a - b for a, b in zip(after, before)]
    assert all(steps <= g <= 2 * steps + 2 for g in grew), grew


def test_unsupported_strategies_and_calls_outside_a_replica_name_what_is_supported(client):
    table = new_table(client, 2)
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match="MirroredStrategy"):
            etf.EmbeddingLayer(client, [("a", table)], worker_id=next(_workers))
    with mirrored().scope():
        layer = etf.EmbeddingLayer(client, [("a", table)], worker_id=next(_workers))
    with pytest.raises(ValueError, match="inside strategy.run"):
        layer(tf.constant(0, tf.int64))
    layer.close()
    with pytest.raises(ValueError, match="replicas 0"):
        etf.EmbeddingLayer(client, [("a", table)], replicas=0)


def test_multi_worker_mirrored_two_processes_each_one_ssp_worker(cluster):
    """MultiWorkerMirroredStrategy across two real TF processes (a cluster
    of two workers on 127.0.0.1, one replica each, a dense variable
    all-reduced every step): each process is one SSP worker (its task id)
    and the rows end equal, bit for bit, to two ember.StepPipelines fed the
    same streams (zero rows, gradients in quarters and SGD keep every sum
    exact, so the order in which the shards apply the two workers' pushes
    does not matter; one row off fails it)."""
    import json
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tf_multiworker_worker import stream

    steps, seed = 6, 51
    client = ember.Client(cluster.addresses)
    zeros = {"zeros": {}, "seed": 1}
    sgd = {"sgd": {"learning_rate": 0.5}}
    ours, theirs = next(_names), next(_names)
    for t in (ours, theirs):
        client.create_table(t, 3, optimizer=sgd, initializer=zeros)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    out = tempfile.mkdtemp(prefix="ember-mwms-")
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for task in range(2):
        tf_config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                     "task": {"type": "worker", "index": task}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(here, "tf_multiworker_worker.py"),
             ",".join(cluster.addresses), ours, str(steps), str(seed), out],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(l[-3000:] for l in logs)
    dense = [open(os.path.join(out, f"worker{t}.done")).read() for t in range(2)]
    shutil.rmtree(out)
    assert dense[0] == dense[1], dense  # the all-reduce kept the workers' dense part equal

    data = [stream(seed, task, steps) for task in range(2)]
    pipes = [ember.StepPipeline(client, [("a", theirs), ("b", theirs)], worker_id=700 + task)
             for task in range(2)]

    def worker(task):
        for t, (a, b, ya, yb) in enumerate(data[task]):
            csr = [(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), ids)
                   for lens, ids in (a, b)]
            pipes[task].prefetch(t, csr)
            pipes[task].wait(t)
            pipes[task].push(t, [ya, yb])
        pipes[task].close()

    run_threads(worker, 2)
    keys = np.unique(np.concatenate([ids for d in data for s in d for _, ids in s[:2]]))
    got, want = client.lookup_rows(ours, keys), client.lookup_rows(theirs, keys)
    assert np.any(got != 0), "the rows did not train"
    assert np.array_equal(got, want), np.max(np.abs(got - want))
