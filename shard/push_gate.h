// PushGate: what stands between a validated push and the rows it writes,
// shared by Shard::Push and the snapshot path (shard/shard_state.cc):
//   - a move's hold: from a move's cut until it is committed or aborted,
//     pushes past the cut, and every push of an unregistered worker, are
//     refused (UNAVAILABLE, which clients retry), so that none is applied
//     to tables the move replaces;
//   - the count of pushes of unregistered workers under way, which the cut
//     waits out (the SSP clock holds registered workers' pushes itself);
//   - the write log (shard/write_log.h): which rows recent pushes wrote,
//     kept while trainers peek.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "shard/write_log.h"

namespace ember {

class PushGate {
 public:
  // `write_log_keep`: see ShardOptions::write_log_keep.
  explicit PushGate(absl::Duration write_log_keep) : log_(write_log_keep) {}

  // One push between Enter and its end (the destructor): records its keys
  // (Record) before it writes rows.
  class Pass {
   public:
    Pass(Pass&& other) noexcept
        : gate_(other.gate_), untracked_(other.untracked_), unrecorded_(other.unrecorded_) {
      other.gate_ = nullptr;
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    Pass& operator=(Pass&&) = delete;
    ~Pass();
    // The push of `step` writes `keys` of `table`: in the write log while
    // it is kept (a tracked worker's push), before the clock counts it.
    void Record(const std::string& table, int64_t step, absl::Span<const uint64_t> keys);

   private:
    friend class PushGate;
    Pass(PushGate* gate, bool untracked, bool unrecorded)
        : gate_(gate), untracked_(untracked), unrecorded_(unrecorded) {}
    PushGate* gate_;
    bool untracked_;   // counted in untracked_ until the end
    bool unrecorded_;  // the write log was not kept when it began
  };

  // Lets a push of `worker` at `step` through, `tracked` by the SSP clock or
  // not; UNAVAILABLE, naming the cut and what to do, while a move's hold
  // refuses it. An untracked push makes the write log forget all (any row
  // may change).
  absl::StatusOr<Pass> Enter(uint32_t worker, int64_t step, bool tracked);

  // A move's cut in two steps: Hold refuses every push that Enter would not
  // let through under a cut (any step: the cut is not known yet) and waits
  // (until `deadline`) for the untracked ones under way; HoldPast(step)
  // then refuses only those past `step` (and untracked ones) until Release.
  absl::Status Hold(absl::Time deadline);
  void HoldPast(int64_t step);
  // Ends the hold; returns whether one was held.
  bool Release() { return held_.exchange(false); }
  bool held() const { return held_.load(); }

  WriteLog& log() { return log_; }
  const WriteLog& log() const { return log_; }

 private:
  std::atomic<bool> held_{false};    // between a move's cut and its end
  std::atomic<int64_t> cut_{-1};     // pushes past it are refused while held
  std::atomic<int> untracked_{0};    // pushes of unregistered workers under way
  WriteLog log_;
};

}  // namespace ember
