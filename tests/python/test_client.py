"""The Python client against two real shards: round trips, pooling against a
numpy reference, errors as exceptions, and pipelines on several threads."""

import itertools
import threading
import time

import numpy as np
import pytest

import ember

_names = (f"t{i}" for i in itertools.count())


def new_table(client, dim=4, lr=1.0, init=None, **kw):
    name = next(_names)
    client.create_table(name, dim, optimizer={"sgd": {"learning_rate": lr}},
                        initializer=init or {"zeros": {}}, **kw)
    return name


def csr(rows):
    """[[keys of example 0], [keys of example 1], ...] -> (offsets, keys)."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    keys = np.array([k for r in rows for k in r], dtype=np.uint64)
    return offsets, keys


def pool_reference(table_rows, rows, weights, combiner):
    """numpy pooling of one feature; table_rows maps key -> row."""
    dim = len(next(iter(table_rows.values())))
    out = np.zeros((len(rows), dim), dtype=np.float64)
    for i, (ks, ws) in enumerate(zip(rows, weights)):
        if not ks:
            continue
        acc = sum(w * np.asarray(table_rows[k], dtype=np.float64) for k, w in zip(ks, ws))
        if combiner == "mean":
            acc = acc / sum(ws)
        elif combiner == "sqrtn":
            acc = acc / np.sqrt(sum(w * w for w in ws))
        out[i] = acc
    return out


def test_create_table_is_listed_with_its_config(client):
    name = new_table(client, dim=6, dtype="fp16", capacity=1000, eviction="lru")
    info = {t["config"]["name"]: t for t in client.list_tables()}[name]
    assert info["config"]["dim"] == 6
    assert info["config"]["dtype"] == "DTYPE_FP16"
    assert info["config"]["eviction"] == "EVICTION_POLICY_LRU"
    assert int(info["config"]["capacity"]) == 1000
    assert client.shard_count == 2
    assert [s["shard_index"] for s in client.shard_infos()] == [0, 1]


def test_pipeline_round_trip_applies_pushed_gradients(client):
    table = new_table(client, dim=4, lr=1.0)
    rows = [[1, 2], [2], [], [3, 1, 1]]
    offsets, keys = csr(rows)
    with ember.StepPipeline(client, [("f", table)], staleness=0, worker_id=1) as pipe:
        assert pipe.dims == [4]
        pipe.prefetch(0, [(offsets, keys)])
        (pooled,) = pipe.wait(0)
        assert pooled.shape == (4, 4) and pooled.dtype == np.float32
        np.testing.assert_array_equal(pooled, 0)
        grad = np.arange(16, dtype=np.float32).reshape(4, 4)
        pipe.push(0, [grad])
        pipe.flush()
        stats = pipe.stats()
        assert stats["steps_pushed"] == 1 and stats["keys"] == 6 and stats["unique_keys"] == 3
    # Sum pooling: a key's gradient is the sum of d(pooled) of each example it
    # appears in, once per occurrence; SGD with lr 1 subtracts it.
    expected = {k: np.zeros(4) for k in (1, 2, 3)}
    for i, ks in enumerate(rows):
        for k in ks:
            expected[k] -= grad[i]
    got = client.lookup_rows(table, np.array([1, 2, 3], dtype=np.uint64))
    np.testing.assert_allclose(got, np.stack([expected[k] for k in (1, 2, 3)]), rtol=0, atol=0)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pooled_rows_equal_a_numpy_reference(client, combiner):
    dim = 5
    table = new_table(client, dim=dim, init={"uniform": {"min": -1, "max": 1}, "seed": 3})
    rng = np.random.default_rng(7)
    rows = [list(rng.integers(0, 50, size=rng.integers(0, 5))) for _ in range(16)]
    weights = [list(rng.uniform(0.5, 2.0, size=len(r)).astype(np.float32)) for r in rows]
    offsets, keys = csr(rows)
    w = np.array([x for ws in weights for x in ws], dtype=np.float32)
    with ember.StepPipeline(client, [ember.Feature("f", table, combiner)], staleness=-1) as pipe:
        pipe.prefetch(0, {"f": (offsets, keys, w)})
        (pooled,) = pipe.wait(0)
        pipe.push(0, [np.zeros_like(pooled)])
    unique = sorted({k for r in rows for k in r})
    stored = client.lookup_rows(table, np.array(unique, dtype=np.uint64))
    table_rows = dict(zip(unique, stored))
    expected = pool_reference(table_rows, rows, weights, combiner)
    np.testing.assert_allclose(pooled, expected, rtol=1e-5, atol=1e-6)


def test_int64_keys_are_read_as_the_same_uint64(client):
    table = new_table(client, dim=2, init={"uniform": {"min": -1, "max": 1}, "seed": 1})
    signed = np.array([-1, 5], dtype=np.int64)
    unsigned = signed.view(np.uint64)
    np.testing.assert_array_equal(client.lookup_rows(table, signed, read_only=False),
                                  client.lookup_rows(table, unsigned))


def test_wait_into_caller_buffers(client):
    table = new_table(client, dim=3, init={"constant": {"value": 2.0}})
    offsets, keys = csr([[1], [1, 2]])
    out = np.full((2, 3), -7, dtype=np.float32)
    with ember.StepPipeline(client, [("f", table)], staleness=-1) as pipe:
        pipe.prefetch(0, [(offsets, keys)])
        (same,) = pipe.wait(0, out=[out])
        assert same is out
        pipe.push(0, [np.zeros((2, 3), dtype=np.float32)])
    np.testing.assert_array_equal(out, [[2, 2, 2], [4, 4, 4]])


def test_bad_table_config_raises_invalid_argument_naming_the_field(client):
    with pytest.raises(ember.EmberError) as err:
        client.create_table("bad", 0, optimizer={"sgd": {"learning_rate": 0.1}},
                            initializer={"zeros": {}})
    assert err.value.code == ember.StatusCode.INVALID_ARGUMENT
    assert "dim" in err.value.message
    with pytest.raises(ember.EmberError) as err:
        client.create_table("bad2", 4, optimizer={"sgdd": {}}, initializer={"zeros": {}})
    assert err.value.code == ember.StatusCode.INVALID_ARGUMENT
    assert "sgdd" in err.value.message
    assert "bad" not in {t["config"]["name"] for t in client.list_tables()}


def test_pipeline_on_a_missing_table_raises(client):
    with pytest.raises(ember.EmberError) as err:
        ember.StepPipeline(client, [("f", "no_such_table")])
    assert err.value.code == ember.StatusCode.NOT_FOUND
    assert "no_such_table" in err.value.message


def test_out_of_order_steps_raise_failed_precondition_and_change_nothing(client):
    table = new_table(client, dim=2)
    offsets, keys = csr([[1]])
    with ember.StepPipeline(client, [("f", table)], staleness=-1) as pipe:
        pipe.prefetch(0, [(offsets, keys)])
        with pytest.raises(ember.EmberError) as err:
            pipe.wait(1)
        assert err.value.code == ember.StatusCode.FAILED_PRECONDITION
        pipe.wait(0)
        with pytest.raises(ember.EmberError) as err:
            pipe.push(0, [np.zeros((3, 2), dtype=np.float32)])  # wrong batch
        assert err.value.code == ember.StatusCode.INVALID_ARGUMENT
        assert "d_pooled" in err.value.message and "received 6" in err.value.message
        pipe.push(0, [np.ones((1, 2), dtype=np.float32)])
    np.testing.assert_array_equal(client.lookup_rows(table, np.array([1], dtype=np.uint64)),
                                  [[-1, -1]])


def test_wrong_array_types_raise_type_error_naming_the_feature(client):
    table = new_table(client, dim=2)
    with ember.StepPipeline(client, [("clicks", table)], staleness=-1) as pipe:
        with pytest.raises(TypeError, match="feature 'clicks' keys: expected uint64 or int64"):
            pipe.prefetch(0, [(np.array([0, 1], dtype=np.int64), np.array([1.5]))])
        with pytest.raises(TypeError, match="contiguous"):
            strided = np.arange(4, dtype=np.uint64)[::2]
            pipe.prefetch(0, [(np.array([0, 2], dtype=np.int64), strided)])
        with pytest.raises(KeyError, match="no feature 'clicks'"):
            pipe.prefetch(0, {"views": (np.array([0, 0]), np.array([], dtype=np.uint64))})
        # Nothing was prefetched: step 0 is still the next one.
        pipe.prefetch(0, [(np.array([0, 1], dtype=np.int64), np.array([4], dtype=np.uint64))])
        pipe.wait(0)
        pipe.push(0, [np.zeros((1, 2), dtype=np.float32)])


def test_connect_to_a_dead_address_raises_unavailable():
    with pytest.raises(ember.EmberError) as err:
        ember.Client(["127.0.0.1:1"], connect_timeout=0.5)
    assert err.value.code in (ember.StatusCode.UNAVAILABLE, ember.StatusCode.DEADLINE_EXCEEDED)
    assert "127.0.0.1:1" in err.value.message


def test_pipelines_on_threads_share_a_client_and_release_the_gil(client):
    """Four workers under SSP s = 0, one thread each: a worker's wait for step
    t blocks until every worker pushed t - 1, which only ends if the blocked
    waits let the other threads run."""
    table = new_table(client, dim=2, lr=1.0)
    workers, steps = 4, 20
    errors = []

    def run(worker):
        try:
            with ember.StepPipeline(client, [("f", table)], staleness=0,
                                    worker_id=100 + worker) as pipe:
                for step in range(steps):
                    offsets, keys = csr([[7]])
                    pipe.prefetch(step, [(offsets, keys)])
                    pipe.wait(step)
                    pipe.push(step, [np.ones((1, 2), dtype=np.float32)])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "pipelines did not finish within 60 s"
    assert not errors, errors
    np.testing.assert_array_equal(client.lookup_rows(table, np.array([7], dtype=np.uint64)),
                                  [[-workers * steps] * 2])


def test_packed_wait_and_push_equal_the_per_feature_ones(client):
    """wait_packed is the per-feature rows side by side; push_packed pushes
    the same gradients as push."""
    t1, t2 = new_table(client, dim=2, init={"uniform": {"min": -1, "max": 1}, "seed": 4}), \
        new_table(client, dim=3, init={"uniform": {"min": -1, "max": 1}, "seed": 5})
    offsets, keys = csr([[1, 2], [3]])
    grads = [np.arange(4, dtype=np.float32).reshape(2, 2), np.ones((2, 3), np.float32)]
    with ember.StepPipeline(client, [("a", t1), ("b", t2)], staleness=-1) as pipe:
        pipe.prefetch(0, [(offsets, keys), (offsets, keys)])
        a, b = pipe.wait(0)
        packed = pipe.wait_packed(0)
        np.testing.assert_array_equal(packed, np.concatenate([a, b], axis=1))
        with pytest.raises(ember.EmberError, match="expected batch x 5"):
            pipe.push_packed(0, np.zeros((2, 4), np.float32))
        pipe.push_packed(0, np.concatenate(grads, axis=1))
    np.testing.assert_allclose(client.lookup_rows(t1, np.array([3], dtype=np.uint64)),
                               a[1:2] - grads[0][1:2], rtol=1e-6)
    np.testing.assert_allclose(client.lookup_rows(t2, np.array([3], dtype=np.uint64)),
                               b[1:2] - grads[1][1:2], rtol=1e-6)


def test_tls_and_mutual_tls_from_python(tmp_path):
    """A shard under mutual TLS (certificates made by openssl now) serves a
    client with a certificate its CA signed, and refuses one without."""
    import os
    import subprocess
    script = os.path.join(os.path.dirname(__file__), "..", "server", "make_test_certs.sh")
    subprocess.run(["bash", script, str(tmp_path)], check=True, capture_output=True)
    pem = lambda name: str(tmp_path / name)  # noqa: E731
    flags = [f"--tls_cert={pem('server.pem')}", f"--tls_key={pem('server.key')}",
             f"--tls_client_ca={pem('ca.pem')}"]
    from ember.local_cluster import LocalCluster
    with LocalCluster(shards=1, extra_args=flags) as cluster:
        client = ember.Client(cluster.addresses, tls=True, tls_ca=pem("ca.pem"),
                              tls_cert=pem("client.pem"), tls_key=pem("client.key"))
        client.create_table("t", 4, optimizer={"sgd": {"learning_rate": 0.1}},
                            initializer={"zeros": {}})
        assert client.stored_rows("t") == 0
        with pytest.raises(ember.EmberError) as err:
            ember.Client(cluster.addresses, connect_timeout=1.0, tls=True, tls_ca=pem("ca.pem"))
        assert err.value.code == ember.StatusCode.DEADLINE_EXCEEDED
        assert "TLS settings" in err.value.message
        with pytest.raises(ember.EmberError) as err:
            ember.Client(cluster.addresses, tls=True, tls_cert=pem("client.pem"))
        assert err.value.code == ember.StatusCode.INVALID_ARGUMENT


def test_bearer_token_from_python(tmp_path):
    """A shard with --auth_tokens_file serves a client with an admin token and
    refuses one without (UNAUTHENTICATED) or with a trainer token creating a
    table (PERMISSION_DENIED)."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("admin-token-0123456789 admin\ntrainer-token-0123456789 trainer\n")
    from ember.local_cluster import LocalCluster
    with LocalCluster(shards=1, extra_args=[f"--auth_tokens_file={tokens}"]) as cluster:
        admin = ember.Client(cluster.addresses, auth_token="admin-token-0123456789")
        admin.create_table("t", 4, optimizer={"sgd": {"learning_rate": 0.1}},
                           initializer={"zeros": {}})
        trainer = ember.Client(cluster.addresses, auth_token="trainer-token-0123456789")
        assert trainer.stored_rows("t") == 0
        with pytest.raises(ember.EmberError) as err:
            trainer.create_table("u", 4, optimizer={"sgd": {"learning_rate": 0.1}},
                                 initializer={"zeros": {}})
        assert err.value.code == ember.StatusCode.PERMISSION_DENIED
        with pytest.raises(ember.EmberError) as err:
            ember.Client(cluster.addresses, connect_timeout=1.0)
        assert err.value.code == ember.StatusCode.UNAUTHENTICATED
        assert "0123456789" not in err.value.message


def test_early_fetch_gives_the_rows_of_plain_s0_bit_for_bit(client):
    """s = 0 with early fetch (the default) sees exactly the rows of plain
    s = 0, step by step, while bringing rows forward on the trainer."""
    rng = np.random.default_rng(5)
    steps = 60
    batches = [csr([[int(k)] for k in rng.integers(0, 40, size=16)]) for _ in range(steps)]
    seen, stats = {}, {}
    for early in (False, True):
        table = new_table(client, dim=4, lr=0.1, init={"uniform": {"min": -1, "max": 1}, "seed": 1})
        with ember.StepPipeline(client, [("f", table)], staleness=0, worker_id=30,
                                early_fetch=early) as pipe:
            pipe.prefetch(0, [batches[0]])
            seen[early] = []
            for t in range(steps):
                if t + 1 < steps:
                    pipe.prefetch(t + 1, [batches[t + 1]])
                (pooled,) = pipe.wait(t)
                seen[early].append(pooled.copy())
                # The step's compute: the peek of t + 1 goes out meanwhile.
                # Without it a loaded machine's network thread may only get
                # to step t + 1 once push t is there, and fetch it after.
                time.sleep(0.002)
                pipe.push(t, [pooled - 0.25])
            pipe.flush()
            stats[early] = pipe.stats()
    for t in range(steps):
        assert np.array_equal(seen[False][t], seen[True][t]), f"step {t} differs"
    assert stats[False]["steps_patched"] == 0
    assert stats[True]["steps_patched"] > steps // 2, stats[True]
    assert stats[True]["rows_patched"] > 0 and stats[True]["steps_refetched"] == 0


def test_in_process_shards_need_no_server_and_restore_their_checkpoint(tmp_path):
    keys = np.arange(1, 41, dtype=np.uint64)
    with pytest.raises(ValueError, match="shards and inproc"):
        ember.Client(["127.0.0.1:1"], inproc=2)
    first = ember.Client(inproc=2, inproc_checkpoint_dir=str(tmp_path))
    assert first.shard_count == 2
    table = new_table(first, dim=4, lr=1.0, init={"truncated_normal": {"stddev": 0.1}, "seed": 3})
    offsets = np.arange(len(keys) + 1, dtype=np.int64)
    with ember.StepPipeline(first, [("f", table)], staleness=0, worker_id=1) as pipe:
        for step in range(3):
            pipe.prefetch(step, [(offsets, keys)])
            pipe.wait(step)
            pipe.push(step, [np.full((len(keys), 4), 0.5, dtype=np.float32)])
        pipe.flush()
    trained = first.lookup_rows(table, keys)
    first.checkpoint(id="py-ckpt")
    assert (tmp_path / "shard-1" / "py-ckpt" / "MANIFEST").exists()
    again = ember.Client(inproc=2, inproc_checkpoint_dir=str(tmp_path), inproc_restore_from="py-ckpt")
    np.testing.assert_array_equal(again.lookup_rows(table, keys), trained)


def test_tables_created_without_a_seed_start_the_same_id_with_different_rows(client):
    """The default seed is the table's name's CRC-32 (ember.client.table_seed):
    user 5 and item 5 do not start identical; an explicit seed still rules."""
    from ember.client import table_seed
    init = {"uniform": {"min": -1, "max": 1}}
    a, b = new_table(client, dim=4, init=dict(init)), new_table(client, dim=4, init=dict(init))
    keys = np.array([5, 6, 7], dtype=np.int64)
    ra, rb = client.lookup_rows(a, keys, read_only=False), client.lookup_rows(b, keys, read_only=False)
    assert not np.array_equal(ra, rb)
    assert table_seed(a) != table_seed(b)
    seeded = [new_table(client, dim=4, init={**init, "seed": table_seed(a)}) for _ in range(2)]
    np.testing.assert_array_equal(client.lookup_rows(seeded[0], keys, read_only=False), ra)
    np.testing.assert_array_equal(client.lookup_rows(seeded[1], keys, read_only=False), ra)
