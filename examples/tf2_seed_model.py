"""The seed model in TensorFlow 2: the reference workload's 17 sparse
features, pooled, under a small MLP, trained three ways on the same batches,
each reading serialized tf.train.Example records through tf.data:

  native  tf.io.parse_example -> SparseTensors -> tf.nn.embedding_lookup_sparse
          over in-graph variables (ids hashed into the feature's cardinality),
          sparse Adagrad (the motivating user's model);
  tfra    TensorFlow Recommenders-Addons' dynamic embedding
          (de.keras.layers.Embedding, de.DynamicEmbeddingOptimizer);
  ember   ember.tf.EmbeddingLayer on a local 2-shard cluster (or --shards=
          inproc:2, shards in the process; --staleness), rows prefetched by
          the tf.data map, Adagrad on the shards;
  dense   the floor: the same step without embeddings.

    python examples/tf2_seed_model.py --mode ember --steps 300 --compute_ms 1

Prints the loss curve and a RESULT line (ms and CPU ms per step).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_workload as w  # noqa: E402

ARGS = w.arguments(__doc__.splitlines()[0], ["native", "tfra", "ember", "dense"])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if ARGS.mode == "tfra":
    # TFRA 0.8.1 works with Keras 2 only (tf-keras), chosen before TF loads.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

NAMES = [f"f{f}" for f in range(w.NUM_FEATURES)]


def serialized_batches(batches):
    """[num_batches, batch] serialized tf.train.Example records."""
    out = []
    for b in batches:
        offsets = [b.offsets(f) for f in range(w.NUM_FEATURES)]
        records = []
        for i in range(len(b.labels)):
            feature = {NAMES[f]: tf.train.Feature(int64_list=tf.train.Int64List(
                value=b.features[f][1][offsets[f][i]:offsets[f][i + 1]]))
                for f in range(w.NUM_FEATURES)}
            feature["label"] = tf.train.Feature(float_list=tf.train.FloatList(value=b.labels[i]))
            records.append(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())
        out.append(records)
    return tf.constant(out)


def dataset(records, steps, ragged=False):
    """Parsed batches: ids as SparseTensors (VarLenFeature), or RaggedTensors
    (RaggedFeature: row splits without a conversion)."""
    spec = {n: tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64) if ragged
            else tf.io.VarLenFeature(tf.int64) for n in NAMES}
    spec["label"] = tf.io.FixedLenFeature([1], tf.float32)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        labels = parsed.pop("label")
        return parsed, labels

    return tf.data.Dataset.from_tensor_slices(records).repeat().take(steps).map(parse)


class Mlp(tf.Module):
    def __init__(self):
        init = tf.keras.initializers.GlorotUniform(seed=0)
        self.w1 = tf.Variable(init([w.NUM_FEATURES * w.DIM, 64]))
        self.b1 = tf.Variable(tf.zeros([64]))
        self.w2 = tf.Variable(init([64, 1]))
        self.b2 = tf.Variable(tf.zeros([1]))

    def __call__(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2


def v1_optimizer():
    if ARGS.optimizer == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(w.LEARNING_RATE)
    return tf.compat.v1.train.AdagradOptimizer(w.LEARNING_RATE,
                                               initial_accumulator_value=w.INITIAL_ACCUMULATOR)


def bce(labels, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def train(ds, step_fn, meter):
    """The input pipeline inside the step function, as TF2 users run it
    (Keras' fit does the same): each call of the compiled step takes the
    next element from the iterator in the graph, so no batch crosses into
    Python."""
    iterator = iter(ds)

    @tf.function
    def train_step():
        return step_fn(*next(iterator))

    for i in range(ARGS.steps):
        loss = train_step()
        time.sleep(ARGS.compute_ms / 1e3)
        meter.step(i, float(loss))


def run_native(records, meter):
    cards = w.cardinalities(ARGS.scale)
    tables = [tf.Variable(tf.random.normal([n, w.DIM], stddev=1.0, seed=f), name=f"t{f}")
              for f, n in enumerate(cards)]
    mlp = Mlp()
    opt = v1_optimizer()
    variables = tables + list(mlp.trainable_variables)

    def train_step(features, labels):
        with tf.GradientTape() as tape:
            pooled = []
            for f, n in enumerate(NAMES):
                sp = features[n]
                ids = tf.SparseTensor(sp.indices, tf.math.floormod(sp.values, cards[f]), sp.dense_shape)
                pooled.append(tf.nn.embedding_lookup_sparse(tables[f], ids, None,
                                                            combiner=w.combiner(f)))
            loss = bce(labels, mlp(tf.concat(pooled, 1)))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    train(dataset(records, ARGS.steps).prefetch(2), train_step, meter)
    return ("tf.nn.embedding_lookup_sparse over tf.Variables, v1 Adagrad (sparse updates); "
            "parsing in the tf.data map, iterator inside the tf.function, tf.data prefetch 2")


def run_dense(records, meter):
    """The floor of every variant: the same step with the pooled embeddings
    replaced by a constant (the MLP, its optimizer, the input pipeline's
    labels, the step function's call)."""
    mlp = Mlp()
    opt = v1_optimizer()
    variables = list(mlp.trainable_variables)
    pooled = tf.random.normal([w.BATCH, w.NUM_FEATURES * w.DIM], seed=3)

    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = bce(labels, mlp(pooled))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    train(dataset(records, ARGS.steps).prefetch(2), train_step, meter)
    return "no embeddings: the MLP on a constant input, v1 Adagrad, iterator inside the tf.function"


def run_tfra(records, meter):
    from tensorflow_recommenders_addons import dynamic_embedding as de
    embeddings = [de.keras.layers.Embedding(
        w.DIM, initializer=tf.keras.initializers.RandomNormal(stddev=1.0), name=f"t{f}")
        for f in range(w.NUM_FEATURES)]
    mlp = Mlp()
    if ARGS.optimizer == "sgd":
        inner = tf.keras.optimizers.legacy.SGD(w.LEARNING_RATE)
    else:
        inner = tf.keras.optimizers.legacy.Adagrad(
            w.LEARNING_RATE, initial_accumulator_value=w.INITIAL_ACCUMULATOR)
    opt = de.DynamicEmbeddingOptimizer(inner)

    def train_step(features, labels):
        with tf.GradientTape() as tape:
            pooled = []
            for f, n in enumerate(NAMES):
                sp = features[n]
                rows = embeddings[f](sp.values)
                segments = sp.indices[:, 0]
                batch = sp.dense_shape[0]
                pool = (tf.math.unsorted_segment_mean if w.combiner(f) == "mean"
                        else tf.math.unsorted_segment_sum)
                pooled.append(pool(rows, segments, batch))
            loss = bce(labels, mlp(tf.concat(pooled, 1)))
        variables = list(mlp.trainable_variables)
        for e in embeddings:
            variables += e.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    train(dataset(records, ARGS.steps).prefetch(2), train_step, meter)
    return ("de.keras.layers.Embedding per feature, DynamicEmbeddingOptimizer(legacy Adagrad); "
            "iterator inside the tf.function, tf.data prefetch 2")


def run_ember(records, meter, client):
    import ember.tf as etf
    if ARGS.optimizer == "sgd":
        optimizer = {"sgd": {"learning_rate": w.LEARNING_RATE}}
    else:
        optimizer = {"adagrad": {"learning_rate": w.LEARNING_RATE,
                                 "initial_accumulator": w.INITIAL_ACCUMULATOR}}
    tables = [dict(name=f"seed_t{f}", dim=w.DIM, optimizer=optimizer,
                   initializer={"normal": {"stddev": 1.0}, "seed": f})
              for f in range(w.NUM_FEATURES)]
    # packed: the 17 features side by side in one tensor, as the MLP takes them.
    layer = etf.EmbeddingLayer(client, [(n, f"seed_t{f}", w.combiner(f)) for f, n in enumerate(NAMES)],
                               tables=tables, staleness=ARGS.staleness, packed=True)
    mlp = Mlp()
    opt = v1_optimizer()
    variables = list(mlp.trainable_variables)

    def train_step(step, labels):
        with tf.GradientTape() as tape:
            loss = bce(labels, mlp(layer(step)))
        # The anchor's gradient is the push; the dense variables are applied.
        grads = tape.gradient(loss, variables + [layer.anchor])
        opt.apply_gradients(zip(grads[:-1], variables))
        return loss

    # The ids go to Ember in the input pipeline; the step needs only labels.
    ds = layer.prefetch(dataset(records, ARGS.steps, ragged=True),
                        features=lambda features, labels: features,
                        then=lambda features, labels: labels)
    train(ds.prefetch(2), train_step, meter)
    layer.flush()
    stats = layer.pipeline.stats()
    layer.close()
    return {"wait_ms_per_step": stats["wait_seconds"] * 1e3 / max(stats["steps_waited"], 1),
            "config": w.ember_config(ARGS) + "; EmbeddingLayer(packed=True); v1 Adagrad for the MLP; "
                      "iterator inside the tf.function"}


def main():
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    records = serialized_batches(w.make_batches(ARGS.batches, ARGS.scale, ARGS.seed))
    if ARGS.mode == "ember":
        result = w.run_on_ember(ARGS, lambda client, meter: run_ember(records, meter, client))
    else:
        meter = w.Meter(ARGS.warmup)
        run = {"native": run_native, "tfra": run_tfra, "dense": run_dense}[ARGS.mode]
        config = run(records, meter)
        result = meter.result(config=config)
    result.update(framework="tensorflow", mode=ARGS.mode, tensorflow=tf.__version__,
                  steps=ARGS.steps, compute_ms=ARGS.compute_ms, scale=ARGS.scale)
    print(f"tensorflow {ARGS.mode}: loss curve {result['loss_curve']}")
    w.emit(result)


if __name__ == "__main__":
    main()
