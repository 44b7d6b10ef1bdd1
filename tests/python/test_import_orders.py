"""TensorFlow, PyTorch and ember imported in every order, each order in a
process of its own (import_order_child.py), training 10 steps in each
framework against two ember-server processes. TensorFlow exports its own
protobuf, Abseil and BoringSSL into the process's global scope; an ember
that imported any of them from there crashed in its first gRPC call when
tensorflow came first (TF 2.21). ctest runs this file with the pinned wheels
(python_import_orders) and with the newest (python_import_orders_newest)."""

import importlib.util
import itertools
import os
import subprocess
import sys

import pytest

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "import_order_child.py")
FRAMEWORKS = [m for m in ("tensorflow", "torch") if importlib.util.find_spec(m) is not None]

if not FRAMEWORKS:
    pytest.skip("neither TensorFlow nor PyTorch is installed in this environment",
                allow_module_level=True)


@pytest.mark.parametrize("order", [",".join(p) for p in
                                   itertools.permutations(FRAMEWORKS + ["ember"])])
def test_every_import_order_trains_in_each_framework(order):
    done = subprocess.run([sys.executable, CHILD, order], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (
        f"order {order}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    trained = [m for m in order.split(",") if m != "ember"]
    assert f"trained {' '.join(trained)}" in done.stdout


def test_versions_are_reported():
    """Names the wheels this run used, so a log says what was tested."""
    versions = {}
    for name in FRAMEWORKS:
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}; print({name}.__version__)"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 0, done.stderr[-2000:]
        versions[name] = done.stdout.strip().splitlines()[-1]
    print("wheels:", versions)
    assert all(versions.values())


def test_import_ember_alone_then_the_framework_layers_load_on_first_use():
    """The README's snippets: `import ember`, then ember.torch / ember.tf
    without importing them; importing the package alone loads no framework."""
    code = ("import sys, ember\n"
            "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules\n"
            + "".join(f"ember.{layer}.{cls}\n" for layer, cls, module in
                      (("torch", "EmbeddingBagCollection", "torch"),
                       ("tf", "EmbeddingLayer", "tensorflow")) if module in FRAMEWORKS)
            + "print('loaded')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]
    bad = subprocess.run([sys.executable, "-c", "import ember; ember.nothing"],
                         capture_output=True, text=True, timeout=60)
    assert "module 'ember' has no attribute 'nothing'" in bad.stderr
