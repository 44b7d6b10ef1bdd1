#include "ember/trainer_metrics.h"

#include "absl/strings/str_cat.h"

namespace ember {

TrainerMetrics::TrainerMetrics()
    : steps_(registry_.AddCounter("ember_trainer_steps_total",
                                  "Steps whose rows the trainer received (Wait returned).",
                                  {"worker"})),
      pushes_(registry_.AddCounter("ember_trainer_pushes_total",
                                   "Steps whose gradients were sent to the shards.", {"worker"})),
      exposed_wait_(registry_.AddHistogram(
          "ember_trainer_exposed_wait_seconds",
          "Time Wait blocked per step: the embedding time the trainer did not hide.", {"worker"})),
      fetch_(registry_.AddHistogram(
          "ember_trainer_fetch_seconds",
          "Time from Prefetch to the step's rows being ready (queueing, SSP wait, RPC, pooling).",
          {"worker"})),
      overlap_(registry_.AddGauge(
          "ember_trainer_prefetch_overlap_ratio",
          "Share of the last step's fetch time hidden behind compute: 1 - wait / fetch.",
          {"worker"})),
      staleness_(registry_.AddGauge(
          "ember_trainer_staleness_steps",
          "This worker's own earlier steps whose gradients the last fetched rows do not include.",
          {"worker"})),
      staleness_bound_(registry_.AddGauge(
          "ember_trainer_staleness_bound_steps",
          "The pipeline's SSP staleness bound s (-1: asynchronous).", {"worker"})),
      keys_(registry_.AddCounter("ember_trainer_keys_total", "Ids in the prefetched batches.",
                                 {"worker"})),
      unique_keys_(registry_.AddCounter(
          "ember_trainer_unique_keys_total",
          "Keys fetched after per-table deduplication (node shuffle: the keys this rank owns).",
          {"worker"})),
      unique_ratio_(registry_.AddGauge("ember_trainer_unique_key_ratio",
                                       "Unique keys / ids of the last fetched step.", {"worker"})),
      bytes_(registry_.AddCounter(
          "ember_trainer_bytes_total",
          "Payload bytes: sent (keys, gradients), received (rows), node_shuffle (between ranks).",
          {"worker", "direction"})),
      step_bytes_(registry_.AddGauge(
          "ember_trainer_step_bytes",
          "Bytes the last pushed step moved: its fetch, its push and its node shuffle.",
          {"worker"})),
      failed_(registry_.AddGauge(
          "ember_trainer_pipeline_failed",
          "1 once the pipeline's background work failed (every later call returns the error).",
          {"worker"})),
      early_steps_(registry_.AddCounter(
          "ember_trainer_early_fetch_steps_total",
          "s = 0 steps fetched early: patched (brought forward on the trainer through the push "
          "before) or refetched (after the push, as others could change the rows).",
          {"worker", "outcome"})),
      rows_patched_(registry_.AddCounter(
          "ember_trainer_rows_patched_total",
          "Rows of early-fetched steps brought forward through the previous step's push.",
          {"worker"})),
      patch_bytes_(registry_.AddCounter(
          "ember_trainer_patch_bytes_total",
          "Bytes of the early fetches' answers (rows, optimizer state, step counts); also in "
          "ember_trainer_bytes_total received.",
          {"worker"})),
      rows_refetched_(registry_.AddCounter(
          "ember_trainer_rows_refetched_total",
          "Rows of refetched s = 0 steps that came after the push: the rows pushes changed since "
          "the early fetch (all of them where the shard could not tell).",
          {"worker"})),
      rpc_duration_(registry_.AddHistogram("ember_trainer_rpc_duration_seconds",
                                           "Client RPC attempts to each shard, retries included.",
                                           {"shard", "rpc"})),
      rpc_attempts_(registry_.AddCounter("ember_trainer_rpc_attempts_total",
                                         "Client RPC attempts by shard, method and status code.",
                                         {"shard", "rpc", "code"})) {
  metrics::AddProcessMetrics(&registry_);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> TrainerMetrics::Serve(const std::string& address,
                                                                         int port) {
  return MetricsHttpServer::Start(address, port, &registry_);
}

TrainerMetrics::Pipeline& TrainerMetrics::ForWorker(uint32_t worker) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Pipeline>& p = pipelines_[worker];
  if (p) return *p;
  const metrics::Labels w = {absl::StrCat(worker)};
  p = std::make_unique<Pipeline>(Pipeline{&steps_.With(w),
                                          &pushes_.With(w),
                                          &exposed_wait_.With(w),
                                          &fetch_.With(w),
                                          &overlap_.With(w),
                                          &staleness_.With(w),
                                          &staleness_bound_.With(w),
                                          &keys_.With(w),
                                          &unique_keys_.With(w),
                                          &unique_ratio_.With(w),
                                          &bytes_.With({w[0], "sent"}),
                                          &bytes_.With({w[0], "received"}),
                                          &bytes_.With({w[0], "node_shuffle"}),
                                          &step_bytes_.With(w),
                                          &failed_.With(w),
                                          &early_steps_.With({w[0], "patched"}),
                                          &early_steps_.With({w[0], "refetched"}),
                                          &rows_patched_.With(w),
                                          &patch_bytes_.With(w),
                                          &rows_refetched_.With(w)});
  return *p;
}

void TrainerMetrics::RecordRpc(uint32_t shard, absl::string_view rpc, absl::StatusCode code,
                               double seconds) {
  const std::string s = absl::StrCat(shard);
  rpc_duration_.With({s, std::string(rpc)}).Observe(seconds);
  rpc_attempts_.With({s, std::string(rpc), absl::StatusCodeToString(code)}).Add();
}

}  // namespace ember
