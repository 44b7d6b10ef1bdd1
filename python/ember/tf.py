"""Ember in TensorFlow 2: a Keras layer over custom ops.

    layer = ember.tf.EmbeddingLayer(client, features=[("user_id", "user")])
    dataset = layer.prefetch(dataset, lambda x, y: x["sparse"])   # a tf.data map
    for step, (x, y) in dataset:            # step: this batch's Ember step
        with tf.GradientTape() as tape:
            pooled = layer(step)            # {"user_id": [batch, dim]}
            loss = ...
        grads = tape.gradient(loss, model.trainable_variables)  # pushes

The forward op (EmberLookup) waits for the step's rows, which the input
pipeline's map (EmberPrefetch) started fetching when it produced the batch;
its registered gradient (EmberPush) pushes d(pooled) to the shards, where the
tables' optimizers apply it. All three are C++ ops: nothing in the step runs
Python. The layer's only weight is an empty "anchor" variable, through which
the gradient reaches the push (apply it with any optimizer; it has no
elements).

Sparse inputs: per feature a tf.RaggedTensor [batch, (ids)] or a
tf.SparseTensor [batch, max_ids] of int64 ids (uint64 ids as their int64
bits), optionally with per-id float32 weights of the same shape.
Without `prefetch`, the layer can be called on the features themselves
({name: ragged}): it then prefetches and waits in the same step.

Several replicas (tf.distribute): a layer created in the scope of a
MirroredStrategy (or MultiWorkerMirroredStrategy) over N local devices keeps
one pipeline per replica, merged through one ember.StepMerger: the node sends
one request per shard per step, each unique key of its N batches fetched and
pushed once, and a key's gradients are summed in replica order
(deterministic). Each replica's call uses its own pipeline. Input:

    def dataset_fn(ctx):                        # per-replica batches
        return layer.prefetch(make_dataset(ctx), features, then=labels)
    dist = strategy.distribute_datasets_from_function(dataset_fn)

or, with global batches split by TF (experimental_distribute_dataset,
Keras' fit under the strategy):

    ds = layer.prefetch(global_ds, features, then=..., global_batches=True)
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from . import _ember  # noqa: F401  (loads libember_c.so before the ops)
from . import _tf_ops
from .client import Client, StepMerger, StepPipeline

_ops = _tf_ops.load()


@tf.RegisterGradient("EmberLookup")
def _lookup_gradient(op, *grads):
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g, tf.float32)
             for g, out in zip(grads, op.outputs)]
    anchor_grad = _ops.ember_push(step=op.inputs[0], grads=grads, order=op.inputs[2],
                                  pipeline=op.get_attr("pipeline"))
    return [None, anchor_grad, None]


@tf.RegisterGradient("EmberLookupPacked")
def _lookup_packed_gradient(op, grad):
    grad = tf.zeros_like(op.outputs[0]) if grad is None else tf.convert_to_tensor(grad, tf.float32)
    return [None, _ops.ember_push_packed(step=op.inputs[0], grad=grad, order=op.inputs[2],
                                         pipeline=op.get_attr("pipeline")), None]


def _csr(ids, weights=None):
    """(offsets int64 [batch + 1], keys int64, weights float32 or None) of one
    feature given as RaggedTensor or SparseTensor."""
    if isinstance(ids, tf.SparseTensor):
        batch = tf.shape(ids, out_type=tf.int64)[0]
        counts = tf.math.bincount(ids.indices[:, 0], minlength=batch, maxlength=batch,
                                  dtype=tf.int64)
        offsets = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(counts)], 0)
        values = ids.values
        w = None if weights is None else weights.values
    elif isinstance(ids, tf.RaggedTensor):
        offsets = ids.row_splits
        values = ids.values
        w = None if weights is None else weights.values
    else:
        raise TypeError(f"expected a tf.RaggedTensor or tf.SparseTensor of ids, received {type(ids)}")
    offsets = tf.cast(offsets, tf.int64)
    values = tf.cast(values, tf.int64)
    return offsets, values, None if w is None else tf.cast(w, tf.float32)


def _rows(ids, start, size):
    """Examples [start, start + size) of one feature (ragged or sparse)."""
    if isinstance(ids, tf.SparseTensor):
        width = tf.shape(ids, out_type=tf.int64)[1]
        part = tf.sparse.slice(ids, tf.stack([start, tf.zeros([], tf.int64)]),
                               tf.stack([size, width]))
        return part
    return ids[start:start + size]


def _batch_size(ids):
    if isinstance(ids, tf.SparseTensor):
        return tf.shape(ids, out_type=tf.int64)[0]
    return tf.cast(ids.nrows(), tf.int64)


# The strategies whose replicas share the memory of one process (one worker
# per host): the layer merges their replicas.
_SUPPORTED = ("MirroredStrategy", "OneDeviceStrategy", "MultiWorkerMirroredStrategy",
              "the default strategy (none)")


def _local_replicas(strategy) -> int:
    """Replicas of this process under `strategy`; a clear error for those
    the layer does not serve."""
    name = type(strategy).__name__
    if not tf.distribute.has_strategy() or name.startswith("_Default"):
        return 1
    if name.startswith("OneDeviceStrategy"):
        return 1
    if name.startswith("MirroredStrategy") or name.startswith("CollectiveAllReduceStrategy") \
            or name.startswith("MultiWorkerMirroredStrategy"):
        return len(strategy.extended.worker_devices)
    raise ValueError(f"ember.tf.EmbeddingLayer: strategy {name} is not supported; expected one "
                     f"of {', '.join(_SUPPORTED)}")


class EmbeddingLayer(tf.keras.layers.Layer):
    """Pooled embeddings of sparse features whose tables live on Ember.

    client: an ember.Client; features: (name, table[, combiner]) per feature
    (ember.Feature); tables: optional table definitions to create first, each
    a dict of Client.create_table's arguments. staleness / worker_id /
    prefetch_depth / first_step / early_fetch: the pipeline's
    (ember.StepPipeline; early_fetch brings the next step's rows forward
    exactly at staleness 0).
    Outputs {feature name: [batch, dim] float32}; with packed=True one
    [batch, sum of dims] float32 tensor instead, the features side by side
    in the order given (TorchRec's KeyedTensor layout): one output and one
    gradient for all features, cheaper when the model concatenates them
    anyway (layer.offsets gives each feature's first column).

    Under a tf.distribute strategy (created in its scope), one pipeline per
    local replica merged through one ember.StepMerger (the node is SSP
    worker `worker_id`; under MultiWorkerMirroredStrategy it defaults to the
    task id). replicas: overrides the count the strategy gives (1 turns
    merging off). Steps carry on across epochs and iterators: each pipeline
    counts its own, starting at first_step. Close the layer at the end
    (close()): it flushes every replica's last push.
    """

    def __init__(self, client: Client, features: Sequence, *, tables: Sequence[Mapping] = (),
                 staleness: int = 0, worker_id: Optional[int] = None, prefetch_depth: int = -1,
                 first_step: int = 0, weighted: bool = False, early_fetch: bool = True,
                 packed: bool = False, replicas: Optional[int] = None,
                 merge_timeout: float = 60.0, **kwargs):
        super().__init__(**kwargs)
        strategy = tf.distribute.get_strategy()
        self._strategy = strategy
        if replicas is None:
            replicas = _local_replicas(strategy)
        if replicas < 1:
            raise ValueError(f"ember.tf.EmbeddingLayer: replicas {replicas}; expected at least 1")
        if worker_id is None:
            resolver = getattr(strategy, "cluster_resolver", None)
            worker_id = int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0
        for t in tables:
            client.create_table(**t)
        self._merger: Optional[StepMerger] = None
        if replicas > 1:
            self._merger = StepMerger(client, replicas, worker_id=worker_id, staleness=staleness,
                                      first_step=first_step, timeout=merge_timeout,
                                      early_fetch=early_fetch)
            self._pipes = [StepPipeline(client, features, worker_id=worker_id,
                                        prefetch_depth=prefetch_depth, merger=self._merger,
                                        rank=r) for r in range(replicas)]
        else:
            self._pipes = [StepPipeline(client, features, staleness=staleness,
                                        worker_id=worker_id, prefetch_depth=prefetch_depth,
                                        first_step=first_step, early_fetch=early_fetch)]
        self._pipe = self._pipes[0]
        self._names: List[str] = list(self._pipe.feature_names)
        self._dims: List[int] = list(self._pipe.dims)
        self._handles = [p._handle for p in self._pipes]
        self._weighted = weighted
        self._packed = packed
        self._anchor = self.add_weight(name="ember_anchor", shape=(0,), initializer="zeros",
                                       trainable=True)

    @property
    def anchor(self):
        """The layer's only weight, empty: ask the tape for its gradient
        (tape.gradient(loss, [..., layer.anchor])) and the push runs; applying
        that gradient is optional (Keras' fit does, on no elements)."""
        return self._anchor

    @property
    def replicas(self) -> int:
        return len(self._pipes)

    @property
    def pipeline(self) -> StepPipeline:
        """Replica 0's pipeline (the only one without a strategy)."""
        return self._pipe

    @property
    def pipelines(self) -> List[StepPipeline]:
        """One per local replica, in replica order."""
        return list(self._pipes)

    @property
    def merger(self) -> Optional[StepMerger]:
        """The merger of the replicas' pipelines; None with one replica."""
        return self._merger

    @property
    def feature_names(self) -> List[str]:
        return self._names

    @property
    def offsets(self) -> List[int]:
        """Feature f's columns in the packed output: [offsets[f], offsets[f + 1])."""
        out = [0]
        for d in self._dims:
            out.append(out[-1] + d)
        return out

    def prefetch_op(self, step, features: Mapping[str, Any],
                    weights: Optional[Mapping[str, Any]] = None, replica: int = 0):
        """The EmberPrefetch op for one batch of replica `replica` (features:
        {name: ragged or sparse ids}): stages the batch on the replica's
        pipeline and returns its ticket, which the layer's call takes as
        the step. The batch's rows are fetched as soon as training reaches
        it and the prefetch depth allows. `step` is ignored (the pipeline
        counts its steps)."""
        if not 0 <= replica < len(self._pipes):
            raise ValueError(f"prefetch_op: replica {replica}; expected 0 .. {len(self._pipes) - 1}")
        missing = [n for n in self._names if n not in features]
        if missing:
            raise KeyError(f"prefetch: features {missing} missing; expected {self._names}, "
                           f"received {sorted(features)}")
        offsets, keys, ws = [], [], []
        for name in self._names:
            o, k, w = _csr(features[name], None if weights is None else weights.get(name))
            offsets.append(o)
            keys.append(k)
            if self._weighted:
                ws.append(w if w is not None else tf.ones_like(k, dtype=tf.float32))
        return _ops.ember_prefetch(step=tf.cast(step, tf.int64), offsets=offsets, keys=keys,
                                   weights=ws, pipeline=self._handles[replica])

    def prefetch(self, dataset: tf.data.Dataset,
                 features: Callable[..., Mapping[str, Any]],
                 weights: Optional[Callable[..., Mapping[str, Any]]] = None,
                 then: Optional[Callable[..., Any]] = None,
                 step_per_example: bool = False,
                 global_batches: bool = False) -> tf.data.Dataset:
        """dataset of elements e -> dataset of (step, then(*e)) (default: (step,
        e)), where `step` is the ticket of the batch `features(*e)`, staged
        on the pipeline: its rows are fetched while the steps before it
        train. The map runs in order (no parallel calls) so that batches are
        staged in order. `then` lets the ids stay out of the training
        step, which needs only the step (e.g. then=lambda x, y: y): passing
        17 ragged features into a tf.function costs more than Ember's fetch.
        step_per_example: the step as a [batch] vector (Keras' fit wants a
        batch dimension on its inputs) instead of a scalar.

        Steps continue across passes: iterate the result as often as you
        like (epochs, a new iterator each). Train the elements you draw in
        order; an element drawn and never trained (Keras draws one before
        fit, an iterator dropped at an epoch's end) is skipped, unless its
        rows were already fetched (it was within the prefetch depth of a
        trained step): the next lookup then fails naming it.

        With several replicas: by default the elements are per-replica
        batches, dealt to replicas in turn (element i to replica i mod N, as
        strategy.distribute_datasets_from_function does); the number of
        elements per pass must then be a multiple of N. global_batches=True:
        each element is a global batch that TF splits into N equal
        consecutive parts, one per replica (experimental_distribute_dataset,
        Keras' fit under the strategy); the batch must be a multiple of N and
        the step comes per example."""
        replicas = len(self._pipes)

        def ids_of(args):
            ids = features(*args)
            return ids, None if weights is None else weights(*args)

        def steps(step, ids):
            if not step_per_example:
                return step
            return tf.fill([_batch_size(ids[self._names[0]])], step)

        # Each function takes (index, element): dataset.enumerate() keeps
        # the element whole (a plain map would unpack a tuple into arguments).
        def fetch(index, element):
            args = element if isinstance(element, tuple) else (element,)
            ids, w = ids_of(args)
            rest = element if then is None else then(*args)
            return steps(self.prefetch_op(-1, ids, w), ids), rest

        def fetch_dealt(index, element):
            args = element if isinstance(element, tuple) else (element,)
            ids, w = ids_of(args)
            rest = element if then is None else then(*args)
            branches = [(lambda r=r: self.prefetch_op(-1, ids, w, replica=r))
                        for r in range(replicas)]
            step = tf.switch_case(tf.cast(index % replicas, tf.int32), branches)
            return steps(step, ids), rest

        def fetch_global(index, element):
            args = element if isinstance(element, tuple) else (element,)
            ids, w = ids_of(args)
            rest = element if then is None else then(*args)
            batch = _batch_size(ids[self._names[0]])
            part = batch // replicas
            check = tf.debugging.assert_equal(
                batch % replicas, tf.zeros([], tf.int64),
                message=f"ember prefetch(global_batches=True): the global batch must be a "
                        f"multiple of the {replicas} replicas")
            with tf.control_dependencies([check]):
                step = tf.zeros([], tf.int64)
                for r in range(replicas):
                    part_ids = {n: _rows(ids[n], r * part, part) for n in self._names}
                    part_w = None if w is None else {n: _rows(w[n], r * part, part) for n in w}
                    with tf.control_dependencies([step]):
                        step = self.prefetch_op(-1, part_ids, part_w, replica=r)
            return tf.fill([batch], step), rest

        if replicas == 1:
            return dataset.enumerate().map(fetch)
        if global_batches:
            if not step_per_example:
                raise ValueError("prefetch(global_batches=True): TF splits each element along "
                                 "its batch dimension, so the step must come per example "
                                 "(step_per_example=True)")
            return dataset.enumerate().map(fetch_global)
        return dataset.enumerate().map(fetch_dealt)

    def _replica(self) -> int:
        """This call's local replica (its pipeline's index)."""
        if len(self._pipes) == 1:
            return 0
        ctx = tf.distribute.get_replica_context()
        replica_id = None
        if ctx is not None and ctx.strategy is self._strategy:
            # MirroredStrategy keeps the id as a Python int; the public
            # property makes a constant in the graph of the replica's
            # function, which a nested function (Keras' steps_per_execution
            # loop) would capture without a value.
            replica_id = getattr(ctx, "_replica_id_in_sync_group", None)
            if not isinstance(replica_id, int):
                replica_id = tf.get_static_value(ctx.replica_id_in_sync_group)
        if replica_id is None:
            raise ValueError(f"ember.tf.EmbeddingLayer with {len(self._pipes)} replicas: call it "
                             f"inside strategy.run of the strategy it was made under (or Keras' "
                             f"fit) so each replica uses its own pipeline; received a call "
                             f"outside its replicas")
        return int(replica_id) % len(self._pipes)

    def call(self, inputs):
        if _in_keras_symbolic_build():
            # Keras tracing the model for its output shapes (fit's first
            # call builds an unbuilt model in a scratch graph, outside the
            # replicas): shapes only, no Ember op.
            return self._symbolic_outputs(inputs)
        replica = self._replica()
        handle = self._handles[replica]
        if isinstance(inputs, Mapping):
            # No input pipeline: stage the batch and wait for it in this step.
            step = self.prefetch_op(-1, inputs, replica=replica)
        else:
            step = tf.reshape(tf.cast(inputs, tf.int64), [-1])[0]
        # The anchor's handle (this replica's copy) orders the lookup and
        # its push after this replica's ops only (python/tf_ops/ember_ops.cc).
        order = self._anchor.handle
        if self._packed:
            return _ops.ember_lookup_packed(step=step, anchor=self._anchor, order=order,
                                            pipeline=handle, total_dim=sum(self._dims))
        pooled = _ops.ember_lookup(step=step, anchor=self._anchor, order=order, pipeline=handle,
                                   dims=self._dims, N=len(self._dims))
        return dict(zip(self._names, pooled))

    def _symbolic_outputs(self, inputs):
        if isinstance(inputs, Mapping):
            batch = _batch_size(inputs[self._names[0]])
        else:
            batch = tf.shape(tf.reshape(inputs, [-1]), out_type=tf.int64)[0]
        if self._packed:
            return tf.zeros(tf.stack([batch, sum(self._dims)]), tf.float32)
        return {n: tf.zeros(tf.stack([batch, tf.constant(d, tf.int64)]), tf.float32)
                for n, d in zip(self._names, self._dims)}

    def compute_output_spec(self, inputs):  # Keras 3 functional models
        import keras
        if self._packed:
            return keras.KerasTensor((None, sum(self._dims)), dtype="float32")
        return {n: keras.KerasTensor((None, d), dtype="float32")
                for n, d in zip(self._names, self._dims)}

    def flush(self) -> None:
        """Blocks until every push so far is applied on the shards."""
        if self._merger is None:
            self._pipe.flush()
            return
        _on_threads([p.flush for p in self._pipes])

    def close(self) -> None:
        """Flushes and closes every pipeline. With several replicas the
        merger goes too (its SSP worker is unregistered): the layer serves
        no further step."""
        if self._merger is None:
            self._pipe.close()
            return
        if self._pipes:
            _on_threads([p.close for p in self._pipes])
        # The pipelines keep the merger alive; dropping both frees it.
        self._pipes, self._pipe, self._merger = [], None, None


def _in_keras_symbolic_build() -> bool:
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope
    except ImportError:  # Keras 2 (tf-keras) has no symbolic build
        return False
    return in_symbolic_scope()


def _on_threads(calls) -> None:
    """Runs a merged node's per-rank calls (flush, close) together: every
    rank must arrive for any of them to return."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        for f in [pool.submit(c) for c in calls]:
            f.result()
