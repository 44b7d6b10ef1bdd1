// Stale synchronous parallel on the shard core: the clock's bookkeeping, and
// the guarantee both ways. With staleness s, a lookup for step t sees every
// registered worker's pushes for steps <= t - s - 1 (never staler), and with
// s = 1 it may indeed be answered one step stale.
#include <atomic>
#include <random>
#include <limits>
#include <thread>

#include "gtest/gtest.h"
#include "shard/shard.h"
#include "shard/ssp_clock.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

TEST(SspClockTest, OutOfOrderPushesAdvanceTheClockOnlyWhenTheGapCloses) {
  SspClock clock;
  clock.Register(7, /*first_step=*/0);
  EXPECT_EQ(clock.MinApplied(), -1);
  SspClock::Claim claim;
  for (int64_t step : {2, 1}) {
    ASSERT_OK(clock.Begin(7, step, &claim));
    ASSERT_EQ(claim, SspClock::Claim::kClaimed);
    clock.End(7, step, /*applied=*/true);
    EXPECT_EQ(clock.MinApplied(), -1) << "step 0 is still missing";
  }
  ASSERT_OK(clock.Begin(7, 0, &claim));
  clock.End(7, 0, true);
  EXPECT_EQ(clock.MinApplied(), 2);
}

TEST(SspClockTest, RepeatedOrInFlightStepsAreDuplicatesAndFailedOnesMayBeRetried) {
  SspClock clock;
  clock.Register(1, 5);
  SspClock::Claim claim;
  ASSERT_OK(clock.Begin(1, 4, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kDuplicate) << "before first_step counts as applied";
  ASSERT_OK(clock.Begin(1, 5, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kClaimed);
  ASSERT_OK(clock.Begin(1, 5, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kDuplicate) << "in flight";
  clock.End(1, 5, /*applied=*/false);
  ASSERT_OK(clock.Begin(1, 5, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kClaimed) << "a failed push may be retried";
  clock.End(1, 5, true);
  ASSERT_OK(clock.Begin(1, 5, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kDuplicate);
  ASSERT_OK(clock.Begin(99, 5, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kUntracked);
}

TEST(SspClockTest, StepFarAheadIsRefusedNamingTheWorker) {
  SspClock clock;
  clock.Register(3, 0);
  SspClock::Claim claim;
  absl::Status s = clock.Begin(3, SspClock::kMaxStepsAhead + 1, &claim);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("worker 3"), std::string::npos) << s;
}

TEST(SspClockTest, ARestoredWorkersFirstPushOrLookupPastItsRestoredStepsReportsTheLostSteps) {
  SspClock clock;
  clock.Restore(3, SspClock::Progress{19, {}});
  SspClock::Claim claim = SspClock::Claim::kDuplicate;
  // The trainer was at step 40 when the shard was lost: pushes 20-39 were
  // acknowledged by the shard and are not in the checkpoint.
  absl::Status s = clock.Begin(3, 40, &claim);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("worker 3 pushes step 40, so this shard acknowledged its pushes up "
                             "to step 39 before, but its restored state holds them only up to "
                             "step 19: its pushes of steps 20 to 39 were lost"),
            std::string::npos)
      << s;
  s = clock.CheckRestored(3, 38, "asks for step 40 with staleness 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("steps 20 to 38 were lost"), std::string::npos) << s;
  // Nothing was claimed; what the checkpoint holds is fine.
  EXPECT_OK(clock.CheckRestored(3, 19, "asks for step 21 with staleness 1"));
  EXPECT_EQ(clock.MinApplied(), 19);
  // A retry of the next step (a restart that lost nothing) is accepted and
  // ends the check: later steps are ordinary.
  ASSERT_OK(clock.Begin(3, 20, &claim));
  EXPECT_EQ(claim, SspClock::Claim::kClaimed);
  EXPECT_OK(clock.CheckRestored(3, 30, "anything"));
  // Steps the checkpoint holds out of order count as kept.
  clock.Restore(4, SspClock::Progress{5, {7}});
  EXPECT_OK(clock.CheckRestored(4, 7, "asks"));
  ASSERT_OK(clock.Begin(4, 8, &claim));
  // A worker registered afresh (a trainer restarted at an earlier step) is
  // not checked.
  clock.Restore(5, SspClock::Progress{19, {}});
  clock.Register(5, /*first_step=*/10);
  ASSERT_OK(clock.Begin(5, 12, &claim));
}

TEST(SspClockTest, WaitTimesOutNamingTheSlowestWorkerAndUnregisterReleasesIt) {
  SspClock clock;
  clock.Register(1, 10);
  clock.Register(2, 3);
  absl::Status s = clock.WaitFor(5, absl::Now() + absl::Milliseconds(20), "lookup");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("worker 2 is behind: applied up to step 2"), std::string::npos) << s;
  std::thread waiter([&] { EXPECT_OK(clock.WaitFor(5, absl::Now() + absl::Seconds(30), "l")); });
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(clock.Unregister(2));
  waiter.join();
}

// Two or three workers against one shard, each pushing gradient 1 to its own
// key every step: the row of worker w's key is minus the number of w's pushes
// applied, so a lookup shows exactly which steps it saw.
class SspShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::CreateTableResponse created;
    ASSERT_OK(shard_.CreateTable(CountingTable("t", 1), &created));
  }
  static uint64_t KeyOf(uint32_t worker) { return 1000 + worker; }
  void Register(uint32_t worker) {
    v1::RegisterWorkerRequest req;
    v1::RegisterWorkerResponse resp;
    req.set_worker_id(worker);
    req.set_first_step(0);
    ASSERT_OK(shard_.RegisterWorker(req, &resp));
  }
  absl::Status PushStep(uint32_t worker, int64_t step, v1::PushResponse* resp = nullptr) {
    v1::PushRequest req;
    v1::PushResponse local;
    req.set_worker_id(worker);
    req.set_step(step);
    AddGradients(&req, "t", {KeyOf(worker)}, {1.0f});
    return shard_.Push(req, resp ? resp : &local);
  }
  // Pushes of each worker in `workers` seen by a lookup for `step`.
  absl::StatusOr<std::vector<int>> LookupStep(int64_t step, uint32_t staleness,
                                              const std::vector<uint32_t>& workers,
                                              absl::Duration timeout = absl::Seconds(30)) {
    v1::LookupRequest req;
    v1::LookupResponse resp;
    std::vector<uint64_t> keys;
    for (uint32_t w : workers) keys.push_back(KeyOf(w));
    AddLookup(&req, "t", keys, /*read_only=*/true);
    req.set_step(step);
    req.set_staleness(staleness);
    absl::Status s = shard_.Lookup(req, &resp, absl::Now() + timeout);
    if (!s.ok()) return s;
    std::vector<int> seen;
    for (float v : Floats(resp.tables(0).rows())) seen.push_back(static_cast<int>(-v));
    return seen;
  }

  Shard shard_{ShardOptions{}};
};

TEST_F(SspShardTest, SynchronousLookupWaitsForEveryWorkersPreviousStep) {
  Register(0);
  Register(1);
  ASSERT_OK(PushStep(0, 0));
  absl::StatusOr<std::vector<int>> early = LookupStep(1, 0, {0, 1}, absl::Milliseconds(30));
  ASSERT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.status().message().find("worker 1 is behind"), std::string::npos)
      << early.status();

  absl::StatusOr<std::vector<int>> seen;
  std::thread reader([&] { seen = LookupStep(1, 0, {0, 1}); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_OK(PushStep(1, 0));
  reader.join();
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, (std::vector<int>{1, 1})) << "s = 0 sees step 0 of both workers";
}

// Regression: step - applied overflowed for 2^63 - 1 - (-1), so a worker at
// step -1 had a push at step 2^63 - 1 applied.
TEST_F(SspShardTest, PushAtTheLargestStepIsRefusedAsTooFarAheadAndChangesNothing) {
  Register(0);
  for (const int64_t step : {std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::max() - 1, int64_t{1} << 62,
                             SspClock::kMaxStepsAhead + 1}) {
    absl::Status s = PushStep(0, step);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << step << ": " << s;
    EXPECT_NE(s.message().find("expected at most 4095"), std::string::npos) << s;
  }
  absl::StatusOr<std::vector<int>> seen = LookupStep(0, 0, {0});
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, (std::vector<int>{0})) << "no push was applied";
  ASSERT_OK(PushStep(0, SspClock::kMaxStepsAhead - 1));  // the far edge of the window
}

TEST_F(SspShardTest, StalenessOneMayMissThePreviousStepButNeverTwo) {
  Register(0);
  Register(1);
  for (int64_t step = 0; step < 3; ++step) ASSERT_OK(PushStep(0, step));
  ASSERT_OK(PushStep(1, 0));
  // Step 3 with s = 1 needs steps <= 1: worker 1 has only step 0.
  absl::StatusOr<std::vector<int>> blocked = LookupStep(3, 1, {0, 1}, absl::Milliseconds(30));
  ASSERT_EQ(blocked.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(blocked.status().message().find("worker 1 is behind: applied up to step 0"),
            std::string::npos)
      << blocked.status();
  ASSERT_OK(PushStep(1, 1));
  // Now answered without worker 1's step 2: one step stale, allowed.
  absl::StatusOr<std::vector<int>> seen = LookupStep(3, 1, {0, 1});
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, (std::vector<int>{3, 2}));
}

TEST_F(SspShardTest, RetriedPushIsAcknowledgedAsDuplicateAndAppliedOnce) {
  Register(0);
  v1::PushResponse first, retry;
  ASSERT_OK(PushStep(0, 0, &first));
  ASSERT_OK(PushStep(0, 0, &retry));
  EXPECT_FALSE(first.duplicate());
  EXPECT_TRUE(retry.duplicate());
  absl::StatusOr<std::vector<int>> seen = LookupStep(1, 0, {0});
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, std::vector<int>{1});
}

TEST_F(SspShardTest, UnregisteredWorkersPushesApplyWithoutHoldingLookups) {
  ASSERT_OK(PushStep(5, 0));
  ASSERT_OK(PushStep(5, 0));
  absl::StatusOr<std::vector<int>> seen = LookupStep(10, 0, {5}, absl::Milliseconds(50));
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, std::vector<int>{2}) << "untracked pushes are not deduplicated";
}

// Three workers run lookup-compute-push loops with random delays. Every
// lookup for step t with staleness s must show >= t - s pushes of every
// worker (steps 0..t-s-1) and, since no worker can get further ahead than
// the barrier lets it, at most t + s + 1.
void RunWorkers(uint32_t staleness, int steps,
                std::function<absl::StatusOr<std::vector<int>>(int64_t)> lookup,
                std::function<absl::Status(uint32_t, int64_t)> push) {
  constexpr uint32_t kWorkers = 3;
  std::atomic<int> violations{0};
  std::atomic<int> stale_reads{0};
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int64_t t = 0; t < steps; ++t) {
        absl::StatusOr<std::vector<int>> seen = lookup(t);
        if (!seen.ok()) {
          ADD_FAILURE() << seen.status();
          return;
        }
        for (int pushes : *seen) {
          if (pushes < t - int64_t{staleness} || pushes > t + staleness + 1) ++violations;
          if (pushes < t) ++stale_reads;
        }
        absl::SleepFor(absl::Microseconds(rng() % 300));
        if (absl::Status s = push(w, t); !s.ok()) {
          ADD_FAILURE() << s;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  if (staleness == 0) {
    EXPECT_EQ(stale_reads.load(), 0);
  }
}

TEST_F(SspShardTest, ConcurrentWorkersNeverReadStalerThanTheBound) {
  for (uint32_t s : {0u, 1u, 2u}) {
    SCOPED_TRACE(::testing::Message() << "staleness " << s);
    v1::CreateTableResponse created;  // fresh counters and clocks for each s
    ASSERT_OK(shard_.DropTable("t"));
    ASSERT_OK(shard_.CreateTable(CountingTable("t", 1), &created));
    for (uint32_t w = 0; w < 3; ++w) Register(w);
    RunWorkers(
        s, 60, [&](int64_t t) { return LookupStep(t, s, {0, 1, 2}); },
        [&](uint32_t w, int64_t t) { return PushStep(w, t); });
  }
}

}  // namespace
}  // namespace ember::testing
