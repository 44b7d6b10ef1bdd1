// StepScheduler alone: the call rules and the pairing of pushes and fetches
// into exchanges, with no threads and no network.
#include "client/step_scheduler.h"

#include <optional>

#include "gtest/gtest.h"

namespace ember {
namespace {

using Kind = StepScheduler::Decision::Kind;
using Pairing = StepScheduler::Pairing;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

StepScheduler Make(Pairing pairing, int staleness = 1, int depth = 1) {
  StepScheduler::Options o;
  o.staleness = staleness;
  o.depth = depth;
  o.pairing = pairing;
  o.push_hold = absl::Milliseconds(2);
  return StepScheduler(o);
}

// The exchange Next sends now, checking that it is one.
StepScheduler::Exchange Send(StepScheduler& s, absl::Time now = kT0, bool flushing = false) {
  StepScheduler::Decision d = s.Next(now, flushing, /*stopping=*/false);
  EXPECT_EQ(d.kind, Kind::kSend);
  return d.exchange;
}

void Prefetch(StepScheduler& s, int64_t step) {
  ASSERT_TRUE(s.CheckPrefetch(step).ok()) << s.CheckPrefetch(step);
  s.OnPrefetch(kT0);
}
void WaitAndPush(StepScheduler& s, int64_t step) {
  ASSERT_TRUE(s.CheckWait(step).ok()) << s.CheckWait(step);
  s.OnWait();
  ASSERT_TRUE(s.CheckPush(step).ok()) << s.CheckPush(step);
  s.OnPush(kT0);
}

TEST(StepSchedulerTest, CallsOutOfOrderAreRefusedSayingExpectedAndReceived) {
  StepScheduler s = Make(Pairing::kHold, /*staleness=*/0);
  EXPECT_EQ(s.CheckPrefetch(1).message(), "Prefetch: expected step 0, received 1");
  EXPECT_EQ(s.CheckWait(0).message(), "Wait: expected step 0 (prefetch it first), received 0");
  EXPECT_EQ(s.CheckPush(0).message(), "Push: expected step 0 (wait for it first), received 0");
  Prefetch(s, 0);
  Prefetch(s, 1);
  // Depth 1: step 2 needs step 0 pushed.
  EXPECT_EQ(s.CheckPrefetch(2).message(),
            "Prefetch of step 2: prefetch depth is 1 and step 0 is not pushed yet");
  s.OnWait();
  // Staleness 0: waiting for step 1 needs the push of step 0.
  EXPECT_EQ(s.CheckWait(1).message(),
            "Wait for step 1 with staleness 0 needs this worker's push of step 0 first");
  EXPECT_EQ(s.next_wait(), 1);
  EXPECT_EQ(s.next_push(), 0);
}

TEST(StepSchedulerTest, EarlyFetchAtStalenessZeroSendsAFetchOnceThePushTwoStepsBackIsApplied) {
  for (bool early : {false, true}) {
    StepScheduler::Options o;
    o.staleness = 0;
    o.depth = 1;
    o.pairing = Pairing::kCallOrder;
    o.early_fetch = early;
    StepScheduler s(o);
    Prefetch(s, 0);
    const StepScheduler::Exchange first = Send(s);
    EXPECT_EQ(first.fetch, 0);
    EXPECT_FALSE(first.push);
    // Step 1 while step 0 computes: only early fetch sends it now (rows as
    // of step -1, brought forward through push 0 on the trainer).
    Prefetch(s, 1);
    StepScheduler::Decision d = s.Next(kT0, false, false);
    if (!early) {
      EXPECT_EQ(d.kind, Kind::kWait) << "plain s = 0 waits for push 0";
      continue;
    }
    ASSERT_EQ(d.kind, Kind::kSend);
    EXPECT_EQ(d.exchange.fetch, 1);
    EXPECT_FALSE(d.exchange.push);
    // Step 2 needs push 0 applied: it goes with it.
    WaitAndPush(s, 0);
    Prefetch(s, 2);
    const StepScheduler::Exchange e = Send(s);
    EXPECT_EQ(e.push, 0);
    EXPECT_EQ(e.fetch, 2);
    s.OnSent(e, /*ok=*/true);
    // Steady state: push t - 1 with the fetch of t + 1.
    WaitAndPush(s, 1);
    Prefetch(s, 3);
    const StepScheduler::Exchange next = Send(s);
    EXPECT_EQ(next.push, 1);
    EXPECT_EQ(next.fetch, 3);
  }
}

TEST(StepSchedulerTest, HoldPairsAPushWithTheNextFetchOrSendsItAloneAfterTheHold) {
  StepScheduler s = Make(Pairing::kHold);
  Prefetch(s, 0);
  Prefetch(s, 1);
  EXPECT_EQ(Send(s).fetch, 0);
  EXPECT_EQ(Send(s).fetch, 1);
  EXPECT_EQ(s.Next(kT0, false, false).kind, Kind::kWait);
  WaitAndPush(s, 0);
  // Alone in the queue: held until push_hold has passed.
  StepScheduler::Decision held = s.Next(kT0 + absl::Milliseconds(1), false, false);
  EXPECT_EQ(held.kind, Kind::kWaitUntil);
  EXPECT_EQ(held.until, kT0 + absl::Milliseconds(2));
  Prefetch(s, 2);
  const StepScheduler::Exchange e = Send(s);
  EXPECT_EQ(e.push, 0);
  EXPECT_EQ(e.fetch, 2);
  EXPECT_EQ(s.pushes_in_flight(), 1);
  s.OnSent(e, /*ok=*/true);
  EXPECT_EQ(s.pushed_upto(), 0);
  EXPECT_EQ(s.pushes_in_flight(), 0);
  // Past the hold, or flushing, a push goes alone.
  WaitAndPush(s, 1);
  const StepScheduler::Exchange late = Send(s, kT0 + absl::Milliseconds(3));
  EXPECT_EQ(late.push, 1);
  EXPECT_FALSE(late.fetch.has_value());
  s.OnSent(late, /*ok=*/false);
  EXPECT_EQ(s.pushed_upto(), 0) << "a failed push applies nothing";
  WaitAndPush(s, 2);
  EXPECT_EQ(Send(s, kT0, /*flushing=*/true).push, 2);
}

TEST(StepSchedulerTest, SspFetchWaitsForThePushItNeedsAndTravelsWithIt) {
  StepScheduler s = Make(Pairing::kCallOrder, /*staleness=*/0);
  Prefetch(s, 0);
  Prefetch(s, 1);
  EXPECT_EQ(Send(s).fetch, 0);
  // Step 1's fetch needs the push of step 0: nothing to send yet.
  EXPECT_EQ(s.Next(kT0, false, false).kind, Kind::kWait);
  WaitAndPush(s, 0);
  const StepScheduler::Exchange e = Send(s);
  EXPECT_EQ(e.push, 0);
  EXPECT_EQ(e.fetch, 1);
}

TEST(StepSchedulerTest, CallOrderPairingNeverDependsOnTiming) {
  // Two ranks see the same calls at different moments: they must choose
  // the same exchanges.
  for (absl::Duration delay : {absl::ZeroDuration(), absl::Seconds(1)}) {
    StepScheduler s = Make(Pairing::kCallOrder);
    Prefetch(s, 0);
    Prefetch(s, 1);
    Send(s);
    Send(s);
    WaitAndPush(s, 0);
    // However long the push has waited, it waits for the next call.
    EXPECT_EQ(s.Next(kT0 + delay, false, false).kind, Kind::kWait);
    Prefetch(s, 2);
    WaitAndPush(s, 1);
    // The fetch of step 2 goes with the push before it, not the one after.
    const StepScheduler::Exchange e = Send(s, kT0 + delay);
    EXPECT_EQ(e.push, 0);
    EXPECT_EQ(e.fetch, 2);
    EXPECT_EQ(s.Next(kT0 + delay, false, false).kind, Kind::kWait);
    // Flush: the push goes alone.
    const StepScheduler::Exchange f = Send(s, kT0 + delay, /*flushing=*/true);
    EXPECT_EQ(f.push, 1);
    EXPECT_FALSE(f.fetch.has_value());
  }
}

TEST(StepSchedulerTest, HoldLetsAFetchTakeALaterQueuedPushAlongButCallOrderDoesNot) {
  for (Pairing pairing : {Pairing::kHold, Pairing::kCallOrder, Pairing::kOneAtATime}) {
    StepScheduler s = Make(pairing, /*staleness=*/-1, /*depth=*/2);
    Prefetch(s, 0);
    Prefetch(s, 1);
    Send(s);  // fetch 0
    WaitAndPush(s, 0);
    // Queue: fetch 1, push 0.
    const StepScheduler::Exchange e = Send(s);
    EXPECT_EQ(e.fetch, 1);
    EXPECT_EQ(e.push.has_value(), pairing == Pairing::kHold) << static_cast<int>(pairing);
  }
}

TEST(StepSchedulerTest, OneAtATimeSendsEveryJobAloneInCallOrder) {
  StepScheduler s = Make(Pairing::kOneAtATime, /*staleness=*/0);
  Prefetch(s, 0);
  Prefetch(s, 1);
  EXPECT_EQ(Send(s).fetch, 0);
  WaitAndPush(s, 0);
  // Fetch 1 needs push 0: the push goes first, alone.
  StepScheduler::Exchange p = Send(s);
  EXPECT_EQ(p.push, 0);
  EXPECT_FALSE(p.fetch.has_value());
  s.OnSent(p, true);
  StepScheduler::Exchange f = Send(s);
  EXPECT_EQ(f.fetch, 1);
  EXPECT_FALSE(f.push.has_value());
}

TEST(StepSchedulerTest, StoppingDropsQueuedFetches) {
  StepScheduler s = Make(Pairing::kHold, /*staleness=*/-1, /*depth=*/2);
  Prefetch(s, 0);
  Prefetch(s, 1);
  Prefetch(s, 2);
  Send(s);
  StepScheduler::Decision d = s.Next(kT0, false, /*stopping=*/true);
  EXPECT_EQ(d.kind, Kind::kStop);
  EXPECT_EQ(d.dropped, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(d.exchange.push.has_value());
  EXPECT_EQ(s.Next(kT0, false, true).dropped.size(), 0u);
}

}  // namespace
}  // namespace ember
