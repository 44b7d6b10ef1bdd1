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
// exchange (ember/node_exchange.h) without a transport: the ranks share
// memory.
//
// Consistency: the node is one worker of the SSP clock (`worker_id`,
// registered at Create, unregistered when the merger is destroyed); the
// ranks move in lockstep, so the merged step is every rank's step. The
// pipelines' own worker ids only label their metrics and timelines.
//
// Rules: the ranks make the same calls (Prefetch, Wait, Push, Flush, Close)
// in the same order, as with a node exchange; a push goes out with the
// fetch queued right after it, or alone at Flush. A rank that waits longer
// than `timeout` for the others to arrive fails with DEADLINE_EXCEEDED
// naming the ranks missing, and so does every later call on the merger.
//
// Thread safety: Exchange is called concurrently by the ranks' network
// threads; everything else from one thread. The merger must outlive its
// pipelines; `client` must outlive the merger.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ember/client.h"

namespace ember {

class KeyDeduplicator;  // client/dedup.h

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
};

// Totals of a merger since creation (merged steps are rounds with a fetch).
struct StepMergerStats {
  int64_t rounds = 0;         // merged exchanges sent
  int64_t fetch_rounds = 0;   // of which carried a fetch
  uint64_t rank_keys = 0;     // unique keys the ranks asked for, summed over ranks
  uint64_t merged_keys = 0;   // keys fetched after merging
};

class StepMerger {
 public:
  static absl::StatusOr<std::unique_ptr<StepMerger>> Create(Client* client,
                                                            StepMergerOptions options);
  // Unregisters the node's worker (best effort).
  ~StepMerger();
  StepMerger(const StepMerger&) = delete;
  StepMerger& operator=(const StepMerger&) = delete;

  const StepMergerOptions& options() const { return options_; }
  StepMergerStats Stats() const;

  // For StepPipeline. A rank's tables (names and dims, in the pipeline's
  // order): every rank must have the same; FAILED_PRECONDITION otherwise.
  absl::Status Join(int rank, const std::vector<std::string>& tables,
                    const std::vector<uint32_t>& dims);

  // One rank's share of a merged exchange. Pointers stay valid until
  // Exchange returns. Per table, `keys[tb]` are the rank's unique keys of
  // the fetched step; `grads[tb]` holds one gradient row per unique key of
  // the pushed step (the keys the rank fetched for that step, in the same
  // order).
  struct Part {
    std::optional<int64_t> push_step;
    std::vector<const float*> grads;
    std::optional<int64_t> fetch_step;
    const std::vector<std::vector<uint64_t>>* keys = nullptr;
    // Out: rows_at[tb][k] is the address of key k's row (dim floats, any
    // alignment: read as bytes) in the shards' answers, which the merger
    // keeps until this rank's next Exchange.
    std::vector<std::vector<const char*>> rows_at;
    // Out: payload bytes of the merged requests and responses, shared
    // evenly over the ranks.
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  // Blocks until every rank has handed its part and the merged exchange is
  // done; returns its status (the same for every rank).
  absl::Status Exchange(int rank, Part* part);

 private:
  struct MergedStep;
  StepMerger(Client* client, StepMergerOptions options);
  // The leader's work, on the parts of one round; no lock held.
  absl::Status RunRound(const std::vector<Part*>& parts);
  absl::Status CheckInStep(const std::vector<Part*>& parts) const;

  Client* const client_;
  const StepMergerOptions options_;
  bool registered_ = false;
  std::vector<std::string> tables_;
  std::vector<uint32_t> dims_;
  std::vector<bool> joined_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Part*> parts_;          // this round's, by rank; null: not arrived
  int arrived_ = 0;
  bool running_ = false;              // the last rank to arrive runs the round
  uint64_t generation_ = 0;           // rounds completed
  absl::Status round_status_;         // of the last completed round
  absl::Status failed_;               // sticky: a rank timed out
  StepMergerStats stats_;
  // Leader-only state (one leader at a time): each fetched step's merged
  // keys and maps, kept until the step's push.
  std::map<int64_t, std::unique_ptr<MergedStep>> steps_;
  // Leader-only scratch, reused by every round so that a round allocates
  // nothing once warm: the deduplicator of the ranks' keys and, per table,
  // the address of each merged key's gradient sum in the push requests and
  // of its row in the shards' responses.
  std::unique_ptr<KeyDeduplicator> dedup_;
  std::vector<std::vector<float*>> sum_at_;
  std::vector<uint8_t> fresh_;  // per merged key of a table: no rank's row added yet
  std::vector<std::vector<const char*>> row_at_;
  // The last round's answers, which the ranks' rows_at point into: kept
  // until the next round, which starts only once every rank is done with
  // them (it has called Exchange again).
  std::vector<ExchangeAnswer> answers_;
  // Per rank and table, the rows copied (options_.copy_rows_below_bytes).
  std::vector<std::vector<std::vector<char>>> rank_rows_;
};

}  // namespace ember
