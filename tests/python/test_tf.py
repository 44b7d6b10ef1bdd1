"""ember.tf against two real shards: the layer's forward equals a numpy
reference, the gradients it pushes equal tf.GradientTape's, under
tf.function with a tf.data input pipeline and without one."""

import itertools
import os
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed in this environment")

import ember  # noqa: E402
import ember.tf as etf  # noqa: E402

_names = (f"tf{i}" for i in itertools.count())


def ragged_batches(rng, n, batch, vocab, max_ids=4, min_ids=0):
    out = []
    for _ in range(n):
        lengths = rng.integers(min_ids, max_ids + 1, size=batch)
        values = rng.integers(0, vocab, size=int(lengths.sum())).astype(np.int64)
        out.append(tf.RaggedTensor.from_row_lengths(values, lengths.astype(np.int64)))
    return out


def reference(client, table, ragged, combiner="sum"):
    """Pooled rows by TF ops over rows read from the shards (a variable)."""
    unique, inverse = np.unique(ragged.values.numpy(), return_inverse=True)
    rows = tf.Variable(client.lookup_rows(table, unique.astype(np.int64), read_only=False))
    segments = ragged.value_rowids()
    gathered = tf.gather(rows, inverse)
    pooled = tf.math.unsorted_segment_sum(gathered, segments, num_segments=ragged.nrows())
    if combiner == "mean":
        counts = tf.cast(tf.maximum(ragged.row_lengths(), 1), tf.float32)[:, None]
        pooled = pooled / counts
    return pooled, rows, unique


def new_layer(client, dim, lr=1.0, init=None, combiner="sum", features=("f",), **kw):
    table = next(_names)
    client.create_table(table, dim, optimizer={"sgd": {"learning_rate": lr}},
                        initializer=init or {"uniform": {"min": -1, "max": 1}, "seed": 2})
    return table, etf.EmbeddingLayer(client, [(f, table, combiner) for f in features], **kw)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_forward_equals_reference_and_push_equals_gradient_tape(client, combiner):
    rng = np.random.default_rng(5)
    table, layer = new_layer(client, 4, combiner=combiner, worker_id=21)
    (ids,) = ragged_batches(rng, 1, batch=8, vocab=25)
    ref, rows, unique = reference(client, table, ids, combiner)
    weight = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))

    dataset = layer.prefetch(tf.data.Dataset.from_tensors({"f": ids}), lambda x: x)

    @tf.function
    def train_step(step):
        with tf.GradientTape() as tape:
            pooled = layer(step)["f"]
            loss = tf.reduce_sum(pooled * weight)
        return pooled, tape.gradient(loss, layer.trainable_variables)

    for step, _ in dataset:
        pooled, grads = train_step(step)
    assert grads[0].shape == (0,)
    layer.flush()
    np.testing.assert_allclose(pooled.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)

    # SGD with learning rate 1: each row moved by minus its pushed gradient.
    after = client.lookup_rows(table, unique.astype(np.int64))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(reference_pool(rows, ids, combiner) * weight)
    expected = tf.convert_to_tensor(tape.gradient(loss, rows)).numpy()
    np.testing.assert_allclose(rows.numpy() - after, expected, rtol=1e-5, atol=1e-5)
    layer.close()


def reference_pool(rows, ids, combiner):
    _, inverse = np.unique(ids.values.numpy(), return_inverse=True)
    pooled = tf.math.unsorted_segment_sum(tf.gather(rows, inverse), ids.value_rowids(),
                                          num_segments=ids.nrows())
    if combiner == "mean":
        pooled = pooled / tf.cast(tf.maximum(ids.row_lengths(), 1), tf.float32)[:, None]
    return pooled


def test_sparse_tensor_input_without_prefetch_pooled_in_the_same_step(client):
    rng = np.random.default_rng(6)
    table, layer = new_layer(client, 3, worker_id=22, features=("a", "b"))
    batches = ragged_batches(rng, 3, batch=5, vocab=12)

    @tf.function
    def step_fn(a, b):
        with tf.GradientTape() as tape:
            out = layer({"a": a, "b": b.to_sparse()})
            loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
        tape.gradient(loss, layer.trainable_variables)
        return out

    for t in range(3):
        a, b = batches[t], batches[(t + 1) % 3]
        expected_b, _, _ = reference(client, table, b)
        expected_a, _, _ = reference(client, table, a)
        out = step_fn(a, b)
        layer.flush()
        np.testing.assert_allclose(out["a"].numpy(), expected_a.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["b"].numpy(), expected_b.numpy(), rtol=1e-5, atol=1e-5)
    assert layer.pipeline.stats()["steps_pushed"] == 3
    layer.close()


def test_packed_output_is_the_features_side_by_side_and_trains_the_same_rows(client):
    """packed=True: one [batch, 3 + 5] tensor equal to the concatenation of
    the per-feature outputs, and its one gradient moves the rows exactly as
    the per-feature gradients do (two copies of the same tables)."""
    rng = np.random.default_rng(8)
    pairs = []
    for copy in range(2):
        names = [next(_names), next(_names)]
        for name, dim, seed in zip(names, (3, 5), (4, 5)):
            client.create_table(name, dim, optimizer={"adagrad": {"learning_rate": 0.1}},
                                initializer={"uniform": {"min": -1, "max": 1}, "seed": seed})
        pairs.append(names)
    plain = etf.EmbeddingLayer(client, [("a", pairs[0][0]), ("b", pairs[0][1], "mean")],
                               worker_id=31)
    packed = etf.EmbeddingLayer(client, [("a", pairs[1][0]), ("b", pairs[1][1], "mean")],
                                worker_id=32, packed=True)
    assert packed.offsets == [0, 3, 8]
    batches = ragged_batches(rng, 6, batch=7, vocab=20)
    weights = [tf.constant(rng.normal(size=(7, 8)).astype(np.float32)) for _ in range(5)]

    def step_fn(layer):
        @tf.function
        def fn(a, b, weight):
            with tf.GradientTape() as tape:
                out = layer({"a": a, "b": b})
                x = out if layer is packed else tf.concat([out["a"], out["b"]], 1)
                loss = tf.reduce_sum(x * weight)
            tape.gradient(loss, layer.trainable_variables)
            return x
        return fn

    keys = np.arange(20, dtype=np.int64)
    initial = [client.lookup_rows(pairs[c][f], keys, read_only=False)
               for c in range(2) for f in range(2)]
    fns = [step_fn(plain), step_fn(packed)]
    for t in range(5):
        outs = [fn(batches[t], batches[t + 1], weights[t]) for fn in fns]
        assert outs[1].shape == (7, 8)
        np.testing.assert_array_equal(outs[1].numpy(), outs[0].numpy())
    plain.flush()
    packed.flush()
    for f in range(2):
        trained = client.lookup_rows(pairs[0][f], keys)
        assert not np.array_equal(trained, initial[f]), "the rows did not train"
        np.testing.assert_array_equal(client.lookup_rows(pairs[1][f], keys), trained)
    assert packed.pipeline.stats()["steps_pushed"] == 5
    plain.close()
    packed.close()


def test_lookup_of_a_step_never_prefetched_raises_with_the_pipelines_message(client):
    _, layer = new_layer(client, 2, worker_id=23)
    with pytest.raises(tf.errors.FailedPreconditionError, match="prefetch it first"):
        layer(tf.constant([0], tf.int64))
    layer.close()


def test_keras_fit_trains_through_the_layer_and_pushes_every_step(client):
    """A Keras model's own train_step (under tf.function) computes the
    anchor's gradient, which is the push."""
    import keras
    table, layer = new_layer(client, 4, lr=0.5, worker_id=24,
                             init={"constant": {"value": 0.0}})
    rng = np.random.default_rng(8)
    batches = ragged_batches(rng, 6, batch=8, vocab=10)
    labels = [np.ones((8, 1), np.float32) for _ in batches]
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.stack([tf.RaggedTensor.from_row_lengths(b.values, b.row_lengths()) for b in batches]),
         np.stack(labels)))
    ds = layer.prefetch(ds, features=lambda ids, y: {"f": ids}, then=lambda ids, y: y,
                        step_per_example=True)

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = layer
            self.out = keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, step):
            return self.out(self.embed(step)["f"])

    model = Model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(ds, epochs=1, verbose=0)
    layer.flush()
    assert layer.pipeline.stats()["steps_pushed"] == 6
    assert np.isfinite(history.history["loss"][0])
    # The rows moved: their gradients reached the shards.
    keys = np.unique(np.concatenate([b.values.numpy() for b in batches]))
    assert np.abs(client.lookup_rows(table, keys)).sum() > 0
    layer.close()


def test_a_prefetch_blocked_on_a_missing_push_ends_with_its_iterator(client):
    """An iterator that ran ahead of training (its map staged batches whose
    steps cannot be fetched before step 0 is pushed) is dropped instead:
    that must not hang."""
    import gc
    import time
    rng = np.random.default_rng(9)
    _, layer = new_layer(client, 2, worker_id=25)
    ds = tf.data.Dataset.from_tensor_slices(
        tf.stack(ragged_batches(rng, 5, batch=4, vocab=10)))
    it = iter(layer.prefetch(ds, lambda ids: {"f": ids}).prefetch(3))
    step, _ = next(it)
    assert int(step) == 0
    start = time.monotonic()
    del it
    gc.collect()
    assert time.monotonic() - start < 10, "the blocked prefetch held the iterator"
    layer.close()


def test_sgd_rows_equal_native_embedding_lookup_sparse_over_50_steps(client):
    """s = 0 and SGD: Ember's rows after 50 steps of a small model equal those
    of the same model over an in-graph variable (tf.nn.embedding_lookup_sparse
    and TensorFlow's SGD), within float tolerance."""
    vocab, dim, batch, lr = 64, 4, 16, 0.05
    table, layer = new_layer(client, dim, lr=lr, worker_id=26,
                             init={"uniform": {"min": -0.5, "max": 0.5}, "seed": 9})
    rng = np.random.default_rng(22)
    # embedding_lookup_sparse drops examples without ids: every one has some.
    batches = ragged_batches(rng, 50, batch=batch, vocab=vocab, min_ids=1)
    targets = [rng.normal(size=(batch, 1)).astype(np.float32) for _ in batches]
    initial = client.lookup_rows(table, np.arange(vocab, dtype=np.int64), read_only=False)

    def head():
        return (tf.Variable(np.linspace(-1, 1, dim, dtype=np.float32).reshape(dim, 1)),
                tf.Variable(np.zeros(1, np.float32)))

    def mse(pooled, w, b, y):
        return tf.reduce_mean((tf.matmul(pooled, w) + b - y) ** 2)

    w, b = head()
    ds = layer.prefetch(tf.data.Dataset.from_tensor_slices(
        (tf.stack(batches), np.stack(targets))), lambda ids, y: {"f": ids}, then=lambda ids, y: y)

    @tf.function
    def ember_step(step, y):
        with tf.GradientTape() as tape:
            loss = mse(layer(step)["f"], w, b, y)
        gw, gb, _ = tape.gradient(loss, [w, b, layer.anchor])
        w.assign_sub(lr * gw)
        b.assign_sub(lr * gb)

    for step, y in ds:
        ember_step(step, y)
        # The model's compute: the next steps' early fetches go out before
        # their previous step's push even on a loaded machine.
        time.sleep(0.001)
    layer.flush()
    # s = 0 fetched the next step's rows early and brought them forward.
    stats = layer._pipe.stats()
    assert stats["steps_patched"] > 0, stats
    ember_rows = client.lookup_rows(table, np.arange(vocab, dtype=np.int64))
    layer.close()

    rows = tf.Variable(initial)
    w, b = head()
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    for ids, y in zip(batches, targets):
        with tf.GradientTape() as tape:
            pooled = tf.nn.embedding_lookup_sparse(rows, ids.to_sparse(), None, combiner="sum")
            loss = mse(pooled, w, b, y)
        grads = tape.gradient(loss, [rows, w, b])
        opt.apply_gradients(zip(grads, [rows, w, b]))
    assert not np.allclose(ember_rows, initial), "the rows did not train"
    np.testing.assert_allclose(ember_rows, rows.numpy(), rtol=1e-4, atol=1e-5)
