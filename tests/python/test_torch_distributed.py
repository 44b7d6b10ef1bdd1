"""ember.torch under torchrun: four ranks (one process each, gloo), DDP for
the dense part, the ranks' EmbeddingBagCollections sharing their traffic
through the node shuffle over torch.distributed. The rows end bit-identical
to the C++ NodeShuffle (four ember.StepPipelines over in-process
transports) fed the same four batch streams; each shard answers one request
per node step (its own counters); against one pipeline fed the global
batch, bit-identical where the sums are exact and within the stated
rounding bound otherwise."""

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed in this environment")

import ember  # noqa: E402
from ember.local_cluster import LocalCluster  # noqa: E402
from threads_and_metrics import exchange_requests, run_threads  # noqa: E402
from torch_node_data import DIM, FEATURES, RANKS, concat, csr, keys_of, streams  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 6  # as torch_node_worker.py
_names = (f"tnode{i}" for i in itertools.count())
_workers = itertools.count(500)


def new_table(client, optimizer):
    """A fresh table; tables made with the same optimizer start identical."""
    table = next(_names)
    client.create_table(table, DIM, optimizer=optimizer,
                        initializer={"uniform": {"min": -1, "max": 1}, "seed": 13})
    return table


def torchrun(addresses, table, steps, seed, mode="shuffle", grads="random"):
    """Runs torch_node_worker.py on four ranks; returns each rank's report."""
    out = tempfile.mkdtemp(prefix="ember-torchrun-")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={RANKS}", os.path.join(HERE, "torch_node_worker.py"),
           ",".join(addresses), table, str(steps), str(seed), str(next(_workers)), mode, grads, out]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    reports = []
    for r in range(RANKS):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            reports.append(json.load(f))
    shutil.rmtree(out)
    return reports


def train_in_process_shuffle(client, table, data):
    """The C++ NodeShuffle: four ember.StepPipelines over in-process
    transports, the node one worker, each rank on its own thread."""
    transports = ember.Transport.in_process_group(RANKS)
    worker = next(_workers)
    pipes = [ember.StepPipeline(client, [(f, table) for f in FEATURES], worker_id=worker,
                                transport=transports[r]) for r in range(RANKS)]

    def rank(r):
        for t, step in enumerate(data):
            lengths, values, y = step[r]
            pipes[r].prefetch(t, csr(lengths, values))
            pipes[r].wait(t)
            pipes[r].push(t, [np.ascontiguousarray(y[:, :DIM]),
                              np.ascontiguousarray(y[:, DIM:])])
        pipes[r].close()

    run_threads(rank, RANKS)


def train_one_pipeline(client, table, data):
    """One pipeline fed each step's concatenated global batch."""
    with ember.StepPipeline(client, [(f, table) for f in FEATURES],
                            worker_id=next(_workers)) as pipe:
        for t, step in enumerate(data):
            lengths, values, y = concat(step)
            pipe.prefetch(t, csr(lengths, values))
            pipe.wait(t)
            pipe.push(t, [np.ascontiguousarray(y[:, :DIM]), np.ascontiguousarray(y[:, DIM:])])


@pytest.fixture(scope="module")
def metered_cluster():
    with LocalCluster(shards=2, extra_args=["--metrics_port=0"]) as cluster:
        yield cluster


def test_four_torchrun_ranks_end_bit_identical_to_the_cpp_node_shuffle_one_request_per_shard_step(
        metered_cluster):
    """Adagrad, random gradients, 10 steps: the torchrun ranks' rows equal,
    bit for bit, those of the C++ NodeShuffle fed the same four streams (one
    row off fails it); each shard's own Exchange counter grew by one lookup
    and one push per node step at most (four ranks each talking to every
    shard would be four times that)."""
    steps = 10
    client = ember.Client(metered_cluster.addresses)
    adagrad = {"adagrad": {"learning_rate": 0.1}}
    ours, theirs, untouched = (new_table(client, adagrad) for _ in range(3))
    data = streams(41, steps, BATCH)
    before = exchange_requests(metered_cluster.metrics_addresses)
    reports = torchrun(metered_cluster.addresses, ours, steps, 41)
    after = exchange_requests(metered_cluster.metrics_addresses)
    assert all(r["steps_pushed"] == steps for r in reports), reports
    grew = [a - b for a, b in zip(after, before)]
    assert all(steps <= g <= 2 * steps for g in grew), grew
    train_in_process_shuffle(client, theirs, data)
    keys = keys_of(data)
    got, want = client.lookup_rows(ours, keys), client.lookup_rows(theirs, keys)
    assert not np.array_equal(got, client.lookup_rows(untouched, keys)), "the rows did not train"
    assert np.array_equal(got, want), np.max(np.abs(got - want))
    # The ranks fetched each unique key of the node once between them.
    node_keys = sum(len(np.unique(concat(step)[1])) for step in data)
    assert sum(r["unique_keys"] for r in reports) == node_keys, reports


def test_four_torchrun_ranks_equal_one_pipeline_on_the_global_batch_when_sums_are_exact(
        metered_cluster):
    """Gradients in quarters (their sums are exact in float32), SGD: the
    node's rank-order sums and one pipeline's example-order sums are the
    same numbers, so the rows match bit for bit."""
    steps = 6
    client = ember.Client(metered_cluster.addresses)
    sgd = {"sgd": {"learning_rate": 0.5}}
    ours, single = new_table(client, sgd), new_table(client, sgd)
    data = streams(42, steps, BATCH, dyadic=True)
    torchrun(metered_cluster.addresses, ours, steps, 42, grads="dyadic")
    train_one_pipeline(client, single, data)
    keys = keys_of(data)
    assert np.array_equal(client.lookup_rows(ours, keys), client.lookup_rows(single, keys))


def test_the_node_shuffle_equals_one_pipeline_on_the_global_batch_within_the_sum_order_bound(
        metered_cluster):
    """Random gradients, SGD (learning rate lr). A key's gradient in a step
    is a sum of n terms: the node adds each rank's own first, then the ranks
    in rank order; one pipeline adds in example order. Each order is within
    gamma_n * sum|g| of the exact sum (gamma_n = n u / (1 - n u), u =
    2^-24), so the two differ by at most 2 gamma_n sum|g|, and the update
    row - lr * g adds u |row| of rounding on each side. The bound per row
    element is the sum over the steps; the test computes it from the data.
    (The node here is the in-process C++ shuffle, which the test above
    shows equal to the torchrun ranks bit for bit.)"""
    lr = 0.5
    client = ember.Client(metered_cluster.addresses)
    sgd = {"sgd": {"learning_rate": lr}}
    ours, single, untouched = (new_table(client, sgd) for _ in range(3))
    data = streams(43, 6, BATCH)
    train_in_process_shuffle(client, ours, data)
    train_one_pipeline(client, single, data)
    keys = keys_of(data)
    got, want = client.lookup_rows(ours, keys), client.lookup_rows(single, keys)
    assert not np.array_equal(got, client.lookup_rows(untouched, keys)), "the rows did not train"
    u = 2.0 ** -24
    index = {int(k): i for i, k in enumerate(keys)}
    bound = np.zeros_like(want, dtype=np.float64)
    for step in data:
        lengths, values, y = concat(step)
        batch = len(lengths) // 2
        abs_sum = np.zeros_like(bound)
        terms = np.zeros(len(keys))
        at = 0
        for f in range(2):
            for example in range(batch):
                n = int(lengths[f * batch + example])
                for k in values[at:at + n]:
                    abs_sum[index[int(k)]] += np.abs(y[example, f * DIM:(f + 1) * DIM])
                    terms[index[int(k)]] += 1
                at += n
        gamma = terms * u / (1 - terms * u)
        bound += 2 * gamma[:, None] * lr * abs_sum + 2 * u * (np.abs(want) + lr * abs_sum)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound), np.max(np.abs(got - want))


def test_ranks_as_their_own_workers_train_without_a_shuffle(metered_cluster):
    """The option without the shuffle: each rank its own SSP worker, talking
    to every shard (four requests per shard per node step)."""
    steps = 4
    client = ember.Client(metered_cluster.addresses)
    table = new_table(client, {"adagrad": {"learning_rate": 0.1}})
    before = exchange_requests(metered_cluster.metrics_addresses)
    reports = torchrun(metered_cluster.addresses, table, steps, 44, mode="own")
    after = exchange_requests(metered_cluster.metrics_addresses)
    assert all(r["steps_pushed"] == steps for r in reports), reports
    assert all(g >= RANKS * steps for g in (a - b for a, b in zip(after, before)))


def test_a_transport_and_a_merger_together_are_refused(metered_cluster):
    client = ember.Client(metered_cluster.addresses)
    table = new_table(client, {"sgd": {"learning_rate": 0.1}})
    merger = ember.StepMerger(client, ranks=1)
    with pytest.raises(ValueError, match="merger and transport"):
        ember.StepPipeline(client, [("a", table)], merger=merger,
                           transport=ember.Transport.in_process_group(1)[0])


def test_an_all_to_all_that_raises_fails_the_pipeline_naming_it(metered_cluster):
    client = ember.Client(metered_cluster.addresses)
    table = new_table(client, {"sgd": {"learning_rate": 0.1}})

    def broken(blocks):
        raise RuntimeError("peer 3 is gone")

    pipe = ember.StepPipeline(client, [("a", table)], worker_id=next(_workers),
                              transport=ember.Transport(0, 2, broken))
    pipe.prefetch(0, [(np.array([0, 1], np.int64), np.array([5], np.uint64))])
    with pytest.raises(ember.EmberError, match="peer 3 is gone"):
        pipe.wait(0)
    with pytest.raises(ember.EmberError):
        pipe.close()
