// ember::TrainerMetrics: Prometheus metrics of one trainer process's Client
// and step pipelines, exported from the trainer on request.
//
//   ember::TrainerMetrics metrics;
//   client_options.metrics = &metrics;     // per-shard RPC latency and codes
//   pipeline_options.metrics = &metrics;   // per worker: wait, overlap, ...
//   auto http = metrics.Serve("0.0.0.0", 9464);  // GET /metrics; or
//   std::string text = metrics.Expose();         // for the trainer's own exporter
//
// Series (docs/operations.md has the full list):
//   ember_trainer_exposed_wait_seconds{worker}   histogram: Wait's block per step
//   ember_trainer_fetch_seconds{worker}          histogram: Prefetch to rows ready
//   ember_trainer_prefetch_overlap_ratio{worker} the last step's share of its
//                                                fetch hidden behind compute
//   ember_trainer_staleness_steps{worker}        own steps whose gradients the
//                                                last fetched rows lack
//   ember_trainer_unique_key_ratio{worker}       the last step's unique / keys
//   ember_trainer_step_bytes{worker}             the last pushed step's bytes
//   ember_trainer_rpc_duration_seconds{shard,rpc} per attempt, retries included
//   ember_trainer_early_fetch_steps_total{worker,outcome} s = 0 steps fetched
//                                                early: "patched" on the
//                                                trainer or "refetched"
//   ember_trainer_rows_patched_total{worker}     rows brought forward
//   ember_trainer_patch_bytes_total{worker}      bytes of the early fetches'
//                                                answers (rows, optimizer state)
//   ember_trainer_rows_refetched_total{worker}   rows of refetched steps that
//                                                came after the push (changed
//                                                since the early fetch)
//   and counters of steps, keys, unique keys, bytes and RPC attempts.
//
// Thread safety: everything may be called from any thread. The object must
// outlive the Client and pipelines that use it. Updates are lock-free
// except the first use of a worker or (shard, rpc) series.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"
#include "common/metrics_http.h"

namespace ember {

class TrainerMetrics {
 public:
  TrainerMetrics();  // with the process's CPU and memory (process_*)
  TrainerMetrics(const TrainerMetrics&) = delete;
  TrainerMetrics& operator=(const TrainerMetrics&) = delete;

  // The text exposition (format 0.0.4) of every series.
  std::string Expose() const { return registry_.Expose(); }
  // Serves Expose() on GET /metrics at address:port (port 0: a free one,
  // see port()) until the returned server is destroyed. UNAVAILABLE when the
  // port cannot be bound.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Serve(const std::string& address, int port);
  // For the trainer's own series, exposed with Ember's.
  metrics::Registry& registry() { return registry_; }

  // The series of one pipeline, by PipelineOptions::worker_id (StepPipeline
  // updates them). References stay valid for this object's life.
  struct Pipeline {
    metrics::Counter* steps;
    metrics::Counter* pushes;
    metrics::Histogram* exposed_wait;
    metrics::Histogram* fetch;
    metrics::Gauge* overlap;
    metrics::Gauge* staleness;
    metrics::Gauge* staleness_bound;
    metrics::Counter* keys;
    metrics::Counter* unique_keys;
    metrics::Gauge* unique_ratio;
    metrics::Counter* bytes_sent;
    metrics::Counter* bytes_received;
    metrics::Counter* bytes_node_shuffle;
    metrics::Gauge* step_bytes;
    metrics::Gauge* failed;
    metrics::Counter* steps_patched;
    metrics::Counter* steps_refetched;
    metrics::Counter* rows_patched;
    metrics::Counter* patch_bytes;
    metrics::Counter* rows_refetched;
  };
  Pipeline& ForWorker(uint32_t worker);

  // One RPC attempt to `shard` (Client calls this).
  void RecordRpc(uint32_t shard, absl::string_view rpc, absl::StatusCode code, double seconds);

 private:
  metrics::Registry registry_;
  metrics::Family<metrics::Counter>& steps_;
  metrics::Family<metrics::Counter>& pushes_;
  metrics::Family<metrics::Histogram>& exposed_wait_;
  metrics::Family<metrics::Histogram>& fetch_;
  metrics::Family<metrics::Gauge>& overlap_;
  metrics::Family<metrics::Gauge>& staleness_;
  metrics::Family<metrics::Gauge>& staleness_bound_;
  metrics::Family<metrics::Counter>& keys_;
  metrics::Family<metrics::Counter>& unique_keys_;
  metrics::Family<metrics::Gauge>& unique_ratio_;
  metrics::Family<metrics::Counter>& bytes_;
  metrics::Family<metrics::Gauge>& step_bytes_;
  metrics::Family<metrics::Gauge>& failed_;
  metrics::Family<metrics::Counter>& early_steps_;
  metrics::Family<metrics::Counter>& rows_patched_;
  metrics::Family<metrics::Counter>& patch_bytes_;
  metrics::Family<metrics::Counter>& rows_refetched_;
  metrics::Family<metrics::Histogram>& rpc_duration_;
  metrics::Family<metrics::Counter>& rpc_attempts_;

  std::mutex mu_;
  std::map<uint32_t, std::unique_ptr<Pipeline>> pipelines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember
