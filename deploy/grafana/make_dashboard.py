#!/usr/bin/env python3
"""Writes deploy/grafana/ember-dashboard.json (Grafana dashboard, schema 36):
shards (job "ember") and trainers (job "ember-trainer").

The dashboard is generated so that its panels stay uniform; edit the PANELS
list and run this script. Every metric a panel queries is checked against a
live shard or trainer by tests/server/metrics_integration_test.cc.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}

# (title, unit, [(expr, legend)])
PANELS = [
    ("Keys per second by table and RPC", "ops",
     [("sum by (table, rpc) (rate(ember_table_keys_total[1m]))", "{{table}} {{rpc}}")]),
    ("RPCs per second by method and code", "reqps",
     [("sum by (rpc, code) (rate(ember_rpc_requests_total[1m]))", "{{rpc}} {{code}}")]),
    ("Latency p50 / p99 by method", "s",
     [("histogram_quantile(0.5, sum by (rpc, le) (rate(ember_rpc_duration_seconds_bucket[5m])))",
       "p50 {{rpc}}"),
      ("histogram_quantile(0.99, sum by (rpc, le) (rate(ember_rpc_duration_seconds_bucket[5m])))",
       "p99 {{rpc}}")]),
    ("Errors per second by table, RPC and code", "reqps",
     [("sum by (table, rpc, code) (rate(ember_table_errors_total[5m]))",
       "{{table}} {{rpc}} {{code}}")]),
    ("Table fill (rows / capacity)", "percentunit",
     [("sum by (table) (ember_table_rows) / sum by (table) (ember_table_capacity_rows > 0)",
       "{{table}}")]),
    ("Rows per table", "short",
     [("sum by (table, device) (ember_table_rows)", "{{table}} {{device}}")]),
    ("Evictions per second by table", "ops",
     [("sum by (table) (rate(ember_table_evictions_total[5m]))", "{{table}}")]),
    ("Table memory by shard", "bytes",
     [("sum by (instance) (ember_table_memory_bytes)", "{{instance}}")]),
    ("SSP: worker lag (steps behind the fastest)", "short",
     [("max by (worker) (ember_ssp_worker_lag_steps)", "worker {{worker}}")]),
    ("SSP: lookup wait p99", "s",
     [("histogram_quantile(0.99, sum by (le) (rate(ember_ssp_wait_seconds_bucket[5m])))",
       "p99 wait")]),
    ("Shard CPU (cores)", "short",
     [("rate(process_cpu_seconds_total{job=\"ember\"}[1m])", "{{instance}}")]),
    ("Shard resident memory", "bytes",
     [("process_resident_memory_bytes{job=\"ember\"}", "{{instance}}")]),
    # Trainers (TrainerMetrics, scraped as job "ember-trainer").
    ("Trainer: exposed embedding wait per step (mean, p99)", "s",
     [("sum by (worker) (rate(ember_trainer_exposed_wait_seconds_sum[1m]))"
       " / sum by (worker) (rate(ember_trainer_exposed_wait_seconds_count[1m]))",
       "mean worker {{worker}}"),
      ("histogram_quantile(0.99, sum by (le) (rate(ember_trainer_exposed_wait_seconds_bucket[5m])))",
       "p99 all workers")]),
    ("Trainer: prefetch overlap (share of fetch time hidden)", "percentunit",
     [("1 - sum by (worker) (rate(ember_trainer_exposed_wait_seconds_sum[5m]))"
       " / sum by (worker) (rate(ember_trainer_fetch_seconds_sum[5m]))", "worker {{worker}}")]),
    ("Trainer: steps per second", "ops",
     [("sum by (worker) (rate(ember_trainer_steps_total[1m]))", "worker {{worker}}")]),
    ("Trainer: staleness (own steps missing from fetched rows)", "short",
     [("max by (worker) (ember_trainer_staleness_steps)", "worker {{worker}}"),
      ("max by (worker) (ember_trainer_staleness_bound_steps)", "bound {{worker}}")]),
    ("Trainer: unique keys / ids", "percentunit",
     [("sum by (worker) (rate(ember_trainer_unique_keys_total[5m]))"
       " / sum by (worker) (rate(ember_trainer_keys_total[5m]))", "worker {{worker}}")]),
    ("Trainer: bytes per step", "bytes",
     [("sum by (worker) (rate(ember_trainer_bytes_total[1m]))"
       " / sum by (worker) (rate(ember_trainer_steps_total[1m]))", "worker {{worker}}")]),
    ("Trainer: RPC p99 by shard", "s",
     [("histogram_quantile(0.99, sum by (shard, le) "
       "(rate(ember_trainer_rpc_duration_seconds_bucket[5m])))", "shard {{shard}}")]),
    ("Trainer: failed pipelines and RPC errors", "short",
     [("sum(ember_trainer_pipeline_failed)", "failed pipelines"),
      ("sum by (shard, code) (rate(ember_trainer_rpc_attempts_total{code!=\"OK\"}[5m]))",
       "shard {{shard}} {{code}} /s")]),
]


def panel(i, title, unit, targets):
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"datasource": DS, "expr": e, "legendFormat": l, "refId": chr(65 + k)}
                    for k, (e, l) in enumerate(targets)],
    }


def main():
    dashboard = {
        "title": "Ember",
        "uid": "ember",
        "schemaVersion": 36,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "tags": ["ember"],
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Data source", "current": {}, "hide": 0}]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ember-dashboard.json")
    with open(out, "w") as f:
        json.dump(dashboard, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
