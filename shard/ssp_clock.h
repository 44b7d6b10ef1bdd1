// SspClock: the stale-synchronous-parallel clock of one shard.
//
// For every registered worker it tracks `applied`: the largest step s such
// that the worker's pushes for all steps <= s have been applied on this shard
// (pushes may complete out of order; later steps wait in a small set until
// the gap closes). A lookup for step t with staleness k waits until every
// registered worker's applied step is >= t - k - 1.
//
// A push goes through Begin (claims the (worker, step), refuses duplicates)
// then End (marks it applied, or releases the claim when it failed), so a
// retried push is applied at most once even while the first is in flight.
//
// Thread safety: every method may be called concurrently. Uses std::mutex and
// std::condition_variable (not absl::Mutex) so ThreadSanitizer sees them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember {

class SspClock {
 public:
  // Out-of-order steps a worker may have outstanding beyond its applied step;
  // a push further ahead is refused (the worker skipped a step).
  static constexpr int64_t kMaxStepsAhead = 4096;

  // Registers `worker` (or resets it) with pushes before `first_step` applied.
  // Returns the number of registered workers.
  size_t Register(uint32_t worker, int64_t first_step);
  // Returns whether the worker was registered.
  bool Unregister(uint32_t worker);

  enum class Claim { kUntracked, kClaimed, kDuplicate };
  // Claims (worker, step) for a push about to be applied. kUntracked when the
  // worker is not registered (apply it, the clock ignores it); kDuplicate when
  // the step is applied or in flight (do not apply). FAILED_PRECONDITION when
  // the step is more than kMaxStepsAhead past the worker's applied step.
  // DATA_LOSS, claiming nothing, when the worker's progress was restored
  // (Restore) and this, its first push since, skips steps past it: a
  // trainer pushes its steps in order, each once every shard acknowledged
  // the one before, so the skipped steps were acknowledged by this shard
  // before its state was lost, and the checkpoint lacks them.
  absl::Status Begin(uint32_t worker, int64_t step, Claim* claim);
  // DATA_LOSS when `worker`'s progress was restored, it has not pushed since,
  // and it asks for something (`what`, for the message) that needs its own
  // pushes up to `needed`, which the restored state lacks: a trainer sends a
  // lookup only once its pushes it needs were acknowledged, so they were
  // acknowledged by this shard before its state was lost.
  absl::Status CheckRestored(uint32_t worker, int64_t needed, absl::string_view what) const;
  // Ends a kClaimed push: `applied` marks it done and may advance the clock,
  // otherwise the claim is released so that a retry can apply it.
  void End(uint32_t worker, int64_t step, bool applied);

  // Blocks until every registered worker has applied step `required`, or
  // `deadline` passes (DEADLINE_EXCEEDED naming the worker that is behind).
  // `what` describes the waiting request in that message.
  absl::Status WaitFor(int64_t required, absl::Time deadline, const std::string& what);

  // The smallest applied step over registered workers (INT64_MAX if none).
  int64_t MinApplied() const;
  // Whether WaitFor(required) would return at once, counting `worker` as
  // having applied `pushed` too when `pushed` is set (a push about to be
  // applied before the wait). A hint: it may be false when a push in flight
  // would have made it true.
  bool Ready(int64_t required, std::optional<std::pair<uint32_t, int64_t>> pushed) const;
  // Each registered worker's applied step.
  std::map<uint32_t, int64_t> AppliedSteps() const;

  // What a worker has applied: every step <= applied, and the later steps
  // that completed out of order.
  struct Progress {
    int64_t applied = -1;
    std::vector<int64_t> done_ahead;  // ascending, all > applied + 1
  };
  // Each registered worker's progress (a checkpoint records it).
  std::map<uint32_t, Progress> Workers() const;
  // Registers `worker` (or resets it) with exactly `progress` (a restore), so
  // that a retry of any step it holds is a duplicate, and its next push is
  // checked for lost steps (Begin).
  void Restore(uint32_t worker, const Progress& progress);
  // The latest step any registered worker has applied or claimed; -1 if none.
  int64_t LatestStep() const;

  // A checkpoint's cut at `step`: from now until ReleaseHold, Begin blocks
  // for pushes of registered workers at steps > `step` (pushes of
  // unregistered workers are not held). FAILED_PRECONDITION, holding
  // nothing, if a registered worker has already applied or claimed a later
  // step; one hold at a time (the caller serialises checkpoints).
  absl::Status HoldAfter(int64_t step);
  void ReleaseHold();

 private:
  struct Worker {
    int64_t applied = -1;
    std::set<int64_t> done_ahead;  // applied steps > applied + 1
    std::set<int64_t> in_flight;   // claimed, not ended
    bool restored = false;         // by Restore, and no push claimed since
  };
  // The registered worker with the smallest applied step, or end().
  std::map<uint32_t, Worker>::const_iterator Slowest() const;

  // OK if the worker's pushes up to `needed` are applied or claimed, else
  // DATA_LOSS naming the lost steps.
  static absl::Status CheckKept(uint32_t worker, const Worker& w, int64_t needed,
                                absl::string_view what);
  // The largest step the worker has applied or claimed.
  static int64_t LatestOf(const Worker& w);

  mutable std::mutex mu_;
  std::condition_variable advanced_;
  std::condition_variable released_;
  std::map<uint32_t, Worker> workers_;
  bool holding_ = false;
  int64_t hold_step_ = 0;
};

}  // namespace ember
