"""Ember: a sharded embedding parameter server, from Python.

    import ember
    client = ember.Client(["127.0.0.1:5000", "127.0.0.1:5001"])
    client.create_table("user", dim=8, optimizer={"adagrad": {"learning_rate": 0.05}})
    pipe = ember.StepPipeline(client, features=[("user_id", "user")], staleness=0)
    pipe.prefetch(0, [(offsets, keys)])      # returns at once
    rows = pipe.wait(0)                      # [batch, dim] float32 per feature
    pipe.push(0, [d_rows])                   # returns at once

Framework layers: ember.tf (TensorFlow 2 / Keras) and ember.torch (PyTorch)
are imported on first use (`import ember` then `ember.tf.EmbeddingLayer`
works, as does `import ember.tf`), so that this package needs neither.
"""

from ._errors import EmberError, StatusCode
from ._ember import pool_backward, pool_forward
from .client import Client, Feature, StepMerger, StepPipeline, Transport

__all__ = ["Client", "EmberError", "Feature", "StatusCode", "StepMerger", "StepPipeline",
           "Transport", "pool_backward", "pool_forward"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # ember.tf / ember.torch on first use: importing the package alone
    # must not import TensorFlow or PyTorch.
    if name in ("tf", "torch"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'ember' has no attribute '{name}'")
