// PipelineTelemetry: what one StepPipeline reports about itself: its
// PipelineStats, its Prometheus series (ember/trainer_metrics.h) and its
// timeline (ember/trace.h), apart from the pipeline's work.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ember/client.h"
#include "ember/step_pipeline.h"
#include "ember/trace.h"
#include "ember/trainer_metrics.h"

namespace ember {

class PipelineTelemetry {
 public:
  // Names the pipeline's timeline tracks (process "worker N": trainer,
  // network, one per shard) and resets its series. `trace` and `metrics`
  // may be null; `client` outlives this.
  PipelineTelemetry(const Client& client, uint32_t worker_id, int staleness, TraceRecorder* trace,
                    TrainerMetrics* metrics);

  // A span of the trainer's or the network thread's track, for step `step`.
  void Span(bool network, const char* name, absl::Time start, int64_t step,
            std::string args = "");
  // A span that ended at `end` (measured by other code), not now.
  void SpanEnded(bool network, const char* name, absl::Time start, absl::Time end, int64_t step);
  // One Exchange round (network track) and its per-shard attempts.
  void ExchangeSpans(absl::Time start, uint32_t shards, const int64_t* push_step,
                     const int64_t* fetch_step, bool ok, const std::vector<ShardCall>& calls);
  bool tracing() const { return trace_ != nullptr; }

  void Prefetched(uint64_t keys);
  // A step's fetch about to go out: its unique keys (of `keys` ids) and how
  // many of this worker's own earlier steps' pushes it will not see.
  void Fetching(uint64_t unique_keys, uint64_t keys, int64_t staleness);
  void Bytes(uint64_t sent, uint64_t received, uint64_t node_shuffle);
  // Wait blocked `waited` seconds of a fetch that took `fetch` seconds;
  // ok: the step's rows were delivered (the series count only those).
  void Waited(double waited, double fetch, bool ok);
  // A push was sent; ok: applied, with `step_bytes` moved for its step.
  void Pushed(bool ok, uint64_t step_bytes);
  void Failed();
  // Early fetch: a step's rows brought forward (`rows` of them patched);
  // a peeked step fetched after the push instead; an early fetch's answer.
  void Patched(uint64_t rows);
  void Refetching();
  // A refetched step's rows came: `rows` of its `keys` (the rest as peeked).
  void Refetched(uint64_t rows, uint64_t keys);
  void Peeked(uint64_t bytes);

  PipelineStats Stats() const;

 private:
  TraceTrack Track(uint32_t thread) const { return {worker_id_ + 1, thread}; }

  const uint32_t worker_id_;
  TraceRecorder* const trace_;
  TrainerMetrics::Pipeline* metrics_ = nullptr;  // series are updated lock-free
  mutable std::mutex mu_;
  PipelineStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember
