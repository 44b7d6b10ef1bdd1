// The in-process ShuffleTransport: ranks are threads of one process that
// meet at a shared mailbox. Each AllToAll is one round: every rank posts its
// blocks, waits until all have posted, takes its column, and waits until all
// have taken theirs before the mailbox is reused.
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "ember/node_shuffle.h"

namespace ember {
namespace {

// How long a rank waits for the others in one round before giving up; the
// group is broken after that (a rank failed or stopped calling).
constexpr auto kRoundTimeout = std::chrono::seconds(60);

class Mailbox {
 public:
  explicit Mailbox(uint32_t size) : size_(size), slots_(size, std::vector<std::vector<uint8_t>>(size)) {}

  absl::Status AllToAll(uint32_t rank, const std::vector<std::vector<uint8_t>>& send,
                        std::vector<std::vector<uint8_t>>* recv) {
    if (send.size() != size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in-process transport: field 'send': expected ", size_, " blocks, received ",
          send.size()));
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Phase 1: post.
    const uint64_t round = round_;
    slots_[rank] = send;
    if (++posted_ == size_) {
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, kRoundTimeout, [&] { return posted_ == size_ || broken_; }) ||
               broken_) {
      broken_ = true;
      cv_.notify_all();
      return Broken(rank, round);
    }
    // Phase 2: take this rank's column.
    recv->assign(size_, {});
    for (uint32_t s = 0; s < size_; ++s) (*recv)[s] = std::move(slots_[s][rank]);
    if (++taken_ == size_) {
      posted_ = 0;
      taken_ = 0;
      ++round_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, kRoundTimeout, [&] { return round_ != round || broken_; }) ||
               broken_) {
      broken_ = true;
      cv_.notify_all();
      return Broken(rank, round);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Broken(uint32_t rank, uint64_t round) const {
    return absl::DeadlineExceededError(absl::StrCat(
        "in-process transport: rank ", rank, " waited over ", kRoundTimeout.count(),
        " s for the other ranks in round ", round, " (", posted_, " of ", size_,
        " posted); the group is unusable"));
  }

  const uint32_t size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::vector<uint8_t>>> slots_ ABSL_GUARDED_BY(mu_);  // [source][destination]
  uint32_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

class InProcessTransport final : public ShuffleTransport {
 public:
  InProcessTransport(std::shared_ptr<Mailbox> box, uint32_t rank, uint32_t size)
      : box_(std::move(box)), rank_(rank), size_(size) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  absl::Status AllToAll(const std::vector<std::vector<uint8_t>>& send,
                        std::vector<std::vector<uint8_t>>* recv) override {
    return box_->AllToAll(rank_, send, recv);
  }

 private:
  std::shared_ptr<Mailbox> box_;
  const uint32_t rank_;
  const uint32_t size_;
};

}  // namespace

std::vector<std::unique_ptr<ShuffleTransport>> NewInProcessTransports(uint32_t size) {
  auto box = std::make_shared<Mailbox>(size);
  std::vector<std::unique_ptr<ShuffleTransport>> out;
  for (uint32_t r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessTransport>(box, r, size));
  return out;
}

}  // namespace ember
