"""ember.torch against two real shards: forward equals a reference, the
gradients pushed equal autograd's, gradcheck of the pooling the pipeline
uses, the prefetching loader, and SGD equality with nn.EmbeddingBag."""

import itertools
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed in this environment")

import ember  # noqa: E402
import ember.torch as et  # noqa: E402

_names = (f"pt{i}" for i in itertools.count())


def random_kjt(rng, features, batch, vocab, max_ids=4, weighted=False):
    lengths = torch.from_numpy(rng.integers(0, max_ids + 1, size=len(features) * batch))
    values = torch.from_numpy(rng.integers(0, vocab, size=int(lengths.sum())).astype(np.int64))
    weights = None
    if weighted:
        weights = torch.from_numpy(rng.uniform(0.5, 2.0, size=values.numel()).astype(np.float32))
    return et.KeyedJaggedTensor(features, values, lengths, weights)


def reference_pooled(client, table, kjt, feature, combiner):
    """Pooled rows of one feature by torch ops over rows read from the shards,
    with the rows as a leaf tensor (for autograd's gradient)."""
    keys = kjt.keys()
    f = keys.index(feature)
    batch = kjt.lengths().numel() // len(keys)
    lengths = kjt.lengths().view(len(keys), batch)
    start = int(lengths[:f].sum())
    ids = kjt.values()[start:start + int(lengths[f].sum())]
    w = kjt.weights_or_none()
    w = torch.ones(ids.numel()) if w is None else w[start:start + ids.numel()]
    unique, inverse = torch.unique(ids, return_inverse=True)
    rows = torch.from_numpy(client.lookup_rows(table, unique.numpy(), read_only=False))
    rows = rows.double().requires_grad_(True)
    out = []
    pos = 0
    for n in lengths[f].tolist():
        seg = slice(pos, pos + n)
        pos += n
        if n == 0:
            out.append(torch.zeros(rows.shape[1], dtype=torch.float64))
            continue
        acc = (w[seg].double()[:, None] * rows[inverse[seg]]).sum(0)
        if combiner == "mean":
            acc = acc / w[seg].double().sum()
        elif combiner == "sqrtn":
            acc = acc / torch.sqrt((w[seg].double() ** 2).sum())
        out.append(acc)
    return torch.stack(out), rows, unique


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_forward_equals_reference_and_pushed_gradients_equal_autograd(client, combiner):
    table = next(_names)
    rng = np.random.default_rng(11)
    kjt = random_kjt(rng, ["a", "b"], batch=8, vocab=30, weighted=True)
    # SGD with learning rate 1: the row change is minus the pushed gradient.
    config = et.EmbeddingBagConfig(table, 4, ["a", "b"], optimizer={"sgd": {"learning_rate": 1.0}},
                                   initializer={"uniform": {"min": -1, "max": 1}, "seed": 5},
                                   pooling=combiner)
    with et.EmbeddingBagCollection(client, [config], staleness=0, worker_id=7) as ebc:
        ref_a, rows_a, unique_a = reference_pooled(client, table, kjt, "a", combiner)
        ref_b, rows_b, unique_b = reference_pooled(client, table, kjt, "b", combiner)
        out = ebc(kjt).to_dict()
        np.testing.assert_allclose(out["a"].detach().numpy(), ref_a.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["b"].detach().numpy(), ref_b.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        weight_a = torch.from_numpy(rng.normal(size=(8, 4)).astype(np.float32))
        weight_b = torch.from_numpy(rng.normal(size=(8, 4)).astype(np.float32))
        ((out["a"] * weight_a).sum() + (out["b"] ** 2).sum() * weight_b.sum()).backward()
        ebc.flush()
    # The same loss in float64 over the reference: autograd's row gradients.
    ((ref_a * weight_a.double()).sum() + (ref_b ** 2).sum() * weight_b.double().sum()).backward()
    grads = {}
    for unique, rows in ((unique_a, rows_a), (unique_b, rows_b)):
        for k, g in zip(unique.tolist(), rows.grad):
            grads[k] = grads.get(k, 0) + g.numpy()
    before = {}
    for unique, rows in ((unique_a, rows_a), (unique_b, rows_b)):
        for k, r in zip(unique.tolist(), rows.detach()):
            before[k] = r.numpy()
    keys = sorted(grads)
    after = client.lookup_rows(table, np.array(keys, dtype=np.uint64))
    pushed = np.stack([before[k] for k in keys]) - after
    np.testing.assert_allclose(pushed, np.stack([grads[k] for k in keys]), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:Input #0 requires gradient and is not a double")
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_gradcheck_of_the_pipelines_pooling(combiner):
    # Float32 on purpose: the pooling under test is the pipeline's fp32 code;
    # pooling is linear, so eps 1e-2 differences are exact but for rounding.
    torch.manual_seed(0)
    rows = torch.randn(5, 3, dtype=torch.float32, requires_grad=True)
    offsets = torch.tensor([0, 2, 2, 5, 6])
    inverse = torch.tensor([0, 4, 1, 1, 3, 2])
    weights = torch.tensor([1.0, 0.5, 2.0, 1.5, 0.25, 3.0])
    assert torch.autograd.gradcheck(
        lambda r: et.pool(r, offsets, inverse, weights, combiner), (rows,),
        eps=1e-2, atol=2e-3, rtol=1e-3)


def test_prefetching_loader_overlaps_steps_and_pushes_every_step(client):
    table = next(_names)
    rng = np.random.default_rng(3)
    batches = [random_kjt(rng, ["x"], batch=4, vocab=20) for _ in range(6)]
    config = et.EmbeddingBagConfig(table, 2, ["x"], optimizer={"adagrad": {"learning_rate": 0.1}})
    with et.EmbeddingBagCollection(client, [config], staleness=0, worker_id=9) as ebc:
        for kjt in et.prefetching(batches, ebc):
            ebc(kjt)["x"].sum().backward()
        ebc.flush()
        stats = ebc.pipeline.stats()
    assert stats["steps_waited"] == 6 and stats["steps_pushed"] == 6


def test_forward_under_no_grad_reads_without_a_step(client):
    table = next(_names)
    rng = np.random.default_rng(4)
    kjt = random_kjt(rng, ["x"], batch=5, vocab=10)
    config = et.EmbeddingBagConfig(table, 3, ["x"], initializer={"constant": {"value": 1.0}})
    with et.EmbeddingBagCollection(client, [config], staleness=0, worker_id=10) as ebc:
        with torch.no_grad():
            pooled = ebc(kjt)["x"]
        assert ebc.pipeline.stats()["steps_waited"] == 0
    counts = kjt.lengths().numpy().astype(np.float32)
    np.testing.assert_array_equal(pooled.numpy(), np.repeat(counts[:, None], 3, axis=1))


def test_sgd_rows_equal_native_embedding_bag_over_50_steps(client):
    """s = 0 and SGD: Ember's rows after 50 steps of a small model equal those
    of the same model with nn.EmbeddingBag, within float tolerance."""
    table, vocab, dim, batch = next(_names), 64, 4, 16
    rng = np.random.default_rng(21)
    data = [random_kjt(rng, ["f"], batch, vocab) for _ in range(50)]
    targets = [torch.from_numpy(rng.normal(size=(batch, 1)).astype(np.float32)) for _ in range(50)]
    config = et.EmbeddingBagConfig(table, dim, ["f"], optimizer={"sgd": {"learning_rate": 0.05}},
                                   initializer={"uniform": {"min": -0.5, "max": 0.5}, "seed": 9})

    def dense():
        torch.manual_seed(1)
        return torch.nn.Linear(dim, 1)

    with et.EmbeddingBagCollection(client, [config], staleness=0, worker_id=11) as ebc:
        initial = client.lookup_rows(table, np.arange(vocab, dtype=np.uint64), read_only=False)
        head = dense()
        opt = torch.optim.SGD(head.parameters(), lr=0.05)
        for kjt, y in zip(et.prefetching(data, ebc), targets):
            opt.zero_grad()
            loss = ((head(ebc(kjt)["f"]) - y) ** 2).mean()
            # The model's compute: the next step's early fetch goes out
            # before this step's push even on a loaded machine.
            time.sleep(0.001)
            loss.backward()
            opt.step()
        ebc.flush()
        # s = 0 fetched the next step's rows early and brought them forward.
        stats = ebc.pipeline.stats()
        assert stats["steps_patched"] > 0, stats
    ember_rows = client.lookup_rows(table, np.arange(vocab, dtype=np.uint64))

    bag = torch.nn.EmbeddingBag(vocab, dim, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(initial))
    head = dense()
    opt = torch.optim.SGD(list(head.parameters()) + list(bag.parameters()), lr=0.05)
    for kjt, y in zip(data, targets):
        opt.zero_grad()
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), kjt.lengths().cumsum(0)[:-1]])
        loss = ((head(bag(kjt.values(), offsets)) - y) ** 2).mean()
        loss.backward()
        opt.step()
    assert not np.allclose(ember_rows, initial), "the rows did not train"
    np.testing.assert_allclose(ember_rows, bag.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
