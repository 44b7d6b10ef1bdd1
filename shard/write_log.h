// Which keys the pushes of recent steps wrote, per table: what lets a
// synchronous trainer that peeked a step's rows early fetch, after the
// barrier, only the rows other workers' pushes changed since
// (TableLookup.changed_since).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ember {

// Kept only while trainers peek: the first peek (PeekToken) starts the
// record, and `keep` after the last peek the record stops and is dropped,
// so that a cluster that never early-fetches copies no push's keys. Pushes
// ask BeginPush whether to Record.
//
// Thread-safe. Memory: one copy of every recorded push's keys, for the
// steps not yet forgotten (the shard forgets those below every registered
// worker's applied step, which no lookup can ask about any more).
class WriteLog {
 public:
  // `keep`: how long the record is kept after the last peek
  // (absl::InfiniteDuration(): from the start, always).
  explicit WriteLog(absl::Duration keep = absl::Seconds(60));

  // A push of a tracked worker is about to apply: true if it must Record
  // its tables' keys first; false if the log is not kept now, and then the
  // push must call EndUnrecorded once its rows are written.
  bool BeginPush();
  void EndUnrecorded();

  // A push of `step` wrote `keys` of `table`. Call before the push counts
  // as applied (SspClock::End), so that a lookup the clock lets through
  // finds it.
  void Record(const std::string& table, int64_t step, absl::Span<const uint64_t> keys);

  // Forgets the pushes of steps below `step`; later questions about them
  // get no answer.
  void Forget(int64_t step);

  // Rows changed in a way not recorded (a push of a worker the clock does
  // not track, a table dropped or created, a worker registered, which may
  // push steps older than a peek waited for): no answer to any question a
  // trainer that read rows before now could ask. Changes token().
  void ForgetAll();

  // Names the record as it is now: random at start (so a restarted shard's
  // differs), new at every ForgetAll and whenever the record stops. Never 0.
  uint64_t token() const;
  // For a peek, before it reads any row: keeps the record from now on (see
  // above) and returns token(), which the trainer hands back with its
  // question; or 0, which no question can use, while a push that began
  // unrecorded is still writing rows the peek might miss.
  uint64_t PeekToken();

  // Fills `changed` with one byte per key: 1 if a recorded push of a step
  // >= `since` wrote it, else 0; returns the number of 1s. False (and
  // `changed` untouched) if `token` is not token() or pushes of steps >=
  // since may have been forgotten.
  bool Changed(const std::string& table, int64_t since, uint64_t token,
               absl::Span<const uint64_t> keys, std::string* changed, uint64_t* count) const;

 private:
  struct Push {
    int64_t step;
    std::vector<uint64_t> keys;
  };
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::deque<Push>> tables_ ABSL_GUARDED_BY(mu_);
  // Starts a new record: a new token (never 0), nothing recorded.
  void RestartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration keep_;
  int64_t forgotten_below_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::min();
  uint64_t token_ ABSL_GUARDED_BY(mu_);
  bool kept_ ABSL_GUARDED_BY(mu_);           // recording now
  absl::Time last_peek_ ABSL_GUARDED_BY(mu_);
  int unrecorded_ ABSL_GUARDED_BY(mu_) = 0;  // pushes writing rows unrecorded
};

}  // namespace ember
