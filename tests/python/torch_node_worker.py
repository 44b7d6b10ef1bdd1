"""One torchrun rank of the node-shuffle tests (test_torch_distributed.py):
DDP for a dense part, ember.torch.EmbeddingBagCollection for the table,
the ranks sharing their keys, rows and gradients through the node shuffle
over torch.distributed (gloo; its slots start at 8 bytes, so that the
capacity grows, as every rank must agree, in the first exchanges). Writes its report to OUT/rank<r>.json when
done (torchrun interleaves the ranks' stdout).

    torchrun --nproc_per_node=4 torch_node_worker.py SHARDS TABLE STEPS SEED
        WORKER {shuffle,own} {random,dyadic} OUT
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ember
import ember.torch as et
from torch_node_data import DIM, FEATURES, streams

BATCH = 6


def main():
    shards, table, steps, seed, worker, mode, grads, out = sys.argv[1:9]
    steps, seed, worker = int(steps), int(seed), int(worker)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    client = ember.Client(shards.split(","))
    shuffle = mode == "shuffle"
    ebc = et.EmbeddingBagCollection(
        client, [et.EmbeddingBagConfig(table, DIM, list(FEATURES))], create_tables=False,
        worker_id=worker if shuffle else worker + rank,
        node_transport=et.node_transport(capacity=8) if shuffle else None)
    assert not list(ebc.parameters()), "the embedding module must have no parameters for DDP"
    torch.manual_seed(0)
    dense = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(dense.parameters(), lr=0.1)
    data = streams(seed, steps, BATCH, dyadic=grads == "dyadic")
    batches = []
    for t in range(steps):
        lengths, values, y = data[t][rank]
        kjt = et.KeyedJaggedTensor(list(FEATURES), torch.from_numpy(values),
                                   torch.from_numpy(lengths))
        x = torch.from_numpy(np.full((BATCH, 3), t + rank, dtype=np.float32))
        batches.append((kjt, torch.from_numpy(y), x))
    for kjt, y, x in et.prefetching(batches, ebc, lambda b: b[0]):
        pooled = ebc(kjt).values()
        # d(loss)/d(pooled) = y whatever the dense part does: the rows do not
        # depend on DDP's all-reduce, which runs beside the shuffle.
        loss = (pooled * y).sum() + dense(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ebc.close()
    stats = ebc.pipeline.stats()
    # DDP kept the dense replicas equal.
    weights = [torch.zeros_like(dense.module.weight) for _ in range(world)]
    dist.all_gather(weights, dense.module.weight.detach())
    assert all(torch.equal(w, weights[0]) for w in weights), "DDP replicas differ"
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps_pushed": stats["steps_pushed"],
                   "unique_keys": stats["unique_keys"]}, f)


if __name__ == "__main__":
    main()
