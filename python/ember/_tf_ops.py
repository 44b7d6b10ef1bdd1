"""The TensorFlow op library of ember.tf, for the TensorFlow in this process.

A TensorFlow op library is tied to the TensorFlow it was compiled against
(its kernel API passes TensorFlow's own Abseil types, whose namespace
changes between releases). The package carries the op library's source;
`load()` uses the library built with the package when it was built for this
TensorFlow (a build in an environment with TensorFlow), and otherwise
compiles one with TensorFlow's own flags (`tf.sysconfig`) into a cache
directory, once per TensorFlow version: $EMBER_CACHE_DIR, else
$XDG_CACHE_HOME/ember, else ~/.cache/ember. That takes a C++17 compiler
(`c++`, or $CXX) and about 20 s, the first time only.
"""

import fcntl
import hashlib
import os
import shlex
import subprocess
import sys

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "tf_ops", "ember_ops.cc")
_MAP = os.path.join(_HERE, "tf_ops", "tf_ops.map")
_INCLUDE = os.path.join(_HERE, "include")
_BUILT = os.path.join(_HERE, "_ember_tf_ops.so")
_BUILT_FOR = os.path.join(_HERE, "_ember_tf_ops.tf_version")


def _cache_dir() -> str:
    root = os.environ.get("EMBER_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "ember")
    return root


def _built_with_package() -> bool:
    try:
        with open(_BUILT_FOR) as f:
            return os.path.exists(_BUILT) and f.read().strip() == tf.__version__
    except OSError:
        return False


def _compile(target: str) -> None:
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    command = (cxx + ["-std=c++17", "-O2", "-fPIC", "-shared", "-w"]
               + tf.sysconfig.get_compile_flags() + ["-I" + _INCLUDE, _SOURCE, "-o", target + ".tmp"]
               + tf.sysconfig.get_link_flags() + ["-Wl,--version-script=" + _MAP, "-ldl"])
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise RuntimeError(
            f"ember.tf: no op library for TensorFlow {tf.__version__} and no C++ compiler to "
            f"build one ({cxx[0]}: {e}); install g++ or set CXX") from e
    if done.returncode != 0:
        raise RuntimeError(f"ember.tf: building the op library for TensorFlow {tf.__version__} "
                           f"failed:\n{shlex.join(command)}\n{done.stderr[-4000:]}")
    os.replace(target + ".tmp", target)


def library_path() -> str:
    """The op library for this TensorFlow, built first if need be."""
    if _built_with_package():
        return _BUILT
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + tf.__version__.encode()).hexdigest()[:16]
    directory = os.path.join(_cache_dir(), f"tf-{tf.__version__}-{digest}")
    target = os.path.join(directory, "_ember_tf_ops.so")
    if os.path.exists(target):
        return target
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
        if not os.path.exists(target):
            print(f"ember.tf: building the op library for TensorFlow {tf.__version__} "
                  f"into {directory}", file=sys.stderr)
            _compile(target)
    return target


def load():
    return tf.load_op_library(library_path())
