"""Real ember-server processes on 127.0.0.1 for the Python tests.

Each shard starts with --port=0 and reports "EMBER_READY port=N" on stdout;
start-up is bounded, and every process is killed when the cluster stops.
"""

import os
import re
import select
import subprocess
import time

READY = re.compile(r"EMBER_READY port=(\d+)")


def server_binary() -> str:
    path = os.environ.get("EMBER_SERVER_BIN")
    if not path:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.path.join(root, "build", "server", "ember-server")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"ember-server not found at {path}; build it or set EMBER_SERVER_BIN")
    return path


class Cluster:
    """`shards` ember-server processes, shard i of `shards`."""

    def __init__(self, shards: int = 2, extra_args=(), timeout: float = 30.0):
        self.procs = []
        self.addresses = []
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
                    return
            if proc.poll() is not None:
                break
        raise RuntimeError(f"shard {index} did not report ready within {timeout} s "
                           f"(exit code {proc.poll()})")

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
