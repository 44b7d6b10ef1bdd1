"""ember.Client and ember.StepPipeline: the C++ trainer library from Python.

Both are thin subclasses of the native classes in ember._ember: the per-step
calls (prefetch, wait, push) are C++ methods with no Python frame of their own,
run with the GIL released while they block, and read numpy arrays in place.
"""

import json
import zlib
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Union

from . import _ember

_COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}
_DTYPES = {"fp32": "DTYPE_FP32", "fp16": "DTYPE_FP16", "bf16": "DTYPE_BF16"}
_EVICTION = {"none": "EVICTION_POLICY_NONE", "lru": "EVICTION_POLICY_LRU", "lfu": "EVICTION_POLICY_LFU"}


def _enum(value: str, short: Mapping[str, str]) -> str:
    return short.get(value.lower(), value)


def table_seed(name: str) -> int:
    """The initializer seed of a table created without one: the CRC-32 of
    its name (stable across processes and versions, unlike hash())."""
    return zlib.crc32(name.encode("utf-8"))


class Client(_ember.Client):
    """A trainer's connection to every shard of a cluster (ember::Client).

    shards: "host:port" of every shard, in shard-index order. Connecting checks
    that shard i reports index i of len(shards). Or inproc=N instead: N shards
    in this process (no server to start; the same shard code, without a
    network), for a job with one trainer process. Thread-safe: share one
    Client among the pipelines of a process. Failures raise ember.EmberError.
    """

    def __init__(self, shards: Sequence[str] = (), *, inproc: int = 0,
                 inproc_checkpoint_dir: Optional[str] = None,
                 inproc_restore_from: Optional[str] = None, rpc_timeout: float = 10.0,
                 connect_timeout: float = 10.0, retry_budget: float = 30.0,
                 tls: bool = False, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, auth_token: Optional[str] = None):
        """Connects to every shard. With tls=True the connections use TLS:
        tls_ca is the PEM CA of the shards' certificates (default: the
        system's roots); tls_cert and tls_key a PEM client certificate and
        key, for shards that require one (mutual TLS); tls_server_name the
        name their certificates carry when it is not the address's host.
        auth_token: the bearer token for shards started with
        --auth_tokens_file (send it over TLS only).

        inproc_checkpoint_dir: where in-process shard i checkpoints
        (<dir>/shard-<i>, the layout shard servers restore with
        --checkpoint_dir=<dir>/shard-<i>); inproc_restore_from: "latest" or
        a checkpoint id under it, restored when the shards start."""
        if inproc:
            if shards:
                raise ValueError("shards and inproc: expected one of them, received both")
            shards = [f"inproc:{inproc}"]
        super().__init__(list(shards), inproc_checkpoint_dir or "", inproc_restore_from or "",
                         rpc_timeout, connect_timeout, retry_budget, tls,
                         tls_ca or "", tls_cert or "", tls_key or "", tls_server_name or "",
                         auth_token or "")
        self._dims: Dict[str, int] = {}

    def create_table(self, name: str, dim: int, *, optimizer: Mapping[str, Any],
                     initializer: Mapping[str, Any], dtype: str = "fp32", capacity: int = 0,
                     eviction: str = "none", ttl: Optional[Mapping[str, int]] = None,
                     admission: Optional[Mapping[str, int]] = None) -> None:
        """Creates a table on every shard (idempotent for an identical
        definition). The arguments are ember.v1.TableConfig's fields; the
        nested ones in protobuf's JSON form, e.g.
        optimizer={"adagrad": {"learning_rate": 0.05}},
        initializer={"truncated_normal": {"stddev": 0.05}, "seed": 7}.
        dtype: "fp32", "fp16" or "bf16"; eviction: "none", "lru" or "lfu".
        An initializer without a "seed" gets table_seed(name), so that two
        tables do not start the same id with the same row.
        """
        initializer = dict(initializer)
        if "seed" not in initializer:
            initializer["seed"] = str(table_seed(name))
        config: Dict[str, Any] = {
            "name": name,
            "dim": dim,
            "dtype": _enum(dtype, _DTYPES),
            "initializer": initializer,
            "optimizer": dict(optimizer),
            "capacity": str(capacity),
            "eviction": _enum(eviction, _EVICTION),
        }
        if ttl is not None:
            config["ttl"] = {k: str(v) for k, v in ttl.items()}
        if admission is not None:
            config["admission"] = dict(admission)
        self._create_table_json(json.dumps(config))
        self._dims[name] = dim

    def list_tables(self) -> list:
        """Tables as shard 0 holds them: ember.v1.TableInfo as dicts."""
        return json.loads(self._list_tables_json())

    def shard_infos(self) -> list:
        """Every shard's GetShardInfoResponse as a dict, shard i's at i."""
        return json.loads(self._shard_infos_json())

    def dim(self, table: str) -> int:
        if table not in self._dims:
            for info in self.list_tables():
                self._dims[info["config"]["name"]] = int(info["config"]["dim"])
        if table not in self._dims:
            raise KeyError(f"table '{table}' does not exist on the cluster")
        return self._dims[table]

    def lookup_rows(self, table: str, keys, read_only: bool = True):
        """Rows of `keys` (a 1-D uint64 or int64 array) as a [len(keys), dim]
        float32 array; read_only=False inserts missing rows."""
        return self._lookup_rows(table, keys, self.dim(table), read_only)

    def checkpoint(self, id: str = "", step: Optional[int] = None, incremental: bool = False,
                   timeout: float = 300.0) -> dict:
        """A cluster-wide checkpoint at one step (ember::Client::Checkpoint)."""
        options: Dict[str, Any] = {"id": id, "incremental": incremental, "timeout_s": timeout}
        if step is not None:
            options["step"] = step
        return json.loads(self._checkpoint_json(json.dumps(options)))


class Feature(NamedTuple):
    """One sparse feature of a pipeline: its name, its table, and how one
    example's rows are combined ("sum", "mean" or "sqrtn")."""

    name: str
    table: str
    combiner: str = "sum"


FeatureLike = Union[Feature, Sequence[str], Mapping[str, str]]


def _feature(spec: FeatureLike) -> tuple:
    if isinstance(spec, Mapping):
        spec = Feature(**spec)
    spec = Feature(*spec)
    if spec.combiner not in _COMBINERS:
        raise ValueError(f"feature '{spec.name}': combiner '{spec.combiner}'; "
                         f"expected one of {sorted(_COMBINERS)}")
    return (spec.name, spec.table, _COMBINERS[spec.combiner])


class StepMerger(_ember.StepMerger):
    """The pipelines of one process (one per GPU, or per framework replica)
    sending one request per shard per step between them (ember::StepMerger).

        merger = ember.StepMerger(client, ranks=4, worker_id=0)
        pipes = [ember.StepPipeline(client, features, merger=merger, rank=r)
                 for r in range(4)]

    Each step, every unique key of the node is fetched and pushed once; a
    key's gradients are summed over the ranks in rank order, so the result
    does not depend on which rank arrives first. The node is one SSP worker
    (worker_id); its pipelines take the merger's staleness, first step and
    early fetch. The ranks make the same calls (prefetch, wait, push, flush,
    close) in the same order, each rank from its own thread: a rank waits in
    its pipeline's background thread for the others, and one that waits
    longer than `timeout` seconds fails (DEADLINE_EXCEEDED naming the ranks
    missing). Keep the merger until its pipelines are closed.
    """

    def __init__(self, client: Client, ranks: int, *, worker_id: int = 0, staleness: int = 0,
                 first_step: int = 0, timeout: float = 60.0, early_fetch: bool = True):
        if ranks < 1:
            raise ValueError(f"StepMerger: ranks {ranks}; expected at least 1")
        super().__init__(client, ranks, worker_id, staleness, first_step, timeout, early_fetch)
        self.ranks = ranks
        self.worker_id = worker_id
        self.staleness = staleness
        self.first_step = first_step
        self.early_fetch = early_fetch


class Transport(_ember.Transport):
    """A rank's share of a node's all-to-all, for the node shuffle: the
    ranks of one node in several processes (one per GPU) trade keys, rows
    and gradients so that each unique key of the node is fetched and pushed
    once (ember::NodeShuffle).

        Transport(rank, size, all_to_all)   # all_to_all(list of `size`
                                            # bytes) -> `size` buffers
        Transport.in_process_group(size)    # threads of this process

    all_to_all runs on the pipeline's background thread (with the GIL), in
    the same order on every rank; block r goes to rank r and the r-th
    returned buffer is what rank r sent. An exception in it fails the
    pipeline (UNAVAILABLE, with its message). ember.torch.node_transport()
    builds one over torch.distributed. Keep it until its pipeline is closed.
    """


class StepPipeline(_ember.StepPipeline):
    """One trainer replica's embedding pipeline (ember::StepPipeline).

        pipe.prefetch(t + 1, batch)   # returns at once; the fetch runs behind
        rows = pipe.wait(t)           # [batch, dim] float32 per feature
        pipe.push(t, grads)           # d(rows) per feature; returns at once

    batch: per feature (a sequence in feature order, or a dict by name) a tuple
    (offsets, keys) or (offsets, keys, weights): offsets int64 [batch + 1],
    keys uint64 or int64, weights float32 (one per key). C-contiguous arrays
    are read in place; prefetch copies them before it returns.

    wait(step, out=None) returns new arrays, or fills `out` (one writable
    float32 buffer per feature) and returns it. push copies the gradients.

    staleness: the SSP bound s (>= 0 registers `worker_id` on every shard; a
    lookup for step t then sees every worker's pushes up to t - s - 1);
    negative: asynchronous. At staleness 0, early_fetch (the default) fetches
    step t + 1's rows while step t computes and brings them forward through
    push t with the shard's own optimizer code: the same rows, bit for bit,
    without waiting for a lookup after the push (docs/client.md). stats()
    counts steps_patched and steps_refetched. Steps are prefetched, waited
    and pushed in order, starting at first_step. Errors raise ember.EmberError; the first failure
    of background work is raised by the next wait, push or flush.

    merger / rank: this pipeline is rank `rank` of an ember.StepMerger
    (several replicas of one process); staleness, first_step and early_fetch
    are then the merger's, and worker_id only labels the pipeline.

    transport: this pipeline is its rank of an ember.Transport (the ranks
    of one node in several processes share their keys and rows: the node
    shuffle); every rank makes the same calls in the same order, close()
    included. node_one_worker (the default with a transport): the node is
    one SSP worker, `worker_id` the same on every rank, and each shard
    hears from one rank (one request per shard per node step); False: each
    rank is its own worker (its own worker_id) and talks to every shard.
    Early fetch is not used with a transport.
    """

    def __init__(self, client: Client, features: Sequence[FeatureLike], *,
                 staleness: Optional[int] = None, worker_id: int = 0, prefetch_depth: int = -1,
                 first_step: Optional[int] = None, early_fetch: Optional[bool] = None,
                 merger: Optional[StepMerger] = None, rank: int = 0,
                 transport: Optional[Transport] = None, node_one_worker: bool = True):
        if transport is not None and merger is not None:
            raise ValueError("StepPipeline: merger and transport; expected one of them "
                             "(a merger joins the replicas of one process, a transport "
                             "the processes of one node)")
        if merger is not None:
            for name, value, merged in (("staleness", staleness, merger.staleness),
                                        ("first_step", first_step, merger.first_step)):
                if value is not None and value != merged:
                    raise ValueError(f"StepPipeline: {name} {value}; a merged pipeline takes the "
                                     f"merger's ({merged})")
            if not 0 <= rank < merger.ranks:
                raise ValueError(f"StepPipeline: rank {rank}; expected 0 .. {merger.ranks - 1} "
                                 f"(the merger's ranks)")
            staleness, first_step = merger.staleness, merger.first_step
            early_fetch = merger.early_fetch
        super().__init__(client, worker_id, [_feature(f) for f in features],
                         0 if staleness is None else staleness, prefetch_depth,
                         0 if first_step is None else first_step,
                         True if early_fetch is None else early_fetch, merger, rank,
                         transport, transport is not None and node_one_worker)
        self.rank = transport.rank if transport is not None else rank
        self.transport = transport

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
