"""One process of test_import_orders.py: imports the modules named on the
command line in that order (tensorflow, torch, ember), then trains 10 steps
against two ember-server processes with each framework that was imported
(ember.tf's layer under tf.function, ember.torch's module with autograd),
checking that the rows moved. Prints "trained <frameworks>" and exits 0;
a crash (the symbol clash this guards against was a SIGSEGV in the first
gRPC call) or an error is a non-zero exit.

    python import_order_child.py tensorflow,torch,ember
"""

import importlib
import os
import sys

import numpy as np

STEPS = 10


def train_tf(client):
    import tensorflow as tf

    import ember.tf as etf

    client.create_table("order_tf", 4, optimizer={"sgd": {"learning_rate": 0.5}},
                        initializer={"constant": {"value": 1.0}})
    layer = etf.EmbeddingLayer(client, [("f", "order_tf")], worker_id=1)
    ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3, 4], tf.int64),
                                           tf.constant([2, 2], tf.int64))
    dataset = layer.prefetch(tf.data.Dataset.from_tensors({"f": ids}).repeat(STEPS), lambda x: x)

    @tf.function
    def step(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(s)["f"])
        return tape.gradient(loss, layer.trainable_variables)

    for s, _ in dataset:
        step(s)
    layer.flush()
    rows = client.lookup_rows("order_tf", np.array([1, 2, 3, 4], np.int64))
    layer.close()
    # Each row got gradient 1 in every element at each of the 10 steps.
    np.testing.assert_allclose(rows, 1.0 - 0.5 * STEPS, rtol=1e-6)


def train_torch(client):
    import torch

    import ember.torch as et

    config = et.EmbeddingBagConfig("order_torch", 4, ["f"],
                                   optimizer={"sgd": {"learning_rate": 0.5}},
                                   initializer={"constant": {"value": 1.0}})
    kjt = et.KeyedJaggedTensor(["f"], torch.tensor([5, 6, 7, 8]), torch.tensor([2, 2]))
    with et.EmbeddingBagCollection(client, [config], worker_id=2) as ebc:
        for batch in et.prefetching([kjt] * STEPS, ebc):
            ebc(batch)["f"].sum().backward()
        ebc.flush()
    rows = client.lookup_rows("order_torch", np.array([5, 6, 7, 8], np.int64))
    np.testing.assert_allclose(rows, 1.0 - 0.5 * STEPS, rtol=1e-6)


def main():
    order = sys.argv[1].split(",")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in order:
        importlib.import_module(name)
    import ember
    from ember.local_cluster import LocalCluster

    with LocalCluster(shards=2) as cluster:
        client = ember.Client(cluster.addresses)
        if "tensorflow" in order:
            train_tf(client)
        if "torch" in order:
            train_torch(client)
    print("trained", " ".join(n for n in order if n != "ember"), flush=True)


if __name__ == "__main__":
    main()
