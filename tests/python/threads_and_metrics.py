"""Helpers the Python suites share: ranks on threads, and a shard's own
request counters from its /metrics page."""

import re
import threading
import urllib.request


def run_threads(fn, count, timeout=120.0):
    """fn(i) for i in range(count), each on its own thread; raises the first
    failure, or an AssertionError naming a thread still running after
    `timeout` seconds."""
    errors = []

    def run(i):
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), f"a thread did not finish within {timeout} s"
    if errors:
        raise errors[0]


def exchange_requests(addresses):
    """Exchange calls each shard answered (its own ember_rpc_requests_total)."""
    total = []
    for address in addresses:
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
        total.append(sum(float(m.group(1)) for m in re.finditer(
            r'^ember_rpc_requests_total\{[^}]*rpc="Exchange[^"]*"[^}]*\} (\S+)$', text,
            re.MULTILINE)))
    return total
