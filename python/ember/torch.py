"""Ember in PyTorch: an EmbeddingBagCollection whose tables live on Ember.

TorchRec's user-facing shape: a KeyedJaggedTensor of per-feature lengths and
values in, a KeyedTensor of pooled [batch, dim] rows per feature out. The
forward waits for the step's rows (fetched ahead by `prefetch`), the backward
pushes d(pooled) to the shards, where the table's optimizer applies it; the
tables have no parameters in the module.

    ebc = ember.torch.EmbeddingBagCollection(client, tables=[
        ember.torch.EmbeddingBagConfig("user", 8, ["user_id"],
                                       optimizer={"adagrad": {"learning_rate": 0.05}})])
    for features, labels in ember.torch.prefetching(loader, ebc, lambda b: b[0]):
        pooled = ebc(features).to_dict()      # {"user_id": [batch, 8]}
        loss = ...; loss.backward()           # the backward pushes
        dense_optimizer.step()

Each forward is one step: its batch must be the one prefetched for that step
(`prefetching` does this for a data loader; without it, forward prefetches
and waits itself), and the loss must use its output, so that backward pushes
the step (a step never pushed stalls the next ones under SSP). Under torch.no_grad the forward reads the rows without a
step (read-only, no push), for evaluation.
"""

from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import _ember
from .client import Client, StepPipeline, Transport


class KeyedJaggedTensor:
    """Per-feature jagged ids, TorchRec's layout: `values` holds feature 0's
    ids of every example, then feature 1's, ...; `lengths` has
    len(keys) * batch entries (ids per feature and example); `weights`
    (optional) one per id. TorchRec's own KeyedJaggedTensor is accepted too."""

    def __init__(self, keys: Sequence[str], values: torch.Tensor, lengths: torch.Tensor,
                 weights: Optional[torch.Tensor] = None):
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths
        self._weights = weights

    @staticmethod
    def from_lengths_sync(keys, values, lengths, weights=None):
        return KeyedJaggedTensor(keys, values, lengths, weights)

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights


class KeyedTensor:
    """Pooled rows of every feature side by side, TorchRec's KeyedTensor:
    values() is [batch, sum of dims] (feature f in the columns after those of
    the features before it); to_dict() and [name] give [batch, dim] views."""

    def __init__(self, keys: List[str], length_per_key: List[int], values: torch.Tensor):
        self._keys = keys
        self._lengths = length_per_key
        self._values = values

    def keys(self) -> List[str]:
        return self._keys

    def length_per_key(self) -> List[int]:
        return self._lengths

    def values(self) -> torch.Tensor:
        return self._values

    def to_dict(self) -> Dict[str, torch.Tensor]:
        return dict(zip(self._keys, torch.split(self._values, self._lengths, dim=1)))

    def __getitem__(self, key: str) -> torch.Tensor:
        f = self._keys.index(key)
        start = sum(self._lengths[:f])
        return self._values[:, start:start + self._lengths[f]]


class EmbeddingBagConfig(NamedTuple):
    """One Ember table and the features that look it up. optimizer and
    initializer are ember.v1.TableConfig's, in protobuf's JSON form;
    pooling: "sum", "mean" or "sqrtn"."""

    name: str
    embedding_dim: int
    feature_names: List[str]
    optimizer: Mapping[str, Any] = {"sgd": {"learning_rate": 0.01}}
    initializer: Mapping[str, Any] = {"truncated_normal": {"stddev": 0.05}}
    pooling: str = "sum"
    dtype: str = "fp32"
    capacity: int = 0


def _csr(kjt, names: List[str]) -> List[tuple]:
    """(offsets, keys, weights) numpy views per feature of `names`, in that
    order, from a KeyedJaggedTensor; views of the tensors where possible."""
    keys = list(kjt.keys())
    lengths = kjt.lengths()
    values = kjt.values()
    weights = kjt.weights_or_none()
    nf = len(keys)
    if nf == 0 or lengths.numel() % nf != 0:
        raise ValueError(f"KeyedJaggedTensor: {lengths.numel()} lengths for {nf} keys; "
                         "expected len(keys) * batch")
    batch = lengths.numel() // nf
    per_feature = lengths.view(nf, batch).to(torch.int64)
    offsets = torch.zeros((nf, batch + 1), dtype=torch.int64)
    torch.cumsum(per_feature, dim=1, out=offsets[:, 1:])
    ends = offsets[:, -1].cumsum(0).tolist()
    values_np = values.detach().to(torch.int64).numpy()
    weights_np = None if weights is None else weights.detach().to(torch.float32).numpy()
    offsets_np = offsets.numpy()
    index = {k: i for i, k in enumerate(keys)}
    out = []
    for name in names:
        if name not in index:
            raise KeyError(f"KeyedJaggedTensor has no feature '{name}'; it has {keys}")
        f = index[name]
        begin = ends[f - 1] if f > 0 else 0
        entry = (offsets_np[f], values_np[begin:ends[f]])
        if weights_np is not None:
            entry = entry + (weights_np[begin:ends[f]],)
        out.append(entry)
    return out


class _Lookup(torch.autograd.Function):
    """forward: the step's pooled rows, [batch, sum of dims]; backward: push
    d(pooled) for the step. One tensor each way: per-feature tensors would
    cost autograd and copies for every feature at every step."""

    @staticmethod
    def forward(ctx, anchor, pipe, step, batch_size, width):
        ctx.pipe, ctx.step = pipe, step
        out = torch.empty((batch_size, width), dtype=torch.float32)
        pipe.wait_packed(step, out=out.numpy())
        return out

    @staticmethod
    def backward(ctx, grad):
        if grad.dtype != torch.float32:
            grad = grad.float()
        if not grad.is_contiguous():
            grad = grad.contiguous()
        ctx.pipe.push_packed(ctx.step, grad.numpy())
        return None, None, None, None, None


class _Pool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, offsets, inverse, weights, combiner):
        ctx.save_for_backward(offsets, inverse, weights)
        ctx.combiner, ctx.num_rows = combiner, rows.shape[0]
        w = None if weights is None else weights.numpy()
        return torch.from_numpy(_ember.pool_forward(offsets.numpy(), inverse.numpy(),
                                                    rows.detach().to(torch.float32).numpy(),
                                                    combiner, w)).to(rows.dtype)

    @staticmethod
    def backward(ctx, d_pooled):
        offsets, inverse, weights = ctx.saved_tensors
        w = None if weights is None else weights.numpy()
        d_rows = _ember.pool_backward(offsets.numpy(), inverse.numpy(),
                                      d_pooled.detach().to(torch.float32).contiguous().numpy(),
                                      ctx.num_rows, ctx.combiner, w)
        return torch.from_numpy(d_rows).to(d_pooled.dtype), None, None, None, None


def pool(rows: torch.Tensor, offsets: torch.Tensor, inverse: torch.Tensor,
         weights: Optional[torch.Tensor] = None, combiner: str = "sum") -> torch.Tensor:
    """Pools rows[inverse[j]] per example with Ember's own host pooling (the
    code the pipeline pools and pushes with), differentiable in `rows`; in
    fp32 whatever the dtype of `rows`."""
    return _Pool.apply(rows, offsets.to(torch.int64).contiguous(),
                       inverse.to(torch.int32).contiguous().view(torch.int32),
                       None if weights is None else weights.to(torch.float32).contiguous(),
                       combiner)


def node_transport(group=None, capacity: int = 1024) -> Transport:
    """This rank's ember.Transport over torch.distributed, for the node
    shuffle of ranks in several processes (torchrun, one process per GPU).
    `group`: the ranks of this node; default, a new group of every rank
    (dist.new_group: a collective, so every rank calls this at the same
    point). Its own group, not DDP's: the shuffle runs on the pipeline's
    background thread while DDP all-reduces on others, and a process group
    must see its collectives in one order. On NCCL the blocks go through
    the current CUDA device; on gloo through host memory.

    Each exchange is one all_to_all_single of equal slots: every block
    padded to a capacity all ranks share, after a header with its length
    and the sender's longest block. Each rank thus learns the longest block
    of every rank, so all see alike when one did not fit, and all repeat
    with a larger capacity (kept for the next calls): one collective per
    exchange in the steady state rather than one for the sizes and one for
    the bytes (each costs the node's ranks a round of wake-ups).
    `capacity`: the first slot size in bytes."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise RuntimeError("ember.torch.node_transport: torch.distributed is not initialized; "
                           "call torch.distributed.init_process_group first (torchrun sets "
                           "its environment)")
    if group is None:
        group = dist.new_group(backend=dist.get_backend())
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    header = 16  # int64 length, int64 the sender's longest block
    capacity = [max(int(capacity), 0)]

    def all_to_all(blocks: List[bytes]) -> List[memoryview]:
        longest = max(len(b) for b in blocks)
        while True:
            slot = header + capacity[0]
            send = np.zeros((size, slot), np.uint8)
            for r, b in enumerate(blocks):
                send[r, :header] = np.array([len(b), longest], np.int64).view(np.uint8)
                fits = min(len(b), capacity[0])
                send[r, header:header + fits] = np.frombuffer(b, np.uint8, count=fits)
            recv = torch.empty(size * slot, dtype=torch.uint8, device=device)
            dist.all_to_all_single(recv, torch.from_numpy(send.reshape(-1)).to(device),
                                   group=group)
            got = recv.cpu().numpy().reshape(size, slot)
            heads = np.ascontiguousarray(got[:, :header]).view(np.int64)  # [rank, 2]
            need = int(heads[:, 1].max())
            if need <= capacity[0]:
                return [memoryview(got[r, header:header + int(heads[r, 0])]) for r in range(size)]
            capacity[0] = need + need // 2  # the same on every rank: `need` is the global max

    return Transport(rank, size, all_to_all)


class EmbeddingBagCollection(torch.nn.Module):
    """Pooled embeddings of several sparse features from Ember tables.

    client: an ember.Client; tables: EmbeddingBagConfig per table (created on
    the cluster if missing; an existing table must have the same
    definition). staleness / worker_id: the pipeline's SSP bound and worker
    id (one per trainer replica); early_fetch: at staleness 0 (the default),
    fetch the next step's rows while this one computes and bring them
    forward exactly (ember.StepPipeline). The module owns one ember.StepPipeline;
    close() (or the end of a `with`) flushes and unregisters it.

    Several GPUs of a node, one process each (torchrun): with
    node_transport=ember.torch.node_transport() the ranks share their
    traffic (the node shuffle): each unique key of the node is fetched and
    pushed once, each shard gets one request per node step, and the node is
    one SSP worker (`worker_id`: the node's, the same on every rank).
    Without it each rank is its own worker (give each its own worker_id).
    The module has no parameters, so DDP around a model that holds it
    all-reduces only the dense part (docs/python.md).
    """

    def __init__(self, client: Client, tables: Sequence[EmbeddingBagConfig], *,
                 staleness: int = 0, worker_id: int = 0, prefetch_depth: int = -1,
                 first_step: int = 0, create_tables: bool = True, early_fetch: bool = True,
                 node_transport: Optional[Transport] = None):
        super().__init__()
        self._client = client
        features = []
        for t in tables:
            if create_tables:
                client.create_table(t.name, t.embedding_dim, optimizer=t.optimizer,
                                    initializer=t.initializer, dtype=t.dtype, capacity=t.capacity)
            features += [(f, t.name, t.pooling) for f in t.feature_names]
        self._features = features
        self._names = [f[0] for f in features]
        self._pipe = StepPipeline(client, features, staleness=staleness, worker_id=worker_id,
                                  prefetch_depth=prefetch_depth, first_step=first_step,
                                  early_fetch=early_fetch, transport=node_transport)
        self._dims = list(self._pipe.dims)
        self._width = sum(self._dims)
        self._next_prefetch = first_step
        self._next_forward = first_step
        self._batch_sizes: Dict[int, int] = {}
        self._feature_index: Dict[tuple, List[int]] = {}
        # Autograd reaches _Lookup.backward only through an input that needs
        # a gradient: this empty tensor is that input (it gets none).
        self._anchor = torch.zeros(0, requires_grad=True)

    @property
    def feature_names(self) -> List[str]:
        return self._names

    @property
    def pipeline(self) -> StepPipeline:
        return self._pipe

    def prefetch(self, features) -> int:
        """Starts fetching the rows of the next step's batch (a
        KeyedJaggedTensor); returns the step."""
        step = self._next_prefetch
        keys = tuple(features.keys())
        index = self._feature_index.get(keys)
        if index is None:
            missing = [n for n in self._names if n not in keys]
            if missing:
                raise KeyError(f"KeyedJaggedTensor has no feature {missing[0]!r}; it has {list(keys)}")
            index = self._feature_index[keys] = [keys.index(n) for n in self._names]
        lengths = features.lengths()
        if len(keys) == 0 or lengths.numel() % len(keys) != 0:
            raise ValueError(f"KeyedJaggedTensor: {lengths.numel()} lengths for {len(keys)} keys; "
                             "expected len(keys) * batch")
        weights = features.weights_or_none()
        self._pipe.prefetch_jagged(
            step, features.values().detach().to(torch.int64).numpy(),
            lengths.detach().to(torch.int64).numpy(), index,
            None if weights is None else weights.detach().to(torch.float32).numpy())
        self._batch_sizes[step] = lengths.numel() // len(keys)
        self._next_prefetch += 1
        return step

    def forward(self, features) -> KeyedTensor:
        if not torch.is_grad_enabled():
            return self._read_only(features)
        step = self._next_forward
        if step == self._next_prefetch:
            self.prefetch(features)
        self._next_forward += 1
        pooled = _Lookup.apply(self._anchor, self._pipe, step, self._batch_sizes.pop(step),
                               self._width)
        return KeyedTensor(self._names, self._dims, pooled)

    def _read_only(self, features) -> KeyedTensor:
        out = []
        for (name, table, pooling), (offsets, keys, *w) in zip(self._features,
                                                                _csr(features, self._names)):
            unique, inverse = np.unique(keys.view(np.uint64), return_inverse=True)
            rows = self._client.lookup_rows(table, unique)
            out.append(torch.from_numpy(_ember.pool_forward(
                offsets, inverse.astype(np.uint32), rows, pooling, w[0] if w else None)))
        return KeyedTensor(self._names, self._dims, torch.cat(out, dim=1))

    def flush(self) -> None:
        """Blocks until every push so far is applied on the shards."""
        self._pipe.flush()

    def close(self) -> None:
        self._pipe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def prefetching(loader: Iterable, ebc: EmbeddingBagCollection,
                features: Callable[[Any], Any] = lambda batch: batch) -> Iterator[Any]:
    """Yields the loader's batches, with the next batch's rows already being
    fetched: batch t + 1 is prefetched before batch t is yielded, so the
    fetch runs while step t computes. `features(batch)` picks the
    KeyedJaggedTensor out of a batch."""
    it = iter(loader)
    try:
        current = next(it)
    except StopIteration:
        return
    ebc.prefetch(features(current))
    for nxt in it:
        ebc.prefetch(features(nxt))
        yield current
        current = nxt
    yield current
