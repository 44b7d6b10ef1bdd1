"""Where the TF layer's per-step cost goes (docs/python.md): the same 17
ragged features of the reference workload / 100 through (1) tf.data alone,
elements handed to Python; (2) + the EmberPrefetch map, with Python's
wait/push; (3) + EmberLookup/EmberPush in a tf.function. Local 2-shard
cluster, s = 0, 600 steps, medians of 3 alternating rounds.

    PYTHONPATH=build/python .venv/bin/python bench/tf_layer_breakdown.py
"""
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import numpy as np, tensorflow as tf, seed_workload as w
import ember, ember.tf as etf
from ember.local_cluster import LocalCluster
tf.get_logger().setLevel("ERROR")
batches = w.make_batches(64, 100, seed=1)
NAMES=[f"f{f}" for f in range(17)]
stacked = {n: tf.RaggedTensor.from_row_lengths(tf.RaggedTensor.from_row_lengths(np.concatenate([b.features[f][1] for b in batches]), np.concatenate([b.features[f][0] for b in batches])), np.full(len(batches), 128, dtype=np.int64)) for f, n in enumerate(NAMES)}
N=600
def t(name, ds, body):
    w0=time.perf_counter(); c0=time.process_time()
    for x in ds: body(x)
    return (time.perf_counter()-w0)*1e3/N, (time.process_time()-c0)*1e3/N
def base(): return tf.data.Dataset.from_tensor_slices(stacked).repeat().take(N)
def ids(x): return x
def nothing(x): return tf.zeros([], tf.int8)
res = {}
with LocalCluster(2) as c:
    client = ember.Client(c.addresses)
    for f in range(17):
        client.create_table(f"ov_t{f}", 8, optimizer={"adagrad": {"learning_rate": 0.01}}, initializer={"normal": {"stddev": 1.0}, "seed": f})
    feats = [(n, f"ov_t{f}", w.combiner(f)) for f, n in enumerate(NAMES)]
    zeros=[np.zeros((128,8),np.float32)]*17
    worker=[0]
    def layer():
        worker[0]+=1
        return etf.EmbeddingLayer(client, feats, staleness=0, worker_id=worker[0])
    for rnd in range(3):
        res.setdefault("tf.data slicing only", []).append(t("", base().prefetch(2), lambda x: None))
        L = layer()
        res.setdefault("+ EmberPrefetch map, Python wait/push", []).append(t("", L.prefetch(base(), ids, then=nothing).prefetch(2), lambda x: (L.pipeline.wait(int(x[0])), L.pipeline.push(int(x[0]), zeros))))
        L.close()
        L = layer()
        @tf.function
        def fn(step):
            with tf.GradientTape() as tape:
                pooled = L(step)
                loss = tf.add_n([tf.reduce_sum(pooled[n]) for n in NAMES])
            return tape.gradient(loss, [L.anchor])
        res.setdefault("+ EmberLookup/EmberPush in tf.function", []).append(t("", L.prefetch(base(), ids, then=nothing).prefetch(2), lambda x: fn(x[0])))
        L.close()
import statistics
for k, v in res.items():
    print(f"{k:<42} {statistics.median(a for a,b in v):6.2f} ms/step {statistics.median(b for a,b in v):6.2f} cpu ms/step")
