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
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from . import _ember  # noqa: F401  (loads libember_c.so before the ops)
from . import _tf_ops
from .client import Client, StepPipeline

_ops = _tf_ops.load()


@tf.RegisterGradient("EmberLookup")
def _lookup_gradient(op, *grads):
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g, tf.float32)
             for g, out in zip(grads, op.outputs)]
    anchor_grad = _ops.ember_push(step=op.inputs[0], grads=grads,
                                  pipeline=op.get_attr("pipeline"))
    return [None, anchor_grad]


@tf.RegisterGradient("EmberLookupPacked")
def _lookup_packed_gradient(op, grad):
    grad = tf.zeros_like(op.outputs[0]) if grad is None else tf.convert_to_tensor(grad, tf.float32)
    return [None, _ops.ember_push_packed(step=op.inputs[0], grad=grad,
                                         pipeline=op.get_attr("pipeline"))]


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
    """

    def __init__(self, client: Client, features: Sequence, *, tables: Sequence[Mapping] = (),
                 staleness: int = 0, worker_id: int = 0, prefetch_depth: int = -1,
                 first_step: int = 0, weighted: bool = False, early_fetch: bool = True,
                 packed: bool = False, **kwargs):
        super().__init__(**kwargs)
        for t in tables:
            client.create_table(**t)
        self._pipe = StepPipeline(client, features, staleness=staleness, worker_id=worker_id,
                                  prefetch_depth=prefetch_depth, first_step=first_step,
                                  early_fetch=early_fetch)
        self._names: List[str] = list(self._pipe.feature_names)
        self._dims: List[int] = list(self._pipe.dims)
        self._handle = self._pipe._handle
        self._first_step = first_step
        self._weighted = weighted
        self._packed = packed
        self._anchor = self.add_weight(name="ember_anchor", shape=(0,), initializer="zeros",
                                       trainable=True)
        # The step of the next call on features (the mode without prefetch).
        self._inline_step = self.add_weight(name="ember_step", shape=(), dtype="int64",
                                            initializer="zeros", trainable=False)
        self._inline_step.assign(first_step)

    @property
    def anchor(self):
        """The layer's only weight, empty: ask the tape for its gradient
        (tape.gradient(loss, [..., layer.anchor])) and the push runs; applying
        that gradient is optional (Keras' fit does, on no elements)."""
        return self._anchor

    @property
    def pipeline(self) -> StepPipeline:
        return self._pipe

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
                    weights: Optional[Mapping[str, Any]] = None):
        """The EmberPrefetch op for one batch (features: {name: ragged or
        sparse ids}); returns `step` once the fetch is queued. It waits while
        the step is more than the prefetch depth ahead of the last push."""
        offsets, keys, ws = [], [], []
        for name in self._names:
            o, k, w = _csr(features[name], None if weights is None else weights.get(name))
            offsets.append(o)
            keys.append(k)
            if self._weighted:
                ws.append(w if w is not None else tf.ones_like(k, dtype=tf.float32))
        return _ops.ember_prefetch(step=tf.cast(step, tf.int64), offsets=offsets, keys=keys,
                                   weights=ws, pipeline=self._handle)

    def prefetch(self, dataset: tf.data.Dataset,
                 features: Callable[..., Mapping[str, Any]],
                 weights: Optional[Callable[..., Mapping[str, Any]]] = None,
                 then: Optional[Callable[..., Any]] = None,
                 step_per_example: bool = False) -> tf.data.Dataset:
        """dataset of elements e -> dataset of (step, then(*e)) (default: (step,
        e)), where the rows of step's batch `features(*e)` are being fetched
        by then. The map runs in order (no parallel calls) so that steps are
        prefetched in order. `then` lets the ids stay out of the training
        step, which needs only the step (e.g. then=lambda x, y: y): passing
        17 ragged features into a tf.function costs more than Ember's fetch.
        step_per_example: the step as a [batch] vector (Keras' fit wants a
        batch dimension on its inputs) instead of a scalar."""

        def fetch(step, element):
            args = element if isinstance(element, tuple) else (element,)
            ids = features(*args)
            w = None if weights is None else weights(*args)
            rest = element if then is None else then(*args)
            step = self.prefetch_op(step, ids, w)
            if step_per_example:
                first = ids[self._names[0]]
                batch = (tf.shape(first, out_type=tf.int64)[0] if isinstance(first, tf.SparseTensor)
                         else first.nrows())
                step = tf.fill([batch], step)
            return step, rest

        return dataset.enumerate(start=self._first_step).map(fetch)

    def call(self, inputs):
        if isinstance(inputs, Mapping):
            # No input pipeline: prefetch and wait in this step.
            step = self._inline_step.assign_add(1) - 1
            step = self.prefetch_op(step, inputs)
        else:
            step = tf.reshape(tf.cast(inputs, tf.int64), [-1])[0]
        if self._packed:
            return _ops.ember_lookup_packed(step=step, anchor=self._anchor, pipeline=self._handle,
                                            total_dim=sum(self._dims))
        pooled = _ops.ember_lookup(step=step, anchor=self._anchor, pipeline=self._handle,
                                   dims=self._dims, N=len(self._dims))
        return dict(zip(self._names, pooled))

    def compute_output_spec(self, inputs):  # Keras 3 functional models
        import keras
        if self._packed:
            return keras.KerasTensor((None, sum(self._dims)), dtype="float32")
        return {n: keras.KerasTensor((None, d), dtype="float32")
                for n, d in zip(self._names, self._dims)}

    def flush(self) -> None:
        """Blocks until every push so far is applied on the shards."""
        self._pipe.flush()

    def close(self) -> None:
        self._pipe.close()
