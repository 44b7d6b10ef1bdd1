"""The seed model in PyTorch: the reference workload's 17 sparse features,
pooled, under a small MLP, trained three ways on the same batches:

  native    nn.EmbeddingBag per feature (ids hashed into a table of the
            feature's cardinality), sparse gradients, torch's Adagrad;
  torchrec  TorchRec's EmbeddingBagCollection (unsharded, on the CPU) fed a
            KeyedJaggedTensor, torch's Adagrad;
  ember     ember.torch.EmbeddingBagCollection on a local 2-shard cluster,
            Adagrad on the shards, rows prefetched by the data loader.

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


def run_native(args, batches, meter):
    cards = w.cardinalities(args.scale)
    bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(n, w.DIM, mode=w.combiner(f), sparse=True)
                               for f, n in enumerate(cards))
    head = mlp()
    opt = dense_optimizer(args, list(head.parameters()) + list(bags.parameters()))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for i, batch in zip(range(args.steps), itertools.cycle(batches)):
        pooled = []
        for f, bag in enumerate(bags):
            lengths, ids = batch.features[f]
            offsets = torch.from_numpy(batch.offsets(f)[:-1])
            pooled.append(bag(torch.from_numpy(w.bucket(ids, cards[f])), offsets))
        loss = loss_fn(head(torch.cat(pooled, 1)), torch.from_numpy(batch.labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())


def run_torchrec(args, batches, meter):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
    cards = w.cardinalities(args.scale)
    names = [f"f{f}" for f in range(w.NUM_FEATURES)]
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{f}", embedding_dim=w.DIM, num_embeddings=cards[f],
                           feature_names=[names[f]],
                           pooling=PoolingType.MEAN if w.combiner(f) == "mean" else PoolingType.SUM)
        for f in range(w.NUM_FEATURES)])
    head = mlp()
    opt = dense_optimizer(args, list(head.parameters()) + list(ebc.parameters()))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for i, batch in zip(range(args.steps), itertools.cycle(batches)):
        values, lengths = kjt_parts(batch, cards)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=names, values=values, lengths=lengths)
        loss = loss_fn(head(ebc(kjt).values()), torch.from_numpy(batch.labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())


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


def run_ember(args, batches, meter, client):
    import ember.torch as et
    names = [f"f{f}" for f in range(w.NUM_FEATURES)]
    head = mlp()
    opt = dense_optimizer(args, head.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def loader():
        for _, batch in zip(range(args.steps), itertools.cycle(batches)):
            values, lengths = kjt_parts(batch)
            yield et.KeyedJaggedTensor(names, values, lengths), torch.from_numpy(batch.labels)

    with et.EmbeddingBagCollection(client, ember_tables(args), staleness=0) as ebc:
        for i, (kjt, labels) in enumerate(et.prefetching(loader(), ebc, lambda b: b[0])):
            loss = loss_fn(head(ebc(kjt).values()), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.compute_ms / 1e3)
            meter.step(i, loss.item())
        stats = ebc.pipeline.stats()
    return {"wait_ms_per_step": stats["wait_seconds"] * 1e3 / max(stats["steps_waited"], 1)}


def main():
    args = w.arguments(__doc__.splitlines()[0], ["native", "torchrec", "ember"])
    torch.set_num_threads(1)
    batches = w.make_batches(args.batches, args.scale, args.seed)
    if args.mode == "ember":
        result = w.run_on_ember(args, lambda client, meter: run_ember(args, batches, meter, client))
    else:
        meter = w.Meter(args.warmup)
        (run_native if args.mode == "native" else run_torchrec)(args, batches, meter)
        result = meter.result()
    result.update(framework="pytorch", mode=args.mode, torch=torch.__version__,
                  steps=args.steps, compute_ms=args.compute_ms, scale=args.scale)
    print(f"pytorch {args.mode}: loss curve {result['loss_curve']}")
    w.emit(result)


if __name__ == "__main__":
    main()
