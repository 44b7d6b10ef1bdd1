"""The batch streams of the node-shuffle tests, built the same way in the
test process and in each torchrun rank (tests/python/torch_node_worker.py):
per step and rank, two features ("a", "b") over one table, and the
d(pooled) each rank pushes (its loss is sum(pooled * y))."""

import numpy as np

RANKS = 4
DIM = 4
FEATURES = ("a", "b")


def streams(seed, steps, batch, vocab=40, max_ids=4, dyadic=False):
    """[step][rank] -> (lengths [2 * batch], values, y [batch, 2 * DIM]):
    TorchRec's jagged layout (feature a's lengths, then b's)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ranks = []
        for _ in range(RANKS):
            lengths = rng.integers(0, max_ids + 1, size=2 * batch).astype(np.int64)
            values = rng.integers(0, vocab, size=int(lengths.sum())).astype(np.int64)
            if dyadic:  # sums of these are exact in float32
                y = (rng.integers(-4, 5, size=(batch, 2 * DIM)) / 4).astype(np.float32)
            else:
                y = rng.normal(size=(batch, 2 * DIM)).astype(np.float32)
            ranks.append((lengths, values, y))
        out.append(ranks)
    return out


def csr(lengths, values):
    """ember.StepPipeline's batch: (offsets, keys) per feature."""
    batch = len(lengths) // 2
    out, at = [], 0
    for f in range(2):
        lens = lengths[f * batch:(f + 1) * batch]
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        out.append((offsets, values[at:at + offsets[-1]].astype(np.uint64)))
        at += int(offsets[-1])
    return out


def concat(parts):
    """One step's rank batches as one global batch (rank 0's examples first)."""
    batch = len(parts[0][0]) // 2
    lengths, values = [], []
    for f in range(2):
        for lens, vals, _ in parts:
            start = int(lens[:f * batch].sum())
            lengths.append(lens[f * batch:(f + 1) * batch])
            values.append(vals[start:start + int(lens[f * batch:(f + 1) * batch].sum())])
    y = np.concatenate([p[2] for p in parts])
    return np.concatenate(lengths), np.concatenate(values), y


def keys_of(data):
    return np.unique(np.concatenate([p[1] for step in data for p in step])).astype(np.int64)
