// Initializers: determinism in (seed, key), and the distributions they draw.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/initializer_math.h"
#include "tests/kernels/store_implementations.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

struct Moments {
  double mean = 0, stddev = 0, min = 1e30, max = -1e30;
};

// Elements of many keys' rows drawn by `c`.
Moments Sample(const InitializerConfig& c, int keys, uint32_t dim) {
  std::vector<float> row(dim);
  double sum = 0, sum2 = 0;
  Moments m;
  for (int k = 0; k < keys; ++k) {
    init::InitialRow(c, static_cast<uint64_t>(k) * 0x100000001b3ULL, dim, DType::kFp32, row.data());
    for (float v : row) {
      sum += v;
      sum2 += double(v) * v;
      m.min = std::min<double>(m.min, v);
      m.max = std::max<double>(m.max, v);
    }
  }
  const double n = double(keys) * dim;
  m.mean = sum / n;
  m.stddev = std::sqrt(sum2 / n - m.mean * m.mean);
  return m;
}

TEST(InitializerMathTest, LogMatchesStdLogAcrossTheUnitInterval) {
  for (float x : {1e-7f, 2.9802322e-8f, 0.001f, 0.1f, 0.25f, 0.5f, 0.7071f, 0.75f, 0.999f, 1.0f}) {
    EXPECT_NEAR(init::Log(x), std::log(x), 2e-6 * std::max(1.0, std::abs(std::log(double(x))))) << x;
  }
}

TEST(InitializerMathTest, NormalQuantileMatchesKnownValues) {
  EXPECT_NEAR(init::NormalQuantile(0.5f), 0.0, 1e-6);
  EXPECT_NEAR(init::NormalQuantile(0.975f), 1.959964, 1e-4);
  EXPECT_NEAR(init::NormalQuantile(0.025f), -1.959964, 1e-4);
  EXPECT_NEAR(init::NormalQuantile(0.001f), -3.090232, 1e-4);
  EXPECT_NEAR(init::NormalQuantile(0.8413447f), 1.0, 1e-4);
}

TEST(InitializerMathTest, SameSeedAndKeyGiveTheSameRowDifferentOnesDiffer) {
  InitializerConfig c;
  c.kind = InitializerKind::kNormal;
  c.stddev = 1.0f;
  c.seed = 5;
  std::vector<float> a(16), b(16), other_key(16), other_seed(16);
  init::InitialRow(c, 77, 16, DType::kFp32, a.data());
  init::InitialRow(c, 77, 16, DType::kFp32, b.data());
  init::InitialRow(c, 78, 16, DType::kFp32, other_key.data());
  c.seed = 6;
  init::InitialRow(c, 77, 16, DType::kFp32, other_seed.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other_key);
  EXPECT_NE(a, other_seed);
  // Elements of one row are not all the same draw.
  EXPECT_NE(a[0], a[1]);
}

TEST(InitializerMathTest, UniformStaysInRangeWithUniformMoments) {
  InitializerConfig c;
  c.kind = InitializerKind::kUniform;
  c.min = -0.25f;
  c.max = 0.75f;
  Moments m = Sample(c, 20000, 8);
  EXPECT_GE(m.min, -0.25);
  EXPECT_LT(m.max, 0.75);
  EXPECT_NEAR(m.mean, 0.25, 0.005);
  EXPECT_NEAR(m.stddev, 1.0 / std::sqrt(12.0), 0.005);
}

TEST(InitializerMathTest, NormalHasTheRequestedMeanAndStddev) {
  InitializerConfig c;
  c.kind = InitializerKind::kNormal;
  c.mean = 1.0f;
  c.stddev = 2.0f;
  Moments m = Sample(c, 20000, 8);
  EXPECT_NEAR(m.mean, 1.0, 0.05);
  EXPECT_NEAR(m.stddev, 2.0, 0.03);
  EXPECT_LT(m.min, 1.0 - 4 * 2.0);  // real tails, not a clipped distribution
}

TEST(InitializerMathTest, TruncatedNormalStaysWithinTwoStddevs) {
  InitializerConfig c;
  c.kind = InitializerKind::kTruncatedNormal;
  c.mean = 0.0f;
  c.stddev = 0.5f;
  Moments m = Sample(c, 20000, 8);
  EXPECT_GE(m.min, -1.0);
  EXPECT_LE(m.max, 1.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  // Stddev of a standard normal truncated at +-2 is 0.8796.
  EXPECT_NEAR(m.stddev, 0.5 * 0.8796, 0.01);
}

TEST(InitializerMathTest, ConstantAndZerosFillTheRow) {
  InitializerConfig c;
  c.kind = InitializerKind::kConstant;
  c.value = 0.125f;
  std::vector<float> row(5);
  init::InitialRow(c, 1, 5, DType::kFp32, row.data());
  EXPECT_EQ(row, std::vector<float>(5, 0.125f));
  c.kind = InitializerKind::kZeros;
  init::InitialRow(c, 1, 5, DType::kFp32, row.data());
  EXPECT_EQ(row, std::vector<float>(5, 0.0f));
}

template <typename Factory>
class StoreInitializerTest : public StoreTestBase<Factory> {};
TYPED_TEST_SUITE(StoreInitializerTest, StoreImplementations, StoreImplementationNames);

// Two stores stand for two shards, or one shard before and after a restart.
TYPED_TEST(StoreInitializerTest, TwoStoresWithTheSameSeedInitializeKeysIdentically) {
  TableConfig c = SmallTable(8);
  c.initializer.kind = InitializerKind::kTruncatedNormal;
  c.initializer.stddev = 0.05f;
  c.initializer.seed = 1234;
  auto first = this->MakeStore(c);
  auto second = this->MakeStore(c);
  std::vector<uint64_t> keys = {0, 1, 99, ~uint64_t{0}};
  std::vector<float> a(keys.size() * 8), b(keys.size() * 8);
  ASSERT_OK(first->FindOrInsert(keys, DType::kFp32, MutableBytes(a)));
  std::reverse(keys.begin(), keys.end());
  ASSERT_OK(second->Find(keys, DType::kFp32, MutableBytes(b)));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(std::equal(a.begin() + i * 8, a.begin() + i * 8 + 8,
                           b.begin() + (keys.size() - 1 - i) * 8))
        << "key position " << i;
  }
}

}  // namespace
}  // namespace ember::testing
