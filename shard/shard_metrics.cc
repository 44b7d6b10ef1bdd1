#include "shard/shard_metrics.h"

#include "absl/status/status.h"

namespace ember {

ShardMetrics::ShardMetrics(metrics::Registry* r)
    : table_rows(r->AddGauge("ember_table_rows", "Rows stored in the table on this shard.",
                             {"table", "device"})),
      table_capacity(r->AddGauge("ember_table_capacity_rows",
                                 "Most rows the table may hold on this shard (0: no limit).",
                                 {"table", "device"})),
      table_memory(r->AddGauge("ember_table_memory_bytes",
                               "Bytes the table holds for rows, state and index on this shard.",
                               {"table", "device"})),
      table_inserts(r->AddCounter("ember_table_inserts_total",
                                  "Rows inserted into the table since the shard started.",
                                  {"table", "device"})),
      table_evictions(r->AddCounter("ember_table_evictions_total",
                                    "Rows evicted to make room (LRU or LFU) since start.",
                                    {"table", "device"})),
      table_insert_failures(r->AddCounter(
          "ember_table_insert_failures_total",
          "New keys refused because the table was full and evicts nothing.", {"table", "device"})),
      table_expired(r->AddCounter("ember_table_expired_total",
                                  "Rows evicted by the table's TTL since the shard started.",
                                  {"table", "device"})),
      table_admission_rejected(r->AddCounter(
          "ember_table_admission_rejected_total",
          "Looked-up key occurrences answered with their initial row and not stored, for want "
          "of admission (seen fewer than min_count times).",
          {"table", "device"})),
      table_admission_dropped(r->AddCounter(
          "ember_table_admission_dropped_total",
          "Gradient rows dropped because their key was not admitted.", {"table", "device"})),
      worker_lag(r->AddGauge("ember_ssp_worker_lag_steps",
                             "Steps a registered worker's applied pushes trail the fastest "
                             "worker's on this shard.",
                             {"worker"})),
      registered_workers(r->AddGauge("ember_ssp_registered_workers",
                                     "Workers registered in the consistency clock.")
                             .With({})),
      routing_epoch(r->AddGauge("ember_routing_epoch",
                                "The routing epoch this shard serves (1 + the reshards of its "
                                "checkpoint; calls routed by another are refused).")
                        .With({})),
      exchange_streams_opened(r->AddCounter("ember_exchange_streams_opened_total",
                                            "ExchangeStream calls opened by trainers.")
                                  .With({})),
      exchange_streams_open(r->AddGauge("ember_exchange_streams_open",
                                        "ExchangeStream calls open now (about one per trainer "
                                        "process and shard in the steady state).")
                                .With({})),
      inflight_request_bytes(r->AddGauge("ember_inflight_request_bytes",
                                         "Request bytes held by calls running now "
                                         "(--max_inflight_bytes bounds it).")
                                 .With({})),
      registry_(r),
      calls_(r->AddCounter("ember_rpc_requests_total", "RPCs answered, by method and status code.",
                           {"rpc", "code"})),
      call_seconds_(r->AddHistogram("ember_rpc_duration_seconds",
                                    "Time from an RPC's start to its answer, by method.", {"rpc"})),
      table_requests_(r->AddCounter("ember_table_requests_total",
                                    "Table entries of Lookup and Push calls served.",
                                    {"table", "rpc"})),
      table_keys_(
          r->AddCounter("ember_table_keys_total", "Keys looked up or pushed.", {"table", "rpc"})),
      table_bytes_(r->AddCounter("ember_table_bytes_total",
                                 "Row bytes returned by lookups and gradient bytes received by "
                                 "pushes.",
                                 {"table", "rpc"})),
      table_missing_(r->AddCounter("ember_table_missing_keys_total",
                                   "Looked-up keys that were not stored (answered with their "
                                   "initial row).",
                                   {"table"})),
      table_errors_(r->AddCounter("ember_table_errors_total",
                                  "Failed table entries of calls, by method and status code.",
                                  {"table", "rpc", "code"})),
      auth_denied_(r->AddCounter("ember_auth_denied_total",
                                 "Calls refused for want of a known bearer token "
                                 "(UNAUTHENTICATED) or of the role (PERMISSION_DENIED).",
                                 {"rpc", "code"})),
      inflight_refused_(r->AddCounter("ember_inflight_refused_total",
                                      "Calls refused with RESOURCE_EXHAUSTED by the in-flight "
                                      "request bytes limit of their connection or of the shard.",
                                      {"scope"})),
      ssp_wait_(&r->AddHistogram("ember_ssp_wait_seconds",
                                 "Time lookups carrying a step waited for slower workers.", {})
                     .With({})),
      checkpoints_(r->AddCounter("ember_checkpoints_total",
                                 "Checkpoints attempted, by kind (full, delta) and result (ok or "
                                 "the status code).",
                                 {"kind", "result"})),
      checkpoint_last_success_(
          r->AddGauge("ember_checkpoint_last_success_timestamp_seconds",
                      "Unix time the last successful checkpoint finished (0: none yet).")
              .With({})),
      checkpoint_last_bytes_(
          r->AddGauge("ember_checkpoint_last_bytes", "Bytes of the last successful checkpoint.")
              .With({})),
      checkpoint_last_step_(r->AddGauge("ember_checkpoint_last_step",
                                        "The cut step of the last successful checkpoint (-1: "
                                        "no worker registered).")
                                .With({})),
      checkpoint_last_seconds_(r->AddGauge(
          "ember_checkpoint_last_duration_seconds",
          "Phases of the last successful checkpoint: cut_wait (workers reaching the step), copy "
          "(pushes held), write (files, while serving).",
          {"phase"})),
      restore_seconds_(r->AddGauge("ember_restore_duration_seconds",
                                   "Time the start-up restore took (0: nothing restored).")
                           .With({})),
      restore_step_(
          r->AddGauge("ember_restore_step", "The cut step of the checkpoint restored at start-up.")
              .With({})),
      restore_parts_(r->AddGauge("ember_restore_parts",
                                 "Checkpoint parts the start-up restore read: 1, or every part "
                                 "of a cluster checkpoint it resharded (0: nothing restored).")
                         .With({})),
      restore_bytes_(r->AddGauge("ember_restore_bytes",
                                 "Data bytes of the checkpoint files the start-up restore read.")
                         .With({})),
      restore_moved_rows_(r->AddGauge("ember_restore_moved_rows",
                                      "Rows a resharded start-up restore took from other shard "
                                      "indexes' parts: the keys the reshard moved here.")
                              .With({})),
      restore_routing_(r->AddGauge("ember_restore_routing_info",
                                   "1 for the routing a restored shard serves by (the "
                                   "checkpoint's, or the shard's when it resharded).",
                                   {"routing"})) {}

void ShardMetrics::RecordCheckpoint(absl::string_view kind, absl::string_view result) {
  checkpoints_.With({std::string(kind), std::string(result)}).Add();
}

void ShardMetrics::RecordCheckpointSuccess(double unix_seconds, uint64_t bytes, int64_t step,
                                           double cut_wait, double copy, double write) {
  checkpoint_last_success_.Set(unix_seconds);
  checkpoint_last_bytes_.Set(static_cast<double>(bytes));
  checkpoint_last_step_.Set(static_cast<double>(step));
  checkpoint_last_seconds_.With({"cut_wait"}).Set(cut_wait);
  checkpoint_last_seconds_.With({"copy"}).Set(copy);
  checkpoint_last_seconds_.With({"write"}).Set(write);
}

void ShardMetrics::RecordRestore(double seconds, int64_t step, uint32_t parts, uint64_t bytes,
                                 uint64_t moved_rows, absl::string_view routing) {
  restore_moved_rows_.Set(static_cast<double>(moved_rows));
  restore_seconds_.Set(seconds);
  restore_step_.Set(static_cast<double>(step));
  restore_parts_.Set(parts);
  restore_bytes_.Set(static_cast<double>(bytes));
  restore_routing_.With({std::string(routing)}).Set(1);
}

void ShardMetrics::RecordCall(Rpc rpc, absl::StatusCode code, double seconds) {
  static constexpr const char* kNames[kRpcs] = {"Lookup", "Push", "Exchange"};
  const int r = static_cast<int>(rpc);
  const int c = static_cast<int>(code) >= 0 && static_cast<int>(code) < kCodes
                    ? static_cast<int>(code)
                    : static_cast<int>(absl::StatusCode::kUnknown);
  metrics::Counter* calls = call_cache_[r][c].load(std::memory_order_acquire);
  if (calls == nullptr) {  // first call with this code: With is idempotent
    calls = &calls_.With({kNames[r], absl::StatusCodeToString(static_cast<absl::StatusCode>(c))});
    call_cache_[r][c].store(calls, std::memory_order_release);
  }
  metrics::Histogram* latency = seconds_cache_[r].load(std::memory_order_acquire);
  if (latency == nullptr) {
    latency = &call_seconds_.With({kNames[r]});
    seconds_cache_[r].store(latency, std::memory_order_release);
  }
  calls->Add();
  latency->Observe(seconds);
}

ShardMetrics::TableSeries* ShardMetrics::Table(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(name);
  if (it != tables_.end()) return it->second.get();
  auto s = std::make_unique<TableSeries>();
  s->lookup_requests = &table_requests_.With({name, "Lookup"});
  s->lookup_keys = &table_keys_.With({name, "Lookup"});
  s->lookup_bytes = &table_bytes_.With({name, "Lookup"});
  s->lookup_missing = &table_missing_.With({name});
  s->push_requests = &table_requests_.With({name, "Push"});
  s->push_keys = &table_keys_.With({name, "Push"});
  s->push_bytes = &table_bytes_.With({name, "Push"});
  return tables_.emplace(name, std::move(s)).first->second.get();
}

void ShardMetrics::TableError(const std::string& table, absl::string_view rpc,
                              absl::StatusCode code) {
  table_errors_.With({table, std::string(rpc), absl::StatusCodeToString(code)}).Add();
}

void ShardMetrics::RecordInflightRefusal(absl::string_view scope) {
  inflight_refused_.With({std::string(scope)}).Add();
}

void ShardMetrics::RecordAuthDenied(absl::string_view rpc, absl::StatusCode code) {
  auth_denied_.With({std::string(rpc), absl::StatusCodeToString(code)}).Add();
}

}  // namespace ember
