"""The seed model in PyTorch: the reference workload's 17 sparse features,
pooled, under a small MLP, trained three ways on the same batches:

  native    plain PyTorch at its fastest here: the 17 tables (ids hashed
            into each feature's cardinality) as one nn.EmbeddingBag, one
            call per step, sparse gradients, torch's Adagrad;
  torchrec  TorchRec as its users run it: DistributedModelParallel,
            table-wise sharding, fbgemm's fused kernel with exact Adagrad in
            the backward;
  ember     ember.torch.EmbeddingBagCollection (--shards: a local 2-shard
            cluster, or inproc:2 for shards in the process; --staleness),
            Adagrad on the shards, rows prefetched by the data loader;
  dense     the floor: the same step without embeddings.

    python examples/torch_seed_model.py --mode ember --steps 300 --compute_ms 1

Prints the loss curve and a RESULT line (ms and CPU ms per step).
"""

import itertools
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_workload as w  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(w.NUM_FEATURES * w.DIM, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def dense_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=w.LEARNING_RATE)
    return torch.optim.Adagrad(params, lr=w.LEARNING_RATE,
                               initial_accumulator_value=w.INITIAL_ACCUMULATOR)


def kjt_parts(batch, bucketed_cards=None):
    """(values, lengths) of all features, TorchRec's layout."""
    values, lengths = [], []
    for f, (ls, ids) in enumerate(batch.features):
        values.append(ids if bucketed_cards is None else w.bucket(ids, bucketed_cards[f]))
        lengths.append(ls)
    return torch.from_numpy(np.concatenate(values)), torch.from_numpy(np.concatenate(lengths))


def one_bag_inputs(batch, cards, row_base):
    """(ids, offsets, per-id weights) of all features as one EmbeddingBag
    call: bag f * batch + i is example i of feature f; feature f's ids are
    rows row_base[f] + (id mod cards[f]) of the concatenated tables; the
    mean features' ids weigh 1 / (ids of the example)."""
    ids, offsets, weights = [], [], []
    start = 0
    for f, (lengths, raw) in enumerate(batch.features):
        ids.append(w.bucket(raw, cards[f]) + row_base[f])
        offsets.append(start + batch.offsets(f)[:-1])
        start += len(raw)
        per_id = np.ones(len(raw), np.float32)
        if w.combiner(f) == "mean":
            per_id = np.repeat(1.0 / np.maximum(lengths, 1), lengths).astype(np.float32)
        weights.append(per_id)
    return (torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(offsets)),
            torch.from_numpy(np.concatenate(weights)))


def run_native(args, batches, meter):
    """PyTorch's fastest plain path here: the 17 tables as one
    nn.EmbeddingBag (rows concatenated), one call per step for every
    feature (mean pooling as per-id weights), sparse gradients, and torch's
    Adagrad, which updates only the rows a sparse gradient touches."""
    cards = w.cardinalities(args.scale)
    row_base = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(int(sum(cards)), w.DIM, mode="sum", sparse=True)
    torch.nn.init.normal_(bag.weight, std=1.0)
    head = mlp()
    opt = dense_optimizer(args, head.parameters())
    sparse_opt = dense_optimizer(args, bag.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    inputs = [one_bag_inputs(b, cards, row_base) for b in batches]
    for i, (batch, (ids, offsets, weights)) in zip(range(args.steps),
                                                   itertools.cycle(zip(batches, inputs))):
        pooled = bag(ids, offsets, per_sample_weights=weights)  # [features * batch, dim]
        x = pooled.view(w.NUM_FEATURES, -1, w.DIM).transpose(0, 1).reshape(-1, w.NUM_FEATURES * w.DIM)
        loss = loss_fn(head(x), torch.from_numpy(batch.labels))
        opt.zero_grad()
        sparse_opt.zero_grad()
        loss.backward()
        opt.step()
        sparse_opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())
    return ("one nn.EmbeddingBag over the 17 tables, sparse grads, torch.optim.Adagrad; "
            "inputs prepared ahead")


def run_dense(args, batches, meter):
    """The floor of every variant: the same step with the pooled embeddings
    replaced by a constant (the MLP, its optimizer, the loop)."""
    head = mlp()
    opt = dense_optimizer(args, head.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    pooled = torch.randn(w.BATCH, w.NUM_FEATURES * w.DIM)
    for i, batch in zip(range(args.steps), itertools.cycle(batches)):
        loss = loss_fn(head(pooled), torch.from_numpy(batch.labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())
    return "no embeddings: the MLP on a constant input, torch.optim.Adagrad"


def torchrec_model(args, sharding: str, world_size: int):
    """TorchRec as its users build it: the 17 tables in an
    EmbeddingBagCollection under the MLP, DistributedModelParallel over
    `world_size` gloo ranks (the process group made by the caller), every
    table sharded `sharding` onto the FUSED compute kernel (fbgemm's TBE),
    whose backward applies exact Adagrad to the touched rows (its
    accumulators set to Ember's initial 0.1). Returns (model, feature names,
    cardinalities)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    cards = w.cardinalities(args.scale)
    names = [f"f{f}" for f in range(w.NUM_FEATURES)]

    def normal_init(t):
        return torch.nn.init.normal_(t, std=1.0)

    tables = [EmbeddingBagConfig(
        name=f"t{f}", embedding_dim=w.DIM, num_embeddings=cards[f], feature_names=[names[f]],
        pooling=PoolingType.MEAN if w.combiner(f) == "mean" else PoolingType.SUM, init_fn=normal_init)
        for f in range(w.NUM_FEATURES)]
    if args.optimizer == "sgd":
        fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": w.LEARNING_RATE}
    else:
        fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": w.LEARNING_RATE,
                 "eps": 1e-10}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    constraints = {t.name: ParameterConstraints(
        sharding_types=[sharding], compute_kernels=[EmbeddingComputeKernel.FUSED.value])
        for t in tables}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
            self.head = mlp()

        def forward(self, kjt):
            return self.head(self.ebc(kjt).values())

    model = Model()
    plan = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu"),
        constraints=constraints).plan(model, [sharder])
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                     sharders=[sharder])
    if args.optimizer != "sgd":
        for state in model.fused_optimizer.state_dict()["state"].values():
            for value in state.values():
                if isinstance(value, torch.Tensor) or hasattr(value, "local_shards"):
                    shards = value.local_shards() if hasattr(value, "local_shards") else None
                    for t in ([sh.tensor for sh in shards] if shards is not None else [value]):
                        t.fill_(w.INITIAL_ACCUMULATOR)
    return model, names, cards


def torchrec_inputs(batches, names, cards):
    """(KeyedJaggedTensor, labels) per batch, TorchRec's input."""
    from torchrec import KeyedJaggedTensor
    out = []
    for b in batches:
        values, lengths = kjt_parts(b, cards)
        out.append((KeyedJaggedTensor.from_lengths_sync(keys=names, values=values, lengths=lengths),
                    torch.from_numpy(b.labels)))
    return out


def run_torchrec(args, batches, meter):
    """TorchRec as its users run it on one rank (gloo on the CPU),
    table-wise (torchrec_model); the dense head on torch's Adagrad."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    model, names, cards = torchrec_model(args, "table_wise", 1)
    opt = dense_optimizer(args, model.module.head.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for i, (kjt, labels) in zip(range(args.steps),
                                itertools.cycle(torchrec_inputs(batches, names, cards))):
        loss = loss_fn(model(kjt), labels)
        opt.zero_grad()
        loss.backward()  # the fused kernel's backward updates the tables
        opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())
    dist.destroy_process_group()
    return ("DistributedModelParallel, table-wise, FUSED (fbgemm TBE, exact Adagrad in the "
            "backward, accumulators 0.1); KeyedJaggedTensors prepared ahead")


def ember_tables(args):
    import ember.torch as et
    if args.optimizer == "sgd":
        optimizer = {"sgd": {"learning_rate": w.LEARNING_RATE}}
    else:
        optimizer = {"adagrad": {"learning_rate": w.LEARNING_RATE,
                                 "initial_accumulator": w.INITIAL_ACCUMULATOR}}
    return [et.EmbeddingBagConfig(f"seed_t{f}", w.DIM, [f"f{f}"], optimizer=optimizer,
                                  initializer={"normal": {"stddev": 1.0}, "seed": f},
                                  pooling=w.combiner(f))
            for f in range(w.NUM_FEATURES)]


def train_ember(args, batches, meter, ebc, head):
    """The Ember variants' loop: `ebc` (an ember.torch.EmbeddingBagCollection
    over the 17 tables) under `head`, rows prefetched by the data loader.
    Returns the pipeline's stats."""
    import ember.torch as et
    names = [f"f{f}" for f in range(w.NUM_FEATURES)]
    opt = dense_optimizer(args, head.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    inputs = []
    for b in batches:
        values, lengths = kjt_parts(b)
        inputs.append((et.KeyedJaggedTensor(names, values, lengths), torch.from_numpy(b.labels)))

    def loader():
        for _, item in zip(range(args.steps), itertools.cycle(inputs)):
            yield item

    for i, (kjt, labels) in enumerate(et.prefetching(loader(), ebc, lambda b: b[0])):
        loss = loss_fn(head(ebc(kjt).values()), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())
    return ebc.pipeline.stats()


def run_ember(args, batches, meter, client):
    import ember.torch as et
    with et.EmbeddingBagCollection(client, ember_tables(args), staleness=args.staleness) as ebc:
        stats = train_ember(args, batches, meter, ebc, mlp())
    return {"wait_ms_per_step": stats["wait_seconds"] * 1e3 / max(stats["steps_waited"], 1),
            "config": w.ember_config(args) + "; KeyedJaggedTensors prepared ahead"}


def main():
    args = w.arguments(__doc__.splitlines()[0], ["native", "torchrec", "ember", "dense"])
    torch.set_num_threads(1)
    batches = w.make_batches(args.batches, args.scale, args.seed)
    if args.mode == "ember":
        result = w.run_on_ember(args, lambda client, meter: run_ember(args, batches, meter, client))
    else:
        meter = w.Meter(args.warmup)
        run = {"native": run_native, "torchrec": run_torchrec, "dense": run_dense}[args.mode]
        config = run(args, batches, meter)
        result = meter.result(config=config)
    result.update(framework="pytorch", mode=args.mode, torch=torch.__version__,
                  steps=args.steps, compute_ms=args.compute_ms, scale=args.scale)
    print(f"pytorch {args.mode}: loss curve {result['loss_curve']}")
    w.emit(result)


if __name__ == "__main__":
    main()
