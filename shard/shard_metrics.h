// The shard's Prometheus metrics: one place that declares every family the
// shard exports (names and meaning in docs/operations.md), and cached series
// for the hot paths. Values read at scrape time (rows, memory, worker lag)
// are set by Shard through the registry's scrape callback.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"

namespace ember {

class ShardMetrics {
 public:
  // Declares the families in `registry`, which must outlive this.
  explicit ShardMetrics(metrics::Registry* registry);

  metrics::Registry& registry() { return *registry_; }

  enum class Rpc { kLookup, kPush, kExchange };
  static constexpr int kRpcs = 3;
  static constexpr int kCodes = 17;  // absl::StatusCode 0..16

  // One RPC ended with `code` after `seconds` (at the service edge). The
  // series are looked up once each and cached: this is per call.
  void RecordCall(Rpc rpc, absl::StatusCode code, double seconds);

  // Counters of one table's traffic; stable for the shard's life.
  struct TableSeries {
    metrics::Counter* lookup_requests;
    metrics::Counter* lookup_keys;
    metrics::Counter* lookup_bytes;
    metrics::Counter* lookup_missing;
    metrics::Counter* push_requests;
    metrics::Counter* push_keys;
    metrics::Counter* push_bytes;
  };
  TableSeries* Table(const std::string& name);
  // A request's part for an existing table failed with `code`.
  void TableError(const std::string& table, absl::string_view rpc, absl::StatusCode code);
  // A call refused by --auth_tokens_file (UNAUTHENTICATED or PERMISSION_DENIED).
  void RecordAuthDenied(absl::string_view rpc, absl::StatusCode code);
  // A call refused by the in-flight limit of its `scope`: "connection" or "total".
  void RecordInflightRefusal(absl::string_view scope);

  // How long lookups carrying a step waited for slower workers.
  metrics::Histogram& ssp_wait() { return *ssp_wait_; }

  // Scrape-time families the shard fills (cleared and refilled each scrape).
  metrics::Family<metrics::Gauge>& table_rows;
  metrics::Family<metrics::Gauge>& table_capacity;
  metrics::Family<metrics::Gauge>& table_memory;
  metrics::Family<metrics::Counter>& table_inserts;
  metrics::Family<metrics::Counter>& table_evictions;
  metrics::Family<metrics::Counter>& table_insert_failures;
  metrics::Family<metrics::Counter>& table_expired;
  metrics::Family<metrics::Counter>& table_admission_rejected;
  metrics::Family<metrics::Counter>& table_admission_dropped;
  metrics::Family<metrics::Gauge>& worker_lag;
  metrics::Gauge& registered_workers;
  metrics::Gauge& routing_epoch;
  // ExchangeStream: streams opened since start, and open now.
  metrics::Counter& exchange_streams_opened;
  metrics::Gauge& exchange_streams_open;
  // Request bytes held by calls running now (shard/inflight_limit.h).
  metrics::Gauge& inflight_request_bytes;

  // Checkpoints: one finished (`kind` full or delta, `ok` or the status
  // code's name), and the last success's figures.
  void RecordCheckpoint(absl::string_view kind, absl::string_view result);
  void RecordCheckpointSuccess(double unix_seconds, uint64_t bytes, int64_t step,
                               double cut_wait, double copy, double write);
  // A start-up restore: its time, cut step, the checkpoint parts it read
  // (1, or every part of a cluster checkpoint it resharded), their data
  // bytes, the rows it took from other shard indexes' parts (a reshard's
  // moved keys), and the routing the shard serves by since.
  void RecordRestore(double seconds, int64_t step, uint32_t parts, uint64_t bytes,
                     uint64_t moved_rows, absl::string_view routing);

 private:
  metrics::Registry* registry_;
  metrics::Family<metrics::Counter>& calls_;
  metrics::Family<metrics::Histogram>& call_seconds_;
  metrics::Family<metrics::Counter>& table_requests_;
  metrics::Family<metrics::Counter>& table_keys_;
  metrics::Family<metrics::Counter>& table_bytes_;
  metrics::Family<metrics::Counter>& table_missing_;
  metrics::Family<metrics::Counter>& table_errors_;
  metrics::Family<metrics::Counter>& auth_denied_;
  metrics::Family<metrics::Counter>& inflight_refused_;
  metrics::Histogram* ssp_wait_;
  metrics::Family<metrics::Counter>& checkpoints_;
  metrics::Gauge& checkpoint_last_success_;
  metrics::Gauge& checkpoint_last_bytes_;
  metrics::Gauge& checkpoint_last_step_;
  metrics::Family<metrics::Gauge>& checkpoint_last_seconds_;
  metrics::Gauge& restore_seconds_;
  metrics::Gauge& restore_step_;
  metrics::Gauge& restore_parts_;
  metrics::Gauge& restore_bytes_;
  metrics::Gauge& restore_moved_rows_;
  metrics::Family<metrics::Gauge>& restore_routing_;
  std::atomic<metrics::Counter*> call_cache_[kRpcs][kCodes] = {};
  std::atomic<metrics::Histogram*> seconds_cache_[kRpcs] = {};

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<TableSeries>, std::less<>> tables_;
};

}  // namespace ember
