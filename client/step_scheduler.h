// StepScheduler: the step rules of one StepPipeline, apart from its threads
// and its network, so that they can be tested alone: the order of
// Prefetch / Wait / Push, the prefetch depth, the SSP rule, and which push
// and fetch travel together in each exchange.
//
// It knows step numbers only; the pipeline keeps the steps' data. Not
// thread-safe: the pipeline calls it under its own mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember {

class StepScheduler {
 public:
  // How pushes and fetches are paired into exchanges.
  enum class Pairing {
    // A push waits up to push_hold for a fetch to go with; a fetch takes a
    // push queued behind it along. Fewest round trips; timing decides.
    kHold,
    // One job per exchange, in call order (node shuffle: every rank must
    // meet the others in the same collectives).
    kOneAtATime,
    // Pairs chosen by call order alone, never by timing (StepMerger: every
    // rank must offer the same exchanges): a push goes with the fetch queued
    // right after it, and waits for the next call to know.
    kCallOrder,
  };
  struct Options {
    int64_t first_step = 0;
    int depth = 1;       // steps fetched ahead of the one computing
    int staleness = 0;   // SSP s; negative: asynchronous
    // Early fetch (s = 0, client/early_fetch.h): a fetch of step t goes once
    // this worker's push of t - 2 is applied, one step before SSP needs;
    // the pipeline brings its rows forward through push t - 1 itself.
    bool early_fetch = false;
    Pairing pairing = Pairing::kHold;
    absl::Duration push_hold = absl::Milliseconds(2);
  };
  // One Exchange call (the RPC, EmbeddingService.Exchange): the gradients
  // of `push` and/or the rows of `fetch`.
  struct Exchange {
    std::optional<int64_t> push;
    std::optional<int64_t> fetch;
  };
  struct Decision {
    enum class Kind {
      kSend,       // send `exchange`
      kWait,       // nothing to do until the next call
      kWaitUntil,  // nothing until `until` or the next call
      kStop,       // stopping: `dropped` fetches will never be sent
    } kind = Kind::kWait;
    Exchange exchange;
    absl::Time until;
    std::vector<int64_t> dropped;
  };

  explicit StepScheduler(const Options& options);

  // The calls' rules: OK, or FAILED_PRECONDITION saying expected vs.
  // received; the state is unchanged either way. On* records a call that
  // passed its check (Prefetch and Push queue a job).
  absl::Status CheckPrefetch(int64_t step) const;
  void OnPrefetch(absl::Time now);
  absl::Status CheckWait(int64_t step) const;
  void OnWait();
  absl::Status CheckPush(int64_t step) const;
  void OnPush(absl::Time now);

  // What the network thread does next; kSend takes the jobs off the queue.
  // `flushing`: a Flush or Close waits, so a held push goes out now.
  Decision Next(absl::Time now, bool flushing, bool stopping);
  // The exchange Next handed out is done (ok: the shards applied its push).
  void OnSent(const Exchange& exchange, bool ok);

  int64_t next_prefetch() const { return next_prefetch_; }
  int64_t next_wait() const { return next_wait_; }
  int64_t next_push() const { return next_push_; }
  // This worker's pushes are applied up to this step.
  int64_t pushed_upto() const { return pushed_upto_; }
  // Pushes queued or being sent.
  int pushes_in_flight() const { return pushes_in_flight_; }

 private:
  struct Job {
    bool push;
    int64_t step;
    absl::Time queued;
  };
  Options options_;
  std::deque<Job> jobs_;  // in call order
  int64_t next_prefetch_, next_wait_, next_push_;
  int64_t pushed_upto_;
  int pushes_in_flight_ = 0;
};

}  // namespace ember
