"""The seed model in PyTorch on N ranks, one process each, as torchrun runs
them (gloo on the CPU; each rank one GPU's share of the node, its own
batches of 128):

  dense     the floor: DDP around the MLP on a constant input;
  native    plain DDP with the 17 tables as one nn.EmbeddingBag (sparse
            gradients, all-reduced by DDP; torch's Adagrad);
  torchrec  DistributedModelParallel over the N ranks, --sharding
            table_wise, column_wise or row_wise (which TorchRec allows on
            CUDA only: on the CPU its planner refuses it), fbgemm's fused
            kernel with exact Adagrad (TorchRec's own input and output
            all-to-alls; DDP for the MLP);
  ember     DDP around the MLP, ember.torch.EmbeddingBagCollection on a
            local 2-shard cluster (started by rank 0); with the node shuffle
            over torch.distributed (the default: one request per shard per
            node step) or --no_shuffle (each rank its own SSP worker).

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        examples/torch_seed_model_ranks.py --mode ember --steps 300

Rank 0 prints the loss curve and a RESULT line (its ms and CPU ms per step).
"""

import itertools
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_workload as w  # noqa: E402
from torch_seed_model import (dense_optimizer, ember_tables, mlp, one_bag_inputs,  # noqa: E402
                              torchrec_inputs, torchrec_model, train_ember)


def loop(args, meter, batches, forward, optimizers):
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for i, item in zip(range(args.steps), itertools.cycle(batches)):
        loss = loss_fn(forward(item), item[-1])
        for o in optimizers:
            o.zero_grad()
        loss.backward()
        for o in optimizers:
            o.step()
        time.sleep(args.compute_ms / 1e3)
        meter.step(i, loss.item())


def run_dense(args, batches, meter):
    head = DDP(mlp())
    pooled = torch.randn(w.BATCH, w.NUM_FEATURES * w.DIM)
    loop(args, meter, [(torch.from_numpy(b.labels),) for b in batches], lambda item: head(pooled),
         [dense_optimizer(args, head.parameters())])
    return "no embeddings: DDP around the MLP on a constant input, torch.optim.Adagrad"


def run_native(args, batches, meter):
    cards = w.cardinalities(args.scale)
    row_base = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.bag = torch.nn.EmbeddingBag(int(sum(cards)), w.DIM, mode="sum", sparse=True)
            torch.nn.init.normal_(self.bag.weight, std=1.0)
            self.head = mlp()

        def forward(self, ids, offsets, weights):
            pooled = self.bag(ids, offsets, per_sample_weights=weights)
            x = pooled.view(w.NUM_FEATURES, -1, w.DIM).transpose(0, 1).reshape(
                -1, w.NUM_FEATURES * w.DIM)
            return self.head(x)

    model = DDP(Model())
    items = [one_bag_inputs(b, cards, row_base) + (torch.from_numpy(b.labels),) for b in batches]
    loop(args, meter, items, lambda item: model(*item[:3]),
         [dense_optimizer(args, model.module.head.parameters()),
          dense_optimizer(args, model.module.bag.parameters())])
    return ("DDP around one nn.EmbeddingBag over the 17 tables (sparse gradients all-reduced) "
            "and the MLP, torch.optim.Adagrad; inputs prepared ahead")


def run_torchrec(args, batches, meter):
    model, names, cards = torchrec_model(args, args.sharding, dist.get_world_size())
    loop(args, meter, torchrec_inputs(batches, names, cards), lambda item: model(item[0]),
         [dense_optimizer(args, model.module.head.parameters())])
    return (f"DistributedModelParallel on {dist.get_world_size()} gloo ranks, {args.sharding}, "
            "FUSED (fbgemm TBE, exact Adagrad in the backward, accumulators 0.1); "
            "KeyedJaggedTensors prepared ahead")


def run_ember(args, batches, meter, addresses):
    import ember
    import ember.torch as et
    client = ember.Client(addresses)
    transport = None if args.no_shuffle else et.node_transport()
    with et.EmbeddingBagCollection(client, ember_tables(args), staleness=args.staleness,
                                   worker_id=dist.get_rank() if args.no_shuffle else 0,
                                   node_transport=transport) as ebc:
        train_ember(args, batches, meter, ebc, DDP(mlp()))
    way = ("each rank its own SSP worker, no shuffle" if args.no_shuffle
           else "the node shuffle over torch.distributed (gloo), the node one SSP worker")
    return (f"DDP around the MLP; 2 ember-server shards on 127.0.0.1, s = {args.staleness}, "
            f"Adagrad on the shards, {way}; KeyedJaggedTensors prepared ahead")


def main():
    def extra(p):
        p.add_argument("--sharding", choices=["table_wise", "column_wise", "row_wise"],
                       default="table_wise")
        p.add_argument("--no_shuffle", action="store_true")

    args = w.arguments(__doc__.splitlines()[0], ["dense", "native", "torchrec", "ember"], extra)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    batches = w.make_batches(args.batches, args.scale, args.seed + rank)
    cluster, pids = None, []
    if args.mode == "ember":
        # Rank 0 starts the shards and tells the others where they are.
        shared = [None]
        if rank == 0:
            from ember.local_cluster import LocalCluster
            cluster = LocalCluster(shards=2)
            shared = [(cluster.addresses, cluster.pids)]
        dist.broadcast_object_list(shared, src=0)
        addresses, pids = shared[0]
    meter = w.Meter(args.warmup, pids if rank == 0 else ())
    try:
        if args.mode == "ember":
            config = run_ember(args, batches, meter, addresses)
        else:
            config = {"dense": run_dense, "native": run_native, "torchrec": run_torchrec}[
                args.mode](args, batches, meter)
        result = meter.result(config=config)
        dist.barrier()
    finally:
        if cluster:
            cluster.stop()
    if rank == 0:
        result.update(framework="pytorch", mode=args.mode, ranks=ranks, torch=torch.__version__,
                      steps=args.steps, compute_ms=args.compute_ms, scale=args.scale)
        print(f"pytorch {args.mode} x{ranks}: loss curve {result['loss_curve']}")
        w.emit(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
