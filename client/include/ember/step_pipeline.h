// ember::StepPipeline: one trainer replica's (one GPU's) embedding pipeline.
//
//   pipe->Prefetch(t + 1, batch);      // returns at once; fetch runs behind
//   StepView rows = *pipe->Wait(t);    // pooled [batch, dim] per feature
//   ... forward / backward ...
//   pipe->Push(t, d_pooled);           // returns at once; push runs behind
//
// Prefetch deduplicates each table's keys (over every feature that uses the
// table) and pools the fetched rows into one dense buffer per feature. Push
// turns d(pooled) into one gradient per unique key (duplicates summed). One
// background thread per pipeline does both, in call order, and sends one
// Exchange per shard per step: the gradients of one step travel with the
// keys of a later one (docs/client.md has the rules).
//
// Consistency: with staleness s >= 0 the pipeline registers its worker id on
// every shard and its lookup for step t is answered once every registered
// worker's pushes up to step t - s - 1 are applied (see LookupRequest.step);
// s < 0 is asynchronous (no clock). The prefetch depth follows s: fetching
// step t + d while step t computes can only overlap when d <= s.
//
// Steps: Prefetch steps first_step, first_step + 1, ... in order, at most
// prefetch_depth + 1 of them not yet pushed; Wait and Push each step once, in
// order. Breaking these rules is FAILED_PRECONDITION and changes nothing.
//
// Errors: the first failure of background work (a shard's error, a spent
// retry budget) is returned by the next Wait, Push or Flush and by every call
// after it; the trainer cannot know which rows that step updated.
//
// Thread safety: one pipeline is driven from one thread at a time, except
// that Prefetch may be called from a second thread (an input pipeline's)
// while the first calls Wait and Push; different pipelines (sharing one
// Client) may run on different threads.
//
// Memory: by default all buffers are host memory, owned by the pipeline. With
// PipelineOptions::device = N the rows are delivered on GPU N instead: the
// network thread stages each step in pinned host memory and sends it with
// one host-to-device copy on a side stream; WaitOnDevice makes the trainer's
// stream wait for that copy (an event, no host wait beyond the fetch) and
// pools on the GPU; PushFromDevice runs pooling's backward on the trainer's
// stream and copies the per-key gradients back on the side stream, so no
// device-to-host copy sits on the trainer's path. Wait and Push then refuse
// (FAILED_PRECONDITION), and vice versa.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ember/batch.h"
#include "ember/client.h"
#include "ember/device.h"
#include "ember/node_shuffle.h"
#include "ember/step_merger.h"
#include "ember/trace.h"
#include "ember/trainer_metrics.h"

namespace ember {

struct FeatureSpec {
  std::string name;   // for messages
  std::string table;  // an existing table; several features may share one
  Combiner combiner = Combiner::kSum;
};

struct PipelineOptions {
  // This replica's id in the consistency clock; unique per trainer worker.
  uint32_t worker_id = 0;
  std::vector<FeatureSpec> features;
  // SSP staleness s; negative: asynchronous, no clock.
  int staleness = 0;
  // Steps fetched ahead of the one computing; -1: max(1, staleness), or 2
  // with early fetch (the fetch of t + 2 then waits, queued, for push t and
  // leaves with it).
  int prefetch_depth = -1;
  // At staleness 0: fetch step t + 1's rows while step t computes and bring
  // them forward through step t's push on the trainer, with the shard's own
  // optimizer code, so that Wait(t + 1) gets exactly the rows of a lookup
  // after the push without waiting for one (docs/client.md, "Early fetch at
  // s = 0"). A step whose rows others may change (another SSP worker, a
  // table with a capacity, TTL or admission, a store that cannot peek) is
  // fetched after the push instead. Not with node_transport (ignored);
  // with a merger, the merger's option decides.
  bool early_fetch = true;
  // With early fetch: bring the rows this worker's own push changes
  // forward on the trainer (true), or fetch just those rows after the push
  // (false: a smaller fetch on the critical path instead of the trainer's
  // update; the fetch other workers' changes need anyway,
  // docs/client.md). Both are exact; with a merger, the merger's option
  // decides.
  bool early_fetch_patch = true;
  int64_t first_step = 0;
  // -1: rows are pooled on the host (Wait / Push). N >= 0: on CUDA device N
  // (WaitOnDevice / PushFromDevice); FAILED_PRECONDITION at Create when the
  // build has no CUDA or the device is missing.
  int device = -1;
  // Several GPUs of one trainer node: this pipeline's rank in a transport
  // shared by the node's pipelines (NewInProcessTransports, NCCL). Each
  // step's unique keys are then fetched and pushed once per node: every rank
  // fetches and pushes the keys it owns (OwnerRank) for all ranks, and the
  // rows and gradients travel between ranks (NodeShuffle). The ranks must
  // make the same calls (Prefetch, Wait, Push, Flush, Close) in the same
  // order; each is its own SSP worker. A failure on one rank stops the others
  // when their transport times out. Null: no exchange. Not owned.
  ShuffleTransport* node_transport = nullptr;
  // With node_transport: false (the default), each rank is its own SSP
  // worker (its own worker_id) and owns a share of every shard's keys
  // (OwnerRank), so every shard hears from every rank. True: the node is
  // one SSP worker (the same worker_id on every rank) and rank r owns the
  // keys of the shards s with s % ranks == r, so each shard receives one
  // request per node step, from its rank. Rank 0 registers the worker, and
  // unregisters it at Close once every rank has flushed (Close is then a
  // collective too).
  bool node_one_worker = false;
  // Several pipelines of one process: the StepMerger they share, which sends
  // one request per shard per step for all of them (ember/step_merger.h),
  // and this pipeline's rank in it. The merger's worker id is then the SSP
  // worker; `staleness` and `first_step` must equal the merger's. Not
  // owned. Null: this pipeline sends its own requests. Not with
  // node_transport.
  StepMerger* merger = nullptr;
  int merger_rank = 0;
  // Records this pipeline's timeline (Prefetch, Wait, Push, Exchange, Pool,
  // per-shard RPCs) for Perfetto / chrome://tracing, as process "worker N"
  // (pid worker_id + 1); see ember/trace.h. Not owned; may be shared by
  // pipelines. Null: no timeline.
  TraceRecorder* trace = nullptr;
  // Prometheus series of this pipeline, labelled worker="worker_id"; see
  // ember/trainer_metrics.h. Not owned; may be shared. Null: none.
  TrainerMetrics* metrics = nullptr;
};

// The rows of one step, valid until Push(step) is called for it.
struct StepView {
  int64_t step = 0;
  int64_t batch_size = 0;
  // Per feature, batch_size x dim(feature) floats, row-major: the
  // pipeline's buffers. Writable, so that a backward pass that no longer
  // needs the rows can write d(pooled) over them and hand `pooled` itself
  // to Push, which then copies nothing (1.1 MB a step at dim 128).
  std::vector<absl::Span<float>> pooled;
};

// The rows of one step on the GPU: device pointers (the pipeline's memory),
// valid until PushFromDevice is called for the step.
struct DeviceStepView {
  int64_t step = 0;
  int64_t batch_size = 0;
  // Per feature, batch_size x dim(feature) floats, row-major, device memory.
  std::vector<const float*> pooled;
};

// What one pipeline did; totals since creation.
struct PipelineStats {
  int64_t steps_waited = 0;
  int64_t steps_pushed = 0;
  double wait_seconds = 0;     // time Wait blocked (the exposed embedding wait)
  double max_wait_seconds = 0;
  uint64_t keys = 0;           // ids in the batches
  uint64_t unique_keys = 0;    // keys fetched after per-table deduplication (with a
                               // node shuffle: the keys this rank owns)
  uint64_t bytes_sent = 0;     // request payload (keys and gradients)
  uint64_t bytes_received = 0; // response rows
  uint64_t exchange_bytes = 0; // sent and received between the node's ranks
  // Early fetch at s = 0 (PipelineOptions::early_fetch): steps whose rows
  // were brought forward on the trainer, the rows that took (rows of the
  // step that the step before pushed), the bytes of the early fetches'
  // answers (rows, optimizer state), and steps fetched after the push
  // instead (someone else could change their rows, or early_fetch_patch
  // is off): of those, the rows
  // that came after the push (the rows pushes changed since the early
  // fetch) and the keys they had (what a full fetch would carry).
  uint64_t steps_patched = 0;
  uint64_t rows_patched = 0;
  uint64_t patch_bytes = 0;
  uint64_t steps_refetched = 0;
  uint64_t rows_refetched = 0;
  uint64_t keys_refetched = 0;
};

class StepPipeline {
 public:
  // Checks the features against the cluster's tables and registers the worker
  // when staleness >= 0. `client` must outlive the pipeline.
  static absl::StatusOr<std::unique_ptr<StepPipeline>> Create(Client* client,
                                                              PipelineOptions options);
  // Finishes outstanding work (like Close) and stops the background threads.
  ~StepPipeline();

  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // Starts fetching step `step`'s rows; the batch is validated now.
  absl::Status Prefetch(int64_t step, Batch batch);
  // Blocks until step `step`'s rows are pooled; returns the first error of its
  // fetch, or of an earlier push.
  absl::StatusOr<StepView> Wait(int64_t step);
  // d_pooled[f] holds batch_size x dim(f) gradients of feature f's pooled
  // rows; they are copied, except a span that is the step's own
  // StepView::pooled[f] (gradients written in place). Returns at once (an
  // earlier push's error if any).
  absl::Status Push(int64_t step, const std::vector<absl::Span<const float>>& d_pooled);
  // Push(step, view.pooled). A template only so that a braced list, e.g.
  // Push(t, {grads.begin(), grads.end()}), still means the overload above.
  template <typename V, typename = std::enable_if_t<
                            std::is_same_v<V, std::vector<absl::Span<float>>>>>
  absl::Status Push(int64_t step, const V& d_pooled) {
    return Push(step, std::vector<absl::Span<const float>>(d_pooled.begin(), d_pooled.end()));
  }
  // The device twins of Wait and Push (PipelineOptions::device >= 0).
  // WaitOnDevice blocks until the step's rows are fetched, then orders the
  // upload and the pooling kernels on `stream` and returns; the pooled rows
  // are ready in `stream` order. PushFromDevice reads d_pooled[f] (device
  // memory, batch_size x dim(f)) in `stream` order: keep those buffers until
  // the stream has passed this call.
  absl::StatusOr<DeviceStepView> WaitOnDevice(int64_t step, DeviceStream stream);
  absl::Status PushFromDevice(int64_t step, const std::vector<const float*>& d_pooled,
                              DeviceStream stream);
  // Blocks until every push so far is acknowledged; returns the first error.
  absl::Status Flush();
  // Flush, then unregister the worker. Idempotent; every other call after it
  // fails with FAILED_PRECONDITION.
  absl::Status Close();

  size_t num_features() const;
  // Elements per row of feature `feature` (< num_features()).
  uint32_t dim(size_t feature) const;
  int prefetch_depth() const;
  PipelineStats Stats() const;

 private:
  class Impl;
  explicit StepPipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember
