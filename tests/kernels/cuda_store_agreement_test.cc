// The CUDA store against the CPU store on the same random calls: the same
// rows for every optimizer and dtype, and the same export. Skips (with the
// reason) where there is no GPU; the device check script runs it on one.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "common/key_hash.h"
#include "gtest/gtest.h"
#include "kernels/row_policy.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

using Case = std::tuple<OptimizerKind, DType>;

class CudaAgreementTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (std::string why = CudaStoreFactory::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
};

// fp32 SGD, Adagrad and RMSProp use only correctly rounded operations in the same
// order on both sides (the CUDA file is built without FMA contraction), so
// they must match exactly; Adam's bias correction calls pow and FTRL's
// sqrt differences compound, so those get a relative tolerance.
float Tolerance(OptimizerKind o, DType d) {
  if (d != DType::kFp32) return 1e-2f;  // one half-precision ulp after rounding
  return (o == OptimizerKind::kSgd || o == OptimizerKind::kAdagrad || o == OptimizerKind::kRmsProp)
             ? 0.0f
             : 1e-5f;
}

TEST_P(CudaAgreementTest, RandomLookupsAndPushesGiveTheCpuStoresRows) {
  const auto [optimizer, dtype] = GetParam();
  TableConfig c = SmallTable(/*dim=*/13);
  c.dtype = dtype;
  c.initializer.kind = InitializerKind::kTruncatedNormal;
  c.initializer.mean = 0.0f;
  c.initializer.stddev = 0.3f;
  c.optimizer.kind = optimizer;
  c.optimizer.learning_rate = 0.05f;
  auto cpu = NewCpuStore(c);
  auto gpu = CudaStoreFactory::Make(c);
  ASSERT_OK(cpu);
  ASSERT_OK(gpu);
  const float tol = Tolerance(optimizer, dtype);
  std::mt19937_64 rng(2024);
  std::vector<uint64_t> pool = {0, ~uint64_t{0}};
  for (int i = 0; i < 5000; ++i) pool.push_back(Mix64(i));
  for (int round = 0; round < 60; ++round) {
    std::vector<uint64_t> keys(1 + rng() % 3000);
    for (uint64_t& k : keys) k = pool[rng() % pool.size()];  // with duplicates
    std::vector<float> a(keys.size() * c.dim), b(keys.size() * c.dim);
    if (round % 3 == 2) {
      std::vector<float> g(keys.size() * c.dim);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : g) v = normal(rng);
      auto pa = (*cpu)->ApplyGradients(keys, DType::kFp32, Bytes(g));
      auto pb = (*gpu)->ApplyGradients(keys, DType::kFp32, Bytes(g));
      ASSERT_OK(pa);
      ASSERT_OK(pb);
      EXPECT_EQ(pa->updated, pb->updated);
      EXPECT_EQ(pa->inserted, pb->inserted);
      continue;
    }
    const bool insert = round % 3 == 1;
    std::vector<uint8_t> fa(keys.size()), fb(keys.size());
    if (insert) {
      auto ra = (*cpu)->FindOrInsert(keys, DType::kFp32, MutableBytes(a));
      auto rb = (*gpu)->FindOrInsert(keys, DType::kFp32, MutableBytes(b));
      ASSERT_OK(ra);
      ASSERT_OK(rb);
      EXPECT_EQ(ra->missing, rb->missing);
    } else {
      auto ra = (*cpu)->Find(keys, DType::kFp32, MutableBytes(a), fa.data());
      auto rb = (*gpu)->Find(keys, DType::kFp32, MutableBytes(b), fb.data());
      ASSERT_OK(ra);
      ASSERT_OK(rb);
      EXPECT_EQ(ra->missing, rb->missing);
      ASSERT_EQ(fa, fb);
    }
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], tol * std::max(1.0f, std::fabs(a[i])))
          << "round " << round << " key " << keys[i / c.dim] << " element " << i % c.dim;
    }
  }
  EXPECT_EQ((*cpu)->Stats().rows, (*gpu)->Stats().rows);

  // Export both and compare row by row, state included.
  auto dump = [](EmbeddingStore& s) {
    std::map<uint64_t, std::vector<float>> rows;
    ExportCursor cursor;
    ExportedRows batch;
    const size_t sf = s.config().dim * OptimizerStateFloatsPerElement(s.config().optimizer.kind);
    while (!cursor.done) {
      EXPECT_OK(s.Export(&cursor, 777, &batch));
      for (size_t i = 0; i < batch.keys.size(); ++i) {
        std::vector<float> v(batch.values.begin() + i * s.config().dim,
                             batch.values.begin() + (i + 1) * s.config().dim);
        v.insert(v.end(), batch.state.begin() + i * sf, batch.state.begin() + (i + 1) * sf);
        v.push_back(static_cast<float>(batch.steps[i]));
        rows[batch.keys[i]] = v;
      }
    }
    return rows;
  };
  auto ra = dump(**cpu);
  auto rb = dump(**gpu);
  ASSERT_EQ(ra.size(), rb.size());
  for (const auto& [key, va] : ra) {
    ASSERT_TRUE(rb.count(key)) << key;
    const auto& vb = rb[key];
    for (size_t i = 0; i < va.size(); ++i) {
      ASSERT_NEAR(va[i], vb[i], tol * std::max(1.0f, std::fabs(va[i]))) << key << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllOptimizersAndDtypes, CudaAgreementTest,
    ::testing::Combine(::testing::ValuesIn(row::kAllOptimizers),
                       ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(OptimizerName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param)));
    });

// A table without a capacity grows from CudaStore::kInitialSlots: every row
// written before a growth is still there, unchanged, after several.
TEST(CudaStoreGrowthTest, RowsSurviveRepeatedGrowth) {
  if (std::string why = CudaStoreFactory::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TableConfig c = SmallTable(/*dim=*/3);
  auto gpu = CudaStoreFactory::Make(c);
  ASSERT_OK(gpu);
  std::vector<uint64_t> keys(200000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(i * 7 + 1);
  std::vector<float> first(keys.size() * 3), again(keys.size() * 3);
  for (size_t at = 0; at < keys.size(); at += 25000) {  // 8 calls, several growths
    std::vector<uint64_t> part(keys.begin() + at, keys.begin() + at + 25000);
    std::vector<float> out(part.size() * 3);
    ASSERT_OK((*gpu)->FindOrInsert(part, DType::kFp32, MutableBytes(out)));
    std::copy(out.begin(), out.end(), first.begin() + at * 3);
  }
  EXPECT_EQ((*gpu)->Stats().rows, keys.size());
  std::vector<uint8_t> found(keys.size());
  ASSERT_OK((*gpu)->Find(keys, DType::kFp32, MutableBytes(again), found.data()));
  EXPECT_EQ(std::count(found.begin(), found.end(), 1), static_cast<long>(keys.size()));
  EXPECT_EQ(first, again);
}

}  // namespace
}  // namespace ember::testing
