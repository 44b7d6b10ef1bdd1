// The row rules both stores share (kernels/row_policy.h): eviction scores
// and the optimizers' starting state. The updates themselves are checked
// against published formulas in store_optimizer_test.cc and against the
// vectorised host loop in optimizer_rows_test.cc.
#include "kernels/row_policy.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ember::row {
namespace {

TEST(RowPolicyTest, ScoresFollowThePolicy) {
  EXPECT_EQ(TouchedScore(EvictionPolicy::kLru, 3, 9), 9u);
  EXPECT_EQ(TouchedScore(EvictionPolicy::kLfu, 3, 9), 4u);
  EXPECT_EQ(TouchedScore(EvictionPolicy::kLfu, 0xffffffffu, 9), 0xffffffffu);
  EXPECT_EQ(TouchedScore(EvictionPolicy::kNone, 3, 9), 3u);
}

TEST(RowPolicyTest, AnInsertedRowScoresAsOneAccessFromUntouched) {
  EXPECT_EQ(InsertedScore(EvictionPolicy::kLfu, 9), 1u);
  EXPECT_EQ(InsertedScore(EvictionPolicy::kLru, 9), 9u);
  EXPECT_EQ(InsertedScore(EvictionPolicy::kNone, 9), kUntouchedScore);
}

TEST(RowPolicyTest, StateSlotsAndStepCountsMatchTheTableConfigQueries) {
  for (OptimizerKind kind : kAllOptimizers) {
    SCOPED_TRACE(OptimizerName(kind));
    VisitOptimizer(kind, [&](auto rule) {
      using Rule = decltype(rule);
      EXPECT_EQ(Rule::kKind, kind);
      EXPECT_LE(Rule::kStateSlots, kMaxStateSlots);
      EXPECT_EQ(OptimizerStateFloatsPerElement(kind), Rule::kStateSlots);
      EXPECT_EQ(OptimizerHasStepCount(kind), Rule::kHasStep);
      EXPECT_EQ(OptimizerName(kind), Rule::kName);
    });
  }
}

TEST(RowPolicyTest, AccumulatorsStartAtTheConfiguredValue) {
  OptimizerConfig c;
  c.initial_accumulator = 0.25f;
  c.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(InitialState(c, 0), 0.25f);
  c.kind = OptimizerKind::kFtrl;
  EXPECT_EQ(InitialState(c, 0), 0.0f);   // z
  EXPECT_EQ(InitialState(c, 1), 0.25f);  // n
  c.kind = OptimizerKind::kAdam;
  EXPECT_EQ(InitialState(c, 0), 0.0f);
  EXPECT_EQ(InitialState(c, 1), 0.0f);
}

TEST(RowPolicyTest, StepCountsAdvanceOnlyForOptimizersThatKeepThemAndSaturate) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  uint32_t step = 0;
  EXPECT_EQ(AdvanceStep(c, step), Adam::StepSize(c, 1));
  EXPECT_EQ(step, 1u);
  step = 0xffffffffu;
  AdvanceStep(c, step);
  EXPECT_EQ(step, 0xffffffffu);
  c.kind = OptimizerKind::kAdagrad;
  step = 5;
  EXPECT_EQ(AdvanceStep(c, step), 0.0f);
  EXPECT_EQ(step, 5u);
}

}  // namespace
}  // namespace ember::row
