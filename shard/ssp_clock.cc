#include "shard/ssp_clock.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ember {

size_t SspClock::Register(uint32_t worker, int64_t first_step) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_[worker] = Worker{first_step - 1, {}, {}};
  advanced_.notify_all();
  return workers_.size();
}

bool SspClock::Unregister(uint32_t worker) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool erased = workers_.erase(worker) > 0;
  advanced_.notify_all();  // the waiters may have been waiting for it
  released_.notify_all();  // and a held push of it is no longer tracked
  return erased;
}

absl::Status SspClock::CheckKept(uint32_t worker, const Worker& w, int64_t needed,
                                 absl::string_view what) {
  const int64_t latest = LatestOf(w);
  if (needed <= latest) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "worker ", worker, " ", what, ", so this shard acknowledged its pushes up to step ", needed,
      " before, but its restored state holds them only up to step ", latest,
      ": its pushes of steps ", latest + 1, " to ", needed,
      " were lost with the shard's state. Restore every shard from one cluster checkpoint and "
      "restart the trainer after that checkpoint's step (docs/operations.md, \"Replacing a lost "
      "shard\")"));
}

absl::Status SspClock::CheckRestored(uint32_t worker, int64_t needed,
                                     absl::string_view what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.restored) return absl::OkStatus();
  return CheckKept(worker, it->second, needed, what);
}

absl::Status SspClock::Begin(uint32_t worker, int64_t step, Claim* claim) {
  std::unique_lock<std::mutex> lock(mu_);
  // A checkpoint's cut holds later steps back until its copy is taken. The
  // worker is looked up again after the wait: it may have left meanwhile.
  released_.wait(lock, [&] {
    return !holding_ || step <= hold_step_ || workers_.find(worker) == workers_.end();
  });
  auto it = workers_.find(worker);
  if (it == workers_.end()) {
    *claim = Claim::kUntracked;
    return absl::OkStatus();
  }
  Worker& w = it->second;
  if (step <= w.applied || w.done_ahead.count(step) || w.in_flight.count(step)) {
    *claim = Claim::kDuplicate;
    return absl::OkStatus();
  }
  if (w.restored) {
    EMBER_RETURN_IF_ERROR(CheckKept(worker, w, step - 1, absl::StrCat("pushes step ", step)));
    w.restored = false;
  }
  // step > applied >= -1 here; their difference as int64 overflows for
  // step near 2^63 (2^63 - 1 - (-1)), as uint64 it does not.
  if (static_cast<uint64_t>(step) - static_cast<uint64_t>(w.applied) >
      static_cast<uint64_t>(kMaxStepsAhead)) {
    const int64_t most = w.applied > std::numeric_limits<int64_t>::max() - kMaxStepsAhead
                             ? std::numeric_limits<int64_t>::max()
                             : w.applied + kMaxStepsAhead;
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " field 'step': expected at most ", most,
        " (its pushes are applied up to step ", w.applied, "; every step must be pushed), received ",
        step));
  }
  w.in_flight.insert(step);
  *claim = Claim::kClaimed;
  return absl::OkStatus();
}

void SspClock::End(uint32_t worker, int64_t step, bool applied) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return;  // unregistered meanwhile
  Worker& w = it->second;
  if (w.in_flight.erase(step) == 0) return;  // re-registered meanwhile
  if (!applied) return;
  if (step != w.applied + 1) {
    w.done_ahead.insert(step);
    return;
  }
  w.applied = step;
  while (!w.done_ahead.empty() && *w.done_ahead.begin() == w.applied + 1) {
    w.applied = *w.done_ahead.begin();
    w.done_ahead.erase(w.done_ahead.begin());
  }
  advanced_.notify_all();
}

std::map<uint32_t, SspClock::Worker>::const_iterator SspClock::Slowest() const {
  auto slowest = workers_.end();
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (slowest == workers_.end() || it->second.applied < slowest->second.applied) slowest = it;
  }
  return slowest;
}

int64_t SspClock::MinApplied() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto slowest = Slowest();
  return slowest == workers_.end() ? std::numeric_limits<int64_t>::max()
                                   : slowest->second.applied;
}

bool SspClock::Ready(int64_t required,
                     std::optional<std::pair<uint32_t, int64_t>> pushed) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, w] : workers_) {
    int64_t applied = w.applied;
    // The pushed step counts when it is the worker's next one.
    if (pushed && pushed->first == id && pushed->second == applied + 1) applied = pushed->second;
    if (applied < required) return false;
  }
  return true;
}

absl::Status SspClock::WaitFor(int64_t required, absl::Time deadline, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] {
    auto slowest = Slowest();
    return slowest == workers_.end() || slowest->second.applied >= required;
  };
  if (deadline == absl::InfiniteFuture()) {
    advanced_.wait(lock, ready);
    return absl::OkStatus();
  }
  if (advanced_.wait_until(lock, absl::ToChronoTime(deadline), ready)) return absl::OkStatus();
  auto slowest = Slowest();
  return absl::DeadlineExceededError(absl::StrCat(
      what, " needs every worker's pushes up to step ", required, " applied on this shard; worker ",
      slowest->first, " is behind: applied up to step ", slowest->second.applied));
}

int64_t SspClock::LatestOf(const Worker& w) {
  int64_t latest = w.applied;
  if (!w.done_ahead.empty()) latest = std::max(latest, *w.done_ahead.rbegin());
  if (!w.in_flight.empty()) latest = std::max(latest, *w.in_flight.rbegin());
  return latest;
}

int64_t SspClock::LatestStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t latest = -1;
  for (const auto& [id, w] : workers_) latest = std::max(latest, LatestOf(w));
  return latest;
}

absl::Status SspClock::HoldAfter(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, w] : workers_) {
    if (LatestOf(w) > step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "field 'step': cannot cut at step ", step, ": worker ", id,
          " has already pushed step ", LatestOf(w), " on this shard"));
    }
  }
  holding_ = true;
  hold_step_ = step;
  return absl::OkStatus();
}

void SspClock::ReleaseHold() {
  std::lock_guard<std::mutex> lock(mu_);
  holding_ = false;
  released_.notify_all();
}

std::map<uint32_t, SspClock::Progress> SspClock::Workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uint32_t, Progress> out;
  for (const auto& [id, w] : workers_) {
    out[id] = Progress{w.applied, std::vector<int64_t>(w.done_ahead.begin(), w.done_ahead.end())};
  }
  return out;
}

void SspClock::Restore(uint32_t worker, const Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_[worker] =
      Worker{progress.applied,
             std::set<int64_t>(progress.done_ahead.begin(), progress.done_ahead.end()),
             {},
             /*restored=*/true};
  advanced_.notify_all();
}

std::map<uint32_t, int64_t> SspClock::AppliedSteps() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uint32_t, int64_t> out;
  for (const auto& [id, w] : workers_) out[id] = w.applied;
  return out;
}

}  // namespace ember
