#include "shard/work_pool.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

// A flag one closure waits on (at most `timeout`) and another raises.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool WaitOpen(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Each test declares its pool after what the closures use, so that the pool
// ends (and joins its threads) first.

// The shard's case: a closure blocks until a later one runs (a lookup
// waiting for the push that follows another lookup's answer).
TEST(WorkPoolTest, AClosurePostedWhileEveryThreadBlocksStillRuns) {
  Gate gate, done;
  std::atomic<bool> released{false};
  WorkPool pool(1);
  pool.Post([&] {
    released = gate.WaitOpen(absl::Seconds(10));
    done.Open();
  });
  pool.Post([&] { gate.Open(); });
  ASSERT_TRUE(done.WaitOpen(absl::Seconds(20)));
  EXPECT_TRUE(released) << "the second closure ran only after the first gave up";
}

TEST(WorkPoolTest, ThreadsAddedUnderLoadEndWhenIdleAndTheKeptOnesStay) {
  Gate gate;
  std::atomic<int> running{0};
  WorkPool pool(2, /*idle_exit=*/absl::Milliseconds(50));
  constexpr int kBlocked = 5;
  for (int i = 0; i < kBlocked; ++i) {
    pool.Post([&] {
      ++running;
      gate.WaitOpen(absl::Seconds(10));
    });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (running < kBlocked && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(running, kBlocked) << "closures waited for busy threads";
  EXPECT_GE(pool.threads(), size_t{kBlocked});
  gate.Open();
  while (pool.threads() > 2 && absl::Now() < give_up + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(pool.threads(), 2u);
  std::atomic<bool> ran{false};  // read after Stop below
  pool.Post([&] { ran = true; });  // on a kept thread; joins the ended ones
  pool.Stop();
  EXPECT_TRUE(ran);
}

TEST(WorkPoolTest, StopRunsWhatWasPostedAndLaterClosuresRunOnTheCaller) {
  std::atomic<int> ran{0};
  WorkPool pool(2);
  for (int i = 0; i < 100; ++i) pool.Post([&] { ++ran; });
  pool.Stop();
  EXPECT_EQ(ran, 100);
  EXPECT_EQ(pool.threads(), 0u);
  pool.Post([&] { ++ran; });
  EXPECT_EQ(ran, 101);
}

}  // namespace
}  // namespace ember
