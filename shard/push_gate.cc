#include "shard/push_gate.h"

#include "absl/strings/str_cat.h"

namespace ember {

PushGate::Pass::~Pass() {
  if (gate_ == nullptr) return;
  if (untracked_) gate_->untracked_.fetch_sub(1);
  if (unrecorded_) gate_->log_.EndUnrecorded();
}

void PushGate::Pass::Record(const std::string& table, int64_t step,
                            absl::Span<const uint64_t> keys) {
  if (untracked_ || unrecorded_) return;
  gate_->log_.Record(table, step, keys);
}

absl::StatusOr<PushGate::Pass> PushGate::Enter(uint32_t worker, int64_t step, bool tracked) {
  // Counted before the hold is read: a cut that finds none under way has
  // made every later untracked push see its hold.
  if (!tracked) untracked_.fetch_add(1);
  Pass pass(this, !tracked, false);
  if (held_.load() && (!tracked || step > cut_.load())) {
    return absl::UnavailableError(absl::StrCat(
        "Push: a move of the cluster to another shard count holds this shard's pushes past step ",
        cut_.load(), " (its cut); worker ", worker, " step ", step,
        tracked ? "" : " (not registered)",
        " was not applied. Retry: once the move is committed, the cluster refuses it with ABORTED "
        "and the client connects again"));
  }
  if (tracked) {
    pass.unrecorded_ = !log_.BeginPush();
  } else {
    log_.ForgetAll();  // an untracked worker's push: any row may change
  }
  return pass;
}

absl::Status PushGate::Hold(absl::Time deadline) {
  cut_.store(-1);
  held_.store(true);
  while (untracked_.load() > 0) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          "a move's cut: pushes of unregistered workers still under way at the deadline");
    }
    absl::SleepFor(absl::Microseconds(100));
  }
  return absl::OkStatus();
}

void PushGate::HoldPast(int64_t step) {
  cut_.store(step);
  held_.store(true);
}

}  // namespace ember
