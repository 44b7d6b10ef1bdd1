// The gate between a validated push and its rows (shard/push_gate.h): a
// move's hold, the untracked pushes a cut waits out, the write log.
#include "shard/push_gate.h"

#include <optional>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(PushGateTest, AHeldCutRefusesPushesPastItAndUntrackedOnesNamingTheCut) {
  PushGate gate(absl::Seconds(60));
  ASSERT_TRUE(gate.Hold(absl::Now() + absl::Seconds(1)).ok());
  gate.HoldPast(5);
  EXPECT_TRUE(gate.Enter(/*worker=*/1, /*step=*/5, /*tracked=*/true).ok());
  const absl::Status past = gate.Enter(1, 6, true).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kUnavailable) << past;
  EXPECT_TRUE(absl::StrContains(past.message(), "past step 5 (its cut); worker 1 step 6")) << past;
  const absl::Status untracked = gate.Enter(2, 0, false).status();
  EXPECT_EQ(untracked.code(), absl::StatusCode::kUnavailable) << untracked;
  EXPECT_TRUE(absl::StrContains(untracked.message(), "(not registered)")) << untracked;
  EXPECT_TRUE(gate.Release());
  EXPECT_TRUE(gate.Enter(1, 6, true).ok());
  EXPECT_FALSE(gate.Release());
}

TEST(PushGateTest, ACutWaitsForUntrackedPushesUnderWayAndRefusesNewOnes) {
  PushGate gate(absl::Seconds(60));
  std::optional<PushGate::Pass> under_way(*gate.Enter(3, 0, /*tracked=*/false));
  const absl::Status timed_out = gate.Hold(absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_EQ(gate.Enter(4, 0, false).status().code(), absl::StatusCode::kUnavailable);
  under_way.reset();  // its rows are written
  EXPECT_TRUE(gate.Hold(absl::Now() + absl::Seconds(1)).ok());
}

TEST(PushGateTest, AnUntrackedPushMakesTheWriteLogForgetEverything) {
  PushGate gate(absl::Seconds(60));
  const uint64_t token = gate.log().PeekToken();
  ASSERT_NE(token, 0u);
  { PushGate::Pass pass = *gate.Enter(1, 0, /*tracked=*/false); }
  EXPECT_NE(gate.log().token(), token);
}

TEST(PushGateTest, ATrackedPushRecordsItsKeysOnlyWhileTheLogIsKept) {
  PushGate gate(absl::Seconds(60));
  {
    PushGate::Pass before_any_peek = *gate.Enter(1, 0, true);
    before_any_peek.Record("t", 0, std::vector<uint64_t>{9});
  }
  const uint64_t token = gate.log().PeekToken();
  {
    PushGate::Pass pass = *gate.Enter(1, 1, true);
    pass.Record("t", 1, std::vector<uint64_t>{8});
  }
  std::string changed;
  uint64_t count = 0;
  ASSERT_TRUE(gate.log().Changed("t", 0, token, std::vector<uint64_t>{8, 9}, &changed, &count));
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(changed[0], 1);
  EXPECT_EQ(changed[1], 0);
}

}  // namespace
}  // namespace ember
