#!/usr/bin/env python3
"""The critical path of synchronous (s = 0) merged steps with early fetch,
read from a trainer's Chrome trace (ember-trainer --trace=FILE, docs/
operations.md "The trainer's timeline").

At s = 0 step t + 1 cannot start before every rank's push of step t is
summed and step t + 1's rows are brought forward through it. From the last
rank's Push(t) to the last rank's Wait(t + 1), every node step, this splits
that time into the work on the path (the last rank's backward, the sums, the
optimizer update, the pooling of every rank's rows) and the time spent
waiting for a thread to run (the network thread woken by the push, the
trainers woken by their rows), and prints the medians and 90th percentiles
in microseconds.

  build/bench/ember-trainer --shards=... --pipelines=4 --staleness=0 \\
      --compute_ms=5 --modes=early --trace=/tmp/t.json
  python3 bench/critical_path.py /tmp/t.json

Only pipelines with early-fetched steps (an `Update` span) are read; the
first and last 20 steps are skipped (start-up, shutdown).
"""
import collections
import json
import statistics
import sys


def quantile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def main(path):
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    early = {e["pid"] for e in events if e["name"] == "Update"}
    if not early:
        sys.exit(f"{path}: no early-fetched steps (no Update span): run with --staleness=0 "
                 "and early fetch on")
    # spans[name][step][pid] = (start, end), in microseconds
    spans = collections.defaultdict(lambda: collections.defaultdict(dict))
    for e in events:
        if e["pid"] in early and "step" in e.get("args", {}):
            spans[e["name"]][e["args"]["step"]][e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    ranks = len(early)
    pushed = sorted(t for t, by in spans["Push"].items() if len(by) == ranks)
    parts = collections.defaultdict(list)
    for t in pushed[20:-20]:
        sums, update = spans["Sum"].get(t), spans["Update"].get(t + 1)
        patched, waited = spans["Patch"].get(t + 1, {}), spans["Wait"].get(t + 1, {})
        pools = spans["Pool"].get(t + 1, {})
        if not sums or not update or len(patched) < ranks or len(waited) < ranks:
            continue  # not a merged round with a patch (e.g. refetched)
        (leader, (sum_start, sum_end)), = sums.items()
        backward = spans["Backward"].get(t, {}).get(leader)
        if backward is None:
            continue
        last_push = max(end for _, end in spans["Push"][t].values())
        update_start, update_end = update[leader]
        last_pooled = max(end for _, end in patched.values())
        last_rows = max(end for _, end in waited.values())
        parts["push skew (first to last Push)"].append(
            last_push - min(end for _, end in spans["Push"][t].values()))
        parts["1 last Push -> leader's Backward starts (wake-up)"].append(backward[0] - last_push)
        parts["2 Backward (work)"].append(backward[1] - backward[0])
        parts["3 Backward end -> Sum starts (merge)"].append(sum_start - backward[1])
        parts["4 Sum (work)"].append(sum_end - sum_start)
        parts["5 Update (work)"].append(update_end - update_start)
        parts["6 Update end -> every rank pooled (delivery)"].append(last_pooled - update_end)
        parts["  of which pooling, all ranks (work)"].append(
            sum(end - start for start, end in pools.values()))
        parts["7 last rank pooled -> last Wait returns (wake-up)"].append(last_rows - last_pooled)
        parts["last Push -> last Wait returns"].append(last_rows - last_push)
        parts["work on the path (2 + 4 + 5 + pooling)"].append(
            (backward[1] - backward[0]) + (sum_end - sum_start) + (update_end - update_start) +
            sum(end - start for start, end in pools.values()))
    if not parts:
        sys.exit(f"{path}: no merged early-fetched rounds found")
    n = len(parts["last Push -> last Wait returns"])
    print(f"# {path}: {ranks} merged pipelines, {n} node steps; microseconds")
    print("| segment | p50 | p90 | mean |")
    print("| --- | --- | --- | --- |")
    for name, values in parts.items():
        print(f"| {name} | {quantile(values, 0.5):.0f} | {quantile(values, 0.9):.0f} | "
              f"{statistics.mean(values):.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
