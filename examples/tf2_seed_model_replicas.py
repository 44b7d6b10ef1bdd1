"""The seed model as its user trains it: one TensorFlow process,
tf.distribute.MirroredStrategy over --replicas devices (here logical CPU
devices), batch 128 per replica, the reference workload's 17 sparse
features read from serialized tf.train.Example records:

  native  as the seed user wrote it: tf.io.parse_example in the input
          pipeline (SparseTensors per replica, through
          distribute_datasets_from_function), a tf.lookup.StaticHashTable
          from id to row per feature, tf.nn.embedding_lookup_sparse under
          /cpu:0 over tf.Variables made in the strategy's scope
          (MirroredVariables), Adagrad for every variable (TF's v1
          optimizer: Keras 3.15's fail under the strategy in a custom loop
          on TF 2.16, on a plain MLP too);
  native_best  native as its users make it fast under the strategy: ids
          hashed into each table in the tf.data map (no hash table in the
          step), each replica gathering from its own copy of the mirrored
          table (a sparse ResourceGather instead of a dense read of the
          whole MirroredVariable), v1 Adagrad's sparse updates;
  tfra    TensorFlow Recommenders-Addons' de.keras.layers.Embedding made in
          the strategy's scope with DynamicEmbeddingOptimizer (needs the
          bench environment; prints TFRA's error if it does not run);
  ember   ember.tf.EmbeddingLayer made in the strategy's scope (one pipeline
          per replica, merged: one request per shard per node step), the
          ids handed to Ember in each replica's tf.data map (RaggedFeature
          parsing), Adagrad on the shards, v1 Adagrad for the MLP;
  dense   the floor: the same step under the same strategy without
          embeddings (the MLP on a constant input).

    python examples/tf2_seed_model_replicas.py --mode ember --replicas 4

Prints the loss curve, the ops a step executes (from TensorFlow's profiler
over 2 more steps: those that grow with replicas x features, such as
DeserializeSparse, the collectives, _Send/_Recv, all kernels) and a RESULT
line (ms and CPU ms per node step, timed before the profile). Run by examples/seed_model_bench.sh
--replicas N beside the other variants.
"""

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_workload as w  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MODES = ["native", "native_best", "tfra", "ember", "dense"]
_p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_p.add_argument("--replicas", type=int, default=4)
sys.argv, _rest = sys.argv[:1], sys.argv[1:]
REPLICAS_ARGS, _rest = _p.parse_known_args(_rest)
sys.argv += _rest
ARGS = w.arguments(__doc__.splitlines()[0], MODES)
REPLICAS = REPLICAS_ARGS.replicas
if ARGS.mode == "tfra":
    # TFRA 0.8.1 runs on tf-keras (Keras 2) only, chosen before TF loads.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)])

# Its parsing, MLP and batches; it parses the same flags at import, where
# this script's own modes are not its.
_argv, sys.argv = sys.argv, [a if a not in ("native_best",) else "native" for a in sys.argv]
import tf2_seed_model as single  # noqa: E402
sys.argv = _argv

NAMES = single.NAMES
# The ops whose count grows with replicas x features, and the collectives.
COUNTED = ("DeserializeSparse", "SerializeSparse", "SerializeManySparse",
           "CollectiveGatherV2", "CollectiveReduceV2", "CollectiveBcastSendV2",
           "EmberLookup", "EmberLookupPacked", "EmberPush", "EmberPushPacked")


def profiled_op_counts(step, steps=2) -> dict:
    """Ops executed per step, from TensorFlow's profiler over `steps` more
    steps: the counted types, _Send/_Recv, and all kernels."""
    import glob
    import tempfile
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    logdir = tempfile.mkdtemp(prefix="ember-profile-")
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
        step()
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1], "rb") as f:
        space.ParseFromString(f.read())
    counts = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if line.name == "python":  # the host's own calls, not kernels
                continue
            for event in line.events:
                counts[plane.event_metadata[event.metadata_id].name.split(":")[-1]] += 1
    out = {k: counts[k] / steps for k in COUNTED if counts[k]}
    out["_Send/_Recv"] = (counts["_Send"] + counts["_Recv"] + counts["_HostSend"]
                          + counts["_HostRecv"]) / steps
    out["all_kernels"] = sum(counts.values()) / steps
    return out


def strategy():
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def adagrad():
    # TF's v1 Adagrad: Keras 3.15's optimizers fail under MirroredStrategy
    # in a custom loop on TF 2.16 ("You must feed a value for placeholder
    # tensor 'cond/else/_1/cond/Placeholder'", on a plain MLP too).
    return tf.compat.v1.train.AdagradOptimizer(w.LEARNING_RATE,
                                               initial_accumulator_value=w.INITIAL_ACCUMULATOR)


def run(dist, make_dataset, replica_fn, meter):
    """The steps, the iterator inside the tf.function (as Keras' fit runs
    them); returns the ops a step executes (profiled over 2 more steps)."""
    iterator = iter(dist.distribute_datasets_from_function(make_dataset))

    @tf.function
    def train_step(it):
        per_replica = dist.run(replica_fn, args=next(it))
        return dist.reduce("MEAN", per_replica, axis=None)

    for i in range(ARGS.steps):
        loss = train_step(iterator)
        time.sleep(ARGS.compute_ms / 1e3)
        meter.step(i, float(loss))
    result = meter.result()
    result["ops"] = profiled_op_counts(lambda: train_step(iterator))
    return result


def records_dataset(records, ragged):
    # The replicas take the batches in turn (2 more steps for the profile).
    return single.dataset(records, (ARGS.steps + 2) * REPLICAS, ragged=ragged)


def mirrored_model(dist, cards):
    """The native variants' tables, MLP and optimizer, made in the scope."""
    with dist.scope():
        tables = [tf.Variable(tf.random.normal([n, w.DIM], stddev=1.0, seed=f), name=f"t{f}")
                  for f, n in enumerate(cards)]
        return tables, single.Mlp(), adagrad()


def run_native(records, meter):
    cards = w.cardinalities(ARGS.scale)
    dist = strategy()
    # The user's vocabulary: id -> row, one table per feature.
    batches = w.make_batches(ARGS.batches, ARGS.scale, ARGS.seed)
    vocab = [np.unique(np.concatenate([b.features[f][1] for b in batches])).astype(np.int64)
             for f in range(w.NUM_FEATURES)]
    with tf.device("/cpu:0"):
        lookups = [tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            v, np.arange(len(v), dtype=np.int64) % cards[f]), default_value=0)
            for f, v in enumerate(vocab)]
    tables, mlp, opt = mirrored_model(dist, cards)
    variables = tables + list(mlp.trainable_variables)

    def replica_fn(features, labels):
        with tf.GradientTape() as tape:
            pooled = []
            for f, n in enumerate(NAMES):
                sp = features[n]
                with tf.device("/cpu:0"):
                    rows = tf.SparseTensor(sp.indices, lookups[f].lookup(sp.values),
                                           sp.dense_shape)
                    pooled.append(tf.nn.embedding_lookup_sparse(tables[f], rows, None,
                                                                combiner=w.combiner(f)))
            loss = single.bce(labels, mlp(tf.concat(pooled, 1)))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    result = run(dist, lambda ctx: records_dataset(records, ragged=False).prefetch(2),
                 replica_fn, meter)
    return result, ("MirroredStrategy; parse_example -> SparseTensors per replica "
                 "(distribute_datasets_from_function); StaticHashTable id -> row; "
                 "embedding_lookup_sparse under /cpu:0 over MirroredVariables; v1 Adagrad")


def run_native_best(records, meter):
    cards = w.cardinalities(ARGS.scale)
    dist = strategy()
    tables, mlp, opt = mirrored_model(dist, cards)
    variables = tables + list(mlp.trainable_variables)

    def hashed(features, labels):
        return {n: tf.SparseTensor(sp.indices, tf.math.floormod(sp.values, cards[f]),
                                   sp.dense_shape)
                for f, (n, sp) in enumerate((n, features[n]) for n in NAMES)}, labels

    def replica_fn(features, labels):
        with tf.GradientTape() as tape:
            # The replica's own copy of each table: gathering from it reads
            # the rows of the batch only (a MirroredVariable is read whole).
            pooled = [tf.nn.embedding_lookup_sparse(tables[f]._get_on_device_or_primary(),
                                                    features[n], None, combiner=w.combiner(f))
                      for f, n in enumerate(NAMES)]
            loss = single.bce(labels, mlp(tf.concat(pooled, 1)))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    result = run(dist, lambda ctx: records_dataset(records, ragged=False).map(hashed).prefetch(2),
                 replica_fn, meter)
    return result, ("MirroredStrategy; parse_example -> SparseTensors per replica, ids hashed "
                    "into each table in the tf.data map; embedding_lookup_sparse on each "
                    "replica's own copy of the MirroredVariable (sparse gather); v1 Adagrad")


def run_tfra(records, meter):
    from tensorflow_recommenders_addons import dynamic_embedding as de
    dist = strategy()
    with dist.scope():
        embeddings = [de.keras.layers.Embedding(
            w.DIM, initializer=tf.keras.initializers.RandomNormal(stddev=1.0), name=f"t{f}")
            for f in range(w.NUM_FEATURES)]
        mlp = single.Mlp()
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adagrad(
            w.LEARNING_RATE, initial_accumulator_value=w.INITIAL_ACCUMULATOR))

    def replica_fn(features, labels):
        with tf.GradientTape() as tape:
            pooled = []
            for f, n in enumerate(NAMES):
                sp = features[n]
                pool = (tf.math.unsorted_segment_mean if w.combiner(f) == "mean"
                        else tf.math.unsorted_segment_sum)
                pooled.append(pool(embeddings[f](sp.values), sp.indices[:, 0], sp.dense_shape[0]))
            loss = single.bce(labels, mlp(tf.concat(pooled, 1)))
        variables = list(mlp.trainable_variables)
        for e in embeddings:
            variables += e.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    result = run(dist, lambda ctx: records_dataset(records, ragged=False).prefetch(2),
                 replica_fn, meter)
    return result, ("MirroredStrategy; de.keras.layers.Embedding per feature in the scope, "
                    "DynamicEmbeddingOptimizer(legacy Adagrad)")


def run_dense(records, meter):
    dist = strategy()
    with dist.scope():
        mlp = single.Mlp()
        opt = adagrad()
    variables = list(mlp.trainable_variables)
    pooled = tf.random.normal([w.BATCH, w.NUM_FEATURES * w.DIM], seed=3)

    def replica_fn(features, labels):
        with tf.GradientTape() as tape:
            loss = single.bce(labels, mlp(pooled))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    # The labels come through the same input pipeline; the ids are dropped.
    result = run(dist, lambda ctx: records_dataset(records, ragged=True).map(
        lambda features, labels: (0, labels)).prefetch(2), replica_fn, meter)
    return result, "MirroredStrategy; the MLP on a constant input, v1 Adagrad"


def run_ember(records, meter, client):
    import ember.tf as etf
    optimizer = {"adagrad": {"learning_rate": w.LEARNING_RATE,
                             "initial_accumulator": w.INITIAL_ACCUMULATOR}}
    tables = [dict(name=f"seed_t{f}", dim=w.DIM, optimizer=optimizer,
                   initializer={"normal": {"stddev": 1.0}, "seed": f})
              for f in range(w.NUM_FEATURES)]
    dist = strategy()
    with dist.scope():
        layer = etf.EmbeddingLayer(
            client, [(n, f"seed_t{f}", w.combiner(f)) for f, n in enumerate(NAMES)],
            tables=tables, staleness=ARGS.staleness, packed=True)
        mlp = single.Mlp()
        opt = adagrad()
    variables = list(mlp.trainable_variables)

    def replica_fn(step, labels):
        with tf.GradientTape() as tape:
            loss = single.bce(labels, mlp(layer(step)))
        grads = tape.gradient(loss, variables + [layer.anchor])
        opt.apply_gradients(zip(grads[:-1], variables))
        return loss

    result = run(dist, lambda ctx: layer.prefetch(
        records_dataset(records, ragged=True), features=lambda features, labels: features,
        then=lambda features, labels: labels).prefetch(2), replica_fn, meter)
    layer.flush()
    merged = layer.merger.stats()
    waits = [p.stats() for p in layer.pipelines]
    layer.close()
    # The timed figures (run's), not the meter's after the profile.
    return {**result, "merged_rounds": merged["rounds"],
            "wait_ms_per_step": max(s["wait_seconds"] * 1e3 / max(s["steps_waited"], 1)
                                    for s in waits),
            "config": w.ember_config(ARGS) + f"; MirroredStrategy, {REPLICAS} replicas merged "
                      "(one StepMerger); EmbeddingLayer(packed=True); v1 Adagrad for the MLP"}


def main():
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    records = single.serialized_batches(w.make_batches(ARGS.batches, ARGS.scale, ARGS.seed))
    if ARGS.mode == "ember":
        result = w.run_on_ember(ARGS, lambda client, meter: run_ember(records, meter, client))
    else:
        meter = w.Meter(ARGS.warmup)
        result, config = {"native": run_native, "native_best": run_native_best,
                          "tfra": run_tfra, "dense": run_dense}[ARGS.mode](records, meter)
        result["config"] = config
    result.update(framework="tensorflow", mode=ARGS.mode, replicas=REPLICAS,
                  tensorflow=tf.__version__, steps=ARGS.steps, compute_ms=ARGS.compute_ms,
                  scale=ARGS.scale)
    print(f"tensorflow {ARGS.mode} x{REPLICAS}: loss curve {result['loss_curve']}; "
          f"ops per step {result['ops']}")
    w.emit(result)


if __name__ == "__main__":
    main()
