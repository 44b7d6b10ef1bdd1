// ember::StepMerger: the step pipelines of one trainer process (one per GPU)
// send one request per shard per step between them, instead of one each.
//
//   auto merger = *StepMerger::Create(client, {.ranks = 4, .worker_id = 0});
//   PipelineOptions o;  o.merger = merger.get();  o.merger_rank = r;  ...
//
// Every step, each rank's network thread hands its part (the gradients of
// an earlier step, the keys of a later one) to the merger and waits; the
// last rank to arrive merges the parts: the keys of every table are
// deduplicated over the ranks, the gradients of a key are summed over the
// ranks (in rank order), one Exchange goes to each shard, and each rank's
// rows are copied back to it. That is the in-process form of the node
// shuffle (ember/node_shuffle.h) without a transport: the ranks share
// memory.
//
// Consistency: the node is one worker of the SSP clock (`worker_id`,
// registered at Create, unregistered when the merger is destroyed); the
// ranks move in lockstep, so the merged step is every rank's step. The
// pipelines' own worker ids only label their metrics and timelines.
//
// Rules: the ranks make the same calls (Prefetch, Wait, Push, Flush, Close)
// in the same order, as with a node shuffle; a push goes out with the
// fetch queued right after it, or alone at Flush. A rank that waits longer
// than `timeout` for the others to arrive fails with DEADLINE_EXCEEDED
// naming the ranks missing, and so does every later call on the merger.
//
// Thread safety: Merge is called concurrently by the ranks' network
// threads; everything else from one thread. The merger must outlive its
// pipelines; `client` must outlive the merger.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ember/client.h"

namespace ember {

struct StepMergerOptions {
  int ranks = 1;          // pipelines sharing the merger, ranks 0 .. ranks - 1
  uint32_t worker_id = 0; // the node's worker id in every shard's SSP clock
  // SSP staleness of the node (every pipeline must use the same); negative:
  // asynchronous, no worker is registered.
  int staleness = 0;
  int64_t first_step = 0;
  absl::Duration timeout = absl::Seconds(60);
  // A fetched row narrower than this is copied, with the rank's other rows
  // of its table, into one dense block for pooling; a wider one is pooled
  // where it arrived in the shards' answers, not copied. At dim 8 (32-byte
  // rows) pooling from the answers cost 4-5% more CPU per step than the
  // copy; at dim 128 it saved 10% of the trainer's (docs/design.md).
  size_t copy_rows_below_bytes = 64;
  // At staleness 0: fetch the node's step t + 1 while step t computes and
  // bring it forward through step t's merged push (PipelineOptions::
  // early_fetch says when it applies); the pipelines then get their rows
  // before the merged exchange of push t returns.
  bool early_fetch = true;
  // PipelineOptions::early_fetch_patch, for the node.
  bool early_fetch_patch = true;
};

// Totals of a merger since creation (merged steps are rounds with a fetch).
struct StepMergerStats {
  int64_t rounds = 0;         // merged exchanges sent
  int64_t fetch_rounds = 0;   // of which carried a fetch
  uint64_t rank_keys = 0;     // unique keys the ranks asked for, summed over ranks
  uint64_t merged_keys = 0;   // keys fetched after merging
  // Ranks' push gradients summed while the round still waited for a rank
  // (off the critical path), out of ranks x pushing rounds.
  uint64_t ranks_summed_early = 0;
};

class StepMerger;

namespace internal {
class StepMergerImpl;  // client/internal/step_merger_impl.h
StepMergerImpl* MergerImpl(StepMerger* merger);
}  // namespace internal

class StepMerger {
 public:
  static absl::StatusOr<std::unique_ptr<StepMerger>> Create(Client* client,
                                                            StepMergerOptions options);
  // Unregisters the node's worker (best effort).
  ~StepMerger();
  StepMerger(const StepMerger&) = delete;
  StepMerger& operator=(const StepMerger&) = delete;

  const StepMergerOptions& options() const;
  StepMergerStats Stats() const;

 private:
  // The pipelines' way in (their ranks join and merge there).
  friend internal::StepMergerImpl* internal::MergerImpl(StepMerger* merger);
  explicit StepMerger(std::unique_ptr<internal::StepMergerImpl> impl);
  std::unique_ptr<internal::StepMergerImpl> impl_;
};

}  // namespace ember
