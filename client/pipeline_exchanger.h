// PipelineExchanger: the network thread's half of a StepPipeline: for one
// exchange (a push, a fetch, or both), the requests built from the steps
// (deduplicated keys, the route to shards, with a node shuffle the trade
// with the other ranks, through a StepMerger the merged round, with early
// fetch the peek and the patch) and the answers delivered into the steps'
// row sinks. The pipeline's other half (client/step_pipeline.cc) keeps the
// steps, the schedule and the trainer's calls; it hands steps over through
// StepBoard.
//
// Thread safety: none; the pipeline's network thread alone calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/dedup.h"
#include "client/early_fetch.h"
#include "client/pipeline_step.h"
#include "client/pipeline_telemetry.h"
#include "client/request_plan.h"
#include "client/row_sink.h"
#include "ember/client.h"
#include "ember/node_shuffle.h"
#include "ember/step_pipeline.h"

namespace ember {

// What the exchanger needs of the pipeline's steps. Every method may be
// called from the network thread while the trainer's calls run.
class StepBoard {
 public:
  virtual ~StepBoard() = default;
  // A step from its Prefetch until its push is sent.
  virtual PipelineStep* LiveStep(int64_t step) = 0;
  // The step's rows are delivered: wakes its Wait.
  virtual void MarkReady(PipelineStep& s) = 0;
  // The last step whose push this worker has sent (applied on the shards).
  virtual int64_t PushedUpto() = 0;
};

class PipelineExchanger {
 public:
  // The tables (distinct, first-use order) with their dims, and each
  // feature's table index; `client`, `options`, the vectors, `telemetry`
  // and `board` must outlive the exchanger.
  PipelineExchanger(Client* client, const PipelineOptions& options,
                    const std::vector<std::string>& tables, const std::vector<uint32_t>& table_dim,
                    const std::vector<int>& feature_table, PipelineTelemetry* telemetry,
                    StepBoard* board);
  // Makes the node shuffle (with options.node_transport), the row sink
  // (host, or options.device's) and, with `early_fetch` and no merger, the
  // early fetch. Errors: the device sink's, the tables' description's.
  absl::Status Init(bool early_fetch);

  // Null without options.node_transport.
  NodeShuffle* node() const { return node_.get(); }

  // Dedup and, without a node shuffle (whose routing is a collective, in
  // call order), the route to shards.
  void KeyStep(PipelineStep& s);
  // One Exchange per shard carrying `push` (gradients of an earlier step)
  // and/or `fetch` (the rows of a later one). Marks the steps whose rows
  // it delivers ready. With early fetch, the step after `push` (peeked
  // while it computed) is brought forward and ready before the exchange
  // goes out, and `fetch` may be a peek, ready only once its own patch is.
  absl::Status Send(PipelineStep* push, PipelineStep* fetch);

 private:
  // The keys a step fetches and pushes, per table.
  const std::vector<std::vector<uint64_t>>& Fetched(const PipelineStep& s) const;
  // Deduplicates each table's keys over the features that use it: fills
  // s.unique and s.inverse (once).
  void Dedup(PipelineStep& s);
  // Dedup, then (with a node shuffle) the keys this rank owns, and the
  // route to shards: fills s.unique, s.inverse, s.owned and s.plan. Returns
  // the fetched key count.
  absl::StatusOr<uint64_t> BuildLookup(PipelineStep& s);
  // Hands the shards' rows to the sink, which pools them per feature.
  // `over_peek`: the lookup asked for changed rows only (EarlyFetch::
  // AskChanged); the others are the early fetch's.
  absl::Status FinishLookup(PipelineStep& s, const std::vector<ExchangeAnswer>& responses,
                            bool over_peek = false);
  // One PushRequest per shard (every shard, so that its clock advances) of
  // the step's gradients, routed by its plan (with a node shuffle: the
  // node's sums for the keys this rank owns). Returns the payload bytes.
  // `grads`: sink_->Gradients(s).
  absl::StatusOr<uint64_t> BuildPush(PipelineStep& s, std::vector<const float*> grads,
                                     std::vector<v1::PushRequest>* requests);
  // Whether this pipeline sends to shard `sh` at all: a node that is one
  // worker talks to each shard from one rank (its keys' owner).
  bool Talks(uint32_t sh) const;
  // Early fetch: brings `next`'s peeked rows forward through the push whose
  // per-key gradients are `grads` and delivers them (next is then ready),
  // or, when others may change them, leaves `next` to be fetched after the
  // push (false).
  absl::StatusOr<bool> PatchNext(PipelineStep& next, const std::vector<const float*>& grads);
  // Delivers a step's rows brought forward (`rows` of them patched, from
  // `start`): the step is ready.
  absl::Status DeliverPatched(PipelineStep& s, const std::vector<std::vector<const char*>>& at,
                              uint64_t rows, absl::Time start);
  // SendExchange through the node's StepMerger: this rank's part of one
  // merged Exchange per shard.
  absl::Status SendMerged(PipelineStep* push, PipelineStep* fetch);
  // Adds payload bytes of step `s` to the stats, the metrics and the step.
  void CountBytes(PipelineStep& s, uint64_t sent, uint64_t received, uint64_t node_shuffle);
  // A fetch about to go out (with `push`, if any, applied just before it):
  // its unique keys, and its staleness, the own earlier steps whose pushes
  // it will not see.
  void CountFetch(const PipelineStep& fetch, uint64_t unique_keys, const PipelineStep* push);

  Client* const client_;
  const PipelineOptions& options_;
  const LookupClock clock_;
  const std::vector<std::string>& tables_;
  const std::vector<uint32_t>& table_dim_;
  const std::vector<int>& feature_table_;
  PipelineTelemetry* const telemetry_;
  StepBoard* const board_;
  KeyDeduplicator dedup_;
  std::vector<std::vector<float>> fetched_scratch_;
  std::vector<std::vector<const char*>> rows_at_;
  std::vector<std::vector<float>> owned_grads_scratch_;
  std::unique_ptr<NodeShuffle> node_;
  std::unique_ptr<RowSink> sink_;
  std::unique_ptr<EarlyFetch> early_;  // null: no early fetch
};

}  // namespace ember
