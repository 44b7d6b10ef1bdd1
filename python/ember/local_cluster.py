"""A local Ember cluster: ember-server processes on 127.0.0.1, for tests,
examples and notebooks.

    with ember.local_cluster.LocalCluster(shards=2) as cluster:
        client = ember.Client(cluster.addresses)

Each shard starts with --port=0 and reports "EMBER_READY port=N" on stdout;
start-up is bounded, and every process is killed when the cluster stops.
The binary: $EMBER_SERVER_BIN, else build/server/ember-server of the source
tree this package was built in, else `ember-server` on PATH.
"""

import os
import re
import select
import shutil
import subprocess
import time

READY = re.compile(r"EMBER_READY port=(\d+)(?: metrics_port=(-?\d+))?")


def server_binary() -> str:
    path = os.environ.get("EMBER_SERVER_BIN")
    if not path:
        # build/python/ember/local_cluster.py -> build/server/ember-server
        build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.path.join(build, "server", "ember-server")
        if not os.access(path, os.X_OK):
            path = shutil.which("ember-server") or path
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"ember-server not found at {path}; build it or set EMBER_SERVER_BIN")
    return path


class LocalCluster:
    """`shards` ember-server processes, shard i of `shards`; `pids` for
    measuring their CPU."""

    def __init__(self, shards: int = 2, extra_args=(), timeout: float = 30.0):
        self.procs = []
        self.addresses = []
        # "127.0.0.1:port" of each shard's /metrics, with
        # extra_args=["--metrics_port=0"]; None per shard without metrics.
        self.metrics_addresses = []
        try:
            for i in range(shards):
                self._start(i, shards, list(extra_args), timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, index, count, extra_args, timeout):
        proc = subprocess.Popen(
            [server_binary(), "--address=127.0.0.1", "--port=0", f"--shard_index={index}",
             f"--shard_count={count}", "--worker_threads=2", *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                match = READY.search(line)
                if match:
                    self.addresses.append(f"127.0.0.1:{match.group(1)}")
                    metrics = int(match.group(2) or -1)
                    self.metrics_addresses.append(f"127.0.0.1:{metrics}" if metrics > 0 else None)
                    return
            if proc.poll() is not None:
                break
        raise RuntimeError(f"shard {index} did not report ready within {timeout} s "
                           f"(exit code {proc.poll()})")

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
