// The StepMerger's rounds (ember/step_merger.h says what it does): the
// ranks' pipelines join it and hand it their part of each step. Internal to
// the client library: StepPipeline reaches it through MergerImpl.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "client/request_plan.h"
#include "ember/client.h"
#include "ember/step_merger.h"

namespace ember {

class KeyDeduplicator;  // client/dedup.h
class EarlyFetch;       // client/early_fetch.h

namespace internal {

class StepMergerImpl {
 public:
  // Registers the node's worker unless asynchronous (StepMerger::Create).
  StepMergerImpl(Client* client, StepMergerOptions options);
  absl::Status Register();
  // Unregisters the node's worker (best effort).
  ~StepMergerImpl();

  const StepMergerOptions& options() const { return options_; }
  StepMergerStats Stats() const;

  // For StepPipeline. A rank's tables (names and dims, in the pipeline's
  // order): every rank must have the same; FAILED_PRECONDITION otherwise.
  absl::Status Join(int rank, const std::vector<std::string>& tables,
                    const std::vector<uint32_t>& dims);

  // One rank's share of a merged exchange. Pointers stay valid until
  // Merge returns. Per table, `keys[tb]` are the rank's unique keys of
  // the fetched step; `grads[tb]` holds one gradient row per unique key of
  // the pushed step (the keys the rank fetched for that step, in the same
  // order).
  struct Part {
    std::optional<int64_t> push_step;
    std::vector<const float*> grads;
    std::optional<int64_t> fetch_step;
    const std::vector<std::vector<uint64_t>>* keys = nullptr;
    // Out: the step whose rows rows_at holds: the fetched step, or, with
    // early fetch, the step after the pushed one when it had to be fetched
    // after the push (`refetched`); none when the fetch was an early peek.
    // rows_at[tb][k] is the address of key k's row (dim floats, any
    // alignment: read as bytes) in the shards' answers, which the merger
    // keeps until this rank's next Merge.
    std::optional<int64_t> rows_step;
    std::vector<std::vector<const char*>> rows_at;
    bool refetched = false;
    // Of a refetched step: the node's rows that came after the push (the
    // rest as peeked) and its merged keys.
    uint64_t refetched_rows = 0;
    uint64_t refetched_keys = 0;
    // Early fetch (StepMergerOptions::early_fetch): when the step after
    // push_step is brought forward, the merger sets patched_at (this rank's
    // rows of it by address, valid until this rank's next Merge) and calls
    // on_patched(step, rows patched, start) once, from the thread of one of
    // the round's ranks (any), before the merged exchange goes out, while
    // this rank's thread waits in Merge or makes that very call (so it may
    // use what that thread owns); its error fails the round.
    std::function<absl::Status(int64_t, uint64_t, absl::Time)> on_patched;
    std::vector<std::vector<const char*>> patched_at;
    // Out: bytes of the early fetch's answer, shared evenly over the ranks.
    uint64_t peek_bytes = 0;
    // Out: payload bytes of the merged requests and responses, shared
    // evenly over the ranks.
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    // Out, on the part of the rank that led the round only (for its
    // timeline): when it summed the gradients of the ranks not summed
    // before it arrived, and, with early fetch, when it brought the next
    // step's rows forward (the optimizer update; their delivery follows).
    absl::Time sum_start, sum_end, update_start, update_end;
  };
  // Blocks until every rank has handed its part and the merged exchange is
  // done; returns its status (the same for every rank).
  absl::Status Merge(int rank, Part* part);

 private:
  struct MergedStep;
  // The leader's work, on the parts of one round, whose ranks below
  // `summed` are summed already (SumArrived); no lock held.
  absl::Status RunRound(int leader, const std::vector<Part*>& parts, int summed);
  // Adds the push gradients of the ranks that have arrived to the sums in
  // the prepared push requests, in rank order from summed_ranks_ on while
  // the next rank's part is here, so that the last rank to arrive has only
  // the rest left to sum; rank order keeps the sums' bits independent of
  // who arrives when. Called by an arriving rank holding `lock`, which it
  // gives up while it sums; one summer at a time.
  void SumArrived(std::unique_lock<std::mutex>& lock);
  // Returns, holding `lock`, once no thread is summing (the leader before
  // its round; a rank leaving a failed round, whose part a summer may read).
  void AwaitSummer(std::unique_lock<std::mutex>& lock);
  // Adds rank r's gradients of the pushed step to the sums (rank 0 writes
  // them). The caller is the round's only summer.
  void SumRank(int r, const Part& part);
  // Early fetch: brings the step after the round's push forward and hands
  // each rank its rows (true), or leaves it to be fetched after the push
  // (false). Adds the lookup of that step to `requests`.
  absl::StatusOr<bool> PatchNext(int leader, const std::vector<Part*>& parts, int64_t step,
                                 std::vector<v1::ExchangeRequest>* requests);
  // Early fetch: one rank's patched rows delivered by this thread (of rank
  // `rank`, which holds `lock` on mu_ and gets it back), its own rank's if
  // still unclaimed, else the next unclaimed one; false if none is left.
  bool DeliverShare(int rank, std::unique_lock<std::mutex>& lock);
  absl::Status CheckInStep(const std::vector<Part*>& parts) const;
  // The push part of `step`'s exchange, one request per shard: keys and
  // room for the gradient sums, whose addresses go to sum_at_. Returns
  // the payload bytes; INTERNAL if the step was never fetched.
  absl::StatusOr<uint64_t> PreparePush(int64_t step, std::vector<v1::ExchangeRequest>* requests);
  // The round's fetch: the ranks' keys deduplicated into one merged step
  // (kept in steps_ until its push) and routed; counts it in the stats.
  MergedStep* MergeFetch(const std::vector<Part*>& parts);
  // Hands each rank its rows of `step` from the round's answers (answers_)
  // by address, as `with_rows` maps them; with `peeked`, the step was
  // refetched over its peek (only changed rows came). Adds the row bytes
  // to *received.
  absl::Status HandOutRows(const std::vector<Part*>& parts, int64_t step,
                           const MergedStep& with_rows, const std::vector<const float*>* peeked,
                           uint64_t* received);

  Client* const client_;
  const StepMergerOptions options_;
  const LookupClock clock_{options_.staleness, options_.worker_id};
  bool registered_ = false;
  std::vector<std::string> tables_;
  std::vector<uint32_t> dims_;
  std::vector<bool> joined_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // This round's parts, by rank; null: not arrived.
  std::vector<Part*> parts_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  // The last rank to arrive runs the round.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // rounds completed
  absl::Status round_status_ ABSL_GUARDED_BY(mu_);  // of the last completed round
  absl::Status failed_ ABSL_GUARDED_BY(mu_);        // sticky: a rank timed out
  StepMergerStats stats_ ABSL_GUARDED_BY(mu_);
  // This round's ranks summed so far (SumArrived), and whether a thread is
  // summing now.
  int summed_ranks_ ABSL_GUARDED_BY(mu_) = 0;
  bool summing_ ABSL_GUARDED_BY(mu_) = false;
  // The patched step's rows being handed to the ranks (PatchNext); null
  // when none is. The leader sets it up and waits until every rank's is done.
  struct Delivery {
    int64_t step = 0;
    std::vector<const float*> rows;  // [table], merged key order
    uint64_t rows_patched = 0;
    absl::Time start;
    const MergedStep* next = nullptr;
    std::vector<Part*> parts;
    std::vector<bool> claimed;  // by rank
    int done = 0;
    absl::Status status;  // the first failure
    int unclaimed() const {
      int n = 0;
      for (bool c : claimed) n += !c;
      return n;
    }
  };
  std::unique_ptr<Delivery> delivery_ ABSL_GUARDED_BY(mu_);
  // Leader-only state (one leader at a time): each fetched step's merged
  // keys and maps, kept until the step's push.
  std::map<int64_t, std::unique_ptr<MergedStep>> steps_;
  // Early fetch at s = 0 (null: off), created at the first Join; the
  // node's pushes applied up to this step.
  std::unique_ptr<EarlyFetch> early_;
  int64_t applied_upto_ = -1;
  // Leader-only scratch, reused by every round so that a round allocates
  // nothing once warm: the deduplicator of the ranks' keys and, per table,
  // the address of each merged key's gradient sum in the push requests and
  // of its row in the shards' responses.
  std::unique_ptr<KeyDeduplicator> dedup_;
  std::vector<std::vector<float*>> sum_at_;
  // The next push's requests (PreparePush), made at the end of the round
  // before it; sum_at_ points into them.
  std::vector<v1::ExchangeRequest> prepared_;
  std::optional<int64_t> prepared_push_;
  uint64_t prepared_bytes_ = 0;
  // Per table, per merged key of the pushed step: no rank's row added yet.
  std::vector<std::vector<uint8_t>> fresh_;
  std::vector<std::vector<const char*>> row_at_;
  // The last round's answers, which the ranks' rows_at point into: kept
  // until the next round, which starts only once every rank is done with
  // them (it has called Merge again).
  std::vector<ExchangeAnswer> answers_;
  // Per rank and table, the rows copied (options_.copy_rows_below_bytes).
  std::vector<std::vector<std::vector<char>>> rank_rows_;
};

}  // namespace internal
}  // namespace ember
