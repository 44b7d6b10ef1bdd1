#include "client/step_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ember {

StepScheduler::StepScheduler(const Options& options)
    : options_(options),
      next_prefetch_(options.first_step),
      next_wait_(options.first_step),
      next_push_(options.first_step),
      pushed_upto_(options.first_step - 1) {}

absl::Status StepScheduler::CheckPrefetch(int64_t step) const {
  if (step != next_prefetch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Prefetch: expected step ", next_prefetch_, ", received ", step));
  }
  if (next_prefetch_ - next_push_ > options_.depth) {
    return absl::FailedPreconditionError(absl::StrCat("Prefetch of step ", step,
                                                      ": prefetch depth is ", options_.depth,
                                                      " and step ", next_push_,
                                                      " is not pushed yet"));
  }
  return absl::OkStatus();
}

void StepScheduler::OnPrefetch(absl::Time now) {
  jobs_.push_back({/*push=*/false, next_prefetch_++, now});
}

absl::Status StepScheduler::CheckWait(int64_t step) const {
  if (step != next_wait_ || step >= next_prefetch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Wait: expected step ", next_wait_,
                     next_wait_ >= next_prefetch_ ? " (prefetch it first)" : "", ", received ",
                     step));
  }
  if (options_.staleness >= 0 && step - options_.staleness - 1 >= next_push_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Wait for step ", step, " with staleness ", options_.staleness,
        " needs this worker's push of step ", step - options_.staleness - 1, " first"));
  }
  return absl::OkStatus();
}

void StepScheduler::OnWait() { ++next_wait_; }

absl::Status StepScheduler::CheckPush(int64_t step) const {
  if (step != next_push_ || step >= next_wait_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Push: expected step ", next_push_, next_push_ >= next_wait_ ? " (wait for it first)" : "",
        ", received ", step));
  }
  return absl::OkStatus();
}

void StepScheduler::OnPush(absl::Time now) {
  jobs_.push_back({/*push=*/true, next_push_++, now});
  ++pushes_in_flight_;
}

StepScheduler::Decision StepScheduler::Next(absl::Time now, bool flushing, bool stopping) {
  Decision d;
  if (stopping) {
    // Close flushed first, so no push is queued; if one were, it still goes.
    d.kind = Decision::Kind::kStop;
    for (const Job& j : jobs_) {
      if (!j.push) {
        d.dropped.push_back(j.step);
      } else if (!d.exchange.push) {
        d.exchange.push = j.step;
      }
    }
    jobs_.clear();
    return d;
  }
  if (jobs_.empty()) return d;  // kWait
  const Job front = jobs_.front();
  const Job* next = jobs_.size() > 1 ? &jobs_[1] : nullptr;
  const Pairing pairing = options_.pairing;
  auto send = [&](std::optional<int64_t> push, std::optional<int64_t> fetch) {
    d.kind = Decision::Kind::kSend;
    d.exchange = {push, fetch};
    return d;
  };

  if (front.push) {
    if (pairing == Pairing::kOneAtATime) {
      jobs_.pop_front();
      return send(front.step, std::nullopt);
    }
    if (next != nullptr && !next->push) {
      const int64_t fetch = next->step;
      jobs_.erase(jobs_.begin(), jobs_.begin() + 2);
      return send(front.step, fetch);
    }
    if (!flushing && next == nullptr) {
      if (pairing == Pairing::kCallOrder) return d;  // kWait: the next call decides
      const absl::Time until = front.queued + options_.push_hold;
      if (now < until) {
        d.kind = Decision::Kind::kWaitUntil;
        d.until = until;
        return d;
      }
    }
    jobs_.pop_front();
    return send(front.step, std::nullopt);
  }

  // The front is a fetch. Queued pushes all belong to earlier steps
  // (Push(x) needs Wait(x), so every fetch up to x is done).
  auto first_push =
      std::find_if(jobs_.begin() + 1, jobs_.end(), [](const Job& j) { return j.push; });
  if (options_.staleness >= 0) {
    // SSP: the fetch of step t waits for this worker's push of t - s - 1,
    // or the shard would hold the lookup until it came (an early fetch: of
    // t - s - 2).
    const int64_t needed = front.step - options_.staleness - 1 - (options_.early_fetch ? 1 : 0);
    if (needed > pushed_upto_) {
      if (first_push == jobs_.end()) return d;  // kWait: not pushed yet
      const int64_t push = first_push->step;
      jobs_.erase(first_push);
      if (pairing != Pairing::kOneAtATime && push >= needed) {
        jobs_.pop_front();
        return send(push, front.step);
      }
      return send(push, std::nullopt);
    }
  }
  // Only kHold takes a push queued behind the fetch along: with the others
  // a push queued a moment later would pair on one rank and not another.
  std::optional<int64_t> push;
  if (pairing == Pairing::kHold && first_push != jobs_.end()) {
    push = first_push->step;
    jobs_.erase(first_push);
  }
  jobs_.pop_front();
  return send(push, front.step);
}

void StepScheduler::OnSent(const Exchange& exchange, bool ok) {
  if (!exchange.push) return;
  --pushes_in_flight_;
  if (ok) pushed_upto_ = *exchange.push;
}

}  // namespace ember
