"""ember.tf against two real shards: the layer's forward equals a numpy
reference, the gradients it pushes equal tf.GradientTape's, under
tf.function with a tf.data input pipeline and without one."""

import itertools
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed in this environment")

import ember  # noqa: E402
import ember.tf as etf  # noqa: E402

_names = (f"tf{i}" for i in itertools.count())


def ragged_batches(rng, n, batch, vocab, max_ids=4):
    out = []
    for _ in range(n):
        lengths = rng.integers(0, max_ids + 1, size=batch)
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


def test_lookup_of_a_step_never_prefetched_raises_with_the_pipelines_message(client):
    _, layer = new_layer(client, 2, worker_id=23)
    with pytest.raises(tf.errors.FailedPreconditionError, match="prefetch it first"):
        layer(tf.constant([0], tf.int64))
    layer.close()
