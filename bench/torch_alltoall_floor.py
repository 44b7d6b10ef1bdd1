"""The floor under the node shuffle on torch.distributed: what one
all_to_all_single costs the ranks of a node, with nothing else running,
at the slot sizes the seed model's shuffle exchanges (keys, rows,
gradients of a rank's share of a step). The shuffle makes three such
exchanges per step (route the keys, share the rows, reduce the
gradients), so three of these are its floor per step.

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        bench/torch_alltoall_floor.py [--calls 300] [--backend gloo]

Rank 0 prints wall and CPU microseconds per call (median of 3 rounds).
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--backend", default="gloo")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    group = dist.new_group(backend=args.backend)  # as ember.torch.node_transport() makes
    ranks = dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"# {ranks} ranks, {args.backend}, one all_to_all_single of equal slots per call")
        print(f"{'slot bytes':>10} {'wall us':>9} {'cpu us':>8} {'x3 wall us':>10}")
    for slot in (256, 4096, 32768):
        send = torch.zeros(ranks * slot, dtype=torch.uint8)
        recv = torch.empty_like(send)
        walls, cpus = [], []
        for _ in range(3):
            dist.barrier(group=group)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.calls):
                dist.all_to_all_single(recv, send, group=group)
            walls.append((time.perf_counter() - wall) / args.calls * 1e6)
            cpus.append((time.process_time() - cpu) / args.calls * 1e6)
        if dist.get_rank() == 0:
            wall = statistics.median(walls)
            print(f"{slot:>10} {wall:>9.0f} {statistics.median(cpus):>8.0f} {3 * wall:>10.0f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
