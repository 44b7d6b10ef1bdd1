// fp16 / bf16 conversions: exact values, rounding to nearest even, specials.
#include <cmath>
#include <cstring>
#include <limits>

#include "common/dtype.h"
#include "common/key_hash.h"
#include "common/wire.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

TEST(DTypeTest, Fp16RoundTripsEveryFiniteHalfExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / NaN
    EXPECT_EQ(FloatToFp16(Fp16ToFloat(bits)), bits) << std::hex << h;
  }
}

TEST(DTypeTest, Fp16KnownValues) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);            // rounds up to inf
  EXPECT_EQ(FloatToFp16(5.9604645e-8f), 0x0001);       // smallest subnormal
  EXPECT_EQ(FloatToFp16(2.9802322e-8f), 0x0000);       // half of it: ties to even (0)
  EXPECT_EQ(FloatToFp16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToFp16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Fp16ToFloat(0x0001), 5.9604645e-8f);
}

TEST(DTypeTest, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  uint32_t tie_even = 0x3f808000;  // exactly between 0x3f80 and 0x3f81
  float f;
  std::memcpy(&f, &tie_even, 4);
  EXPECT_EQ(FloatToBf16(f), 0x3f80);
  uint32_t tie_odd = 0x3f818000;
  std::memcpy(&f, &tie_odd, 4);
  EXPECT_EQ(FloatToBf16(f), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
}

TEST(DTypeTest, ConvertElementsBetweenAllTypes) {
  const float src[4] = {0.5f, -1.25f, 3.0f, 1024.0f};  // exact in every type
  for (DType a : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    for (DType b : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      unsigned char mid[16], out[16];
      ConvertElements(src, DType::kFp32, mid, a, 4);
      ConvertElements(mid, a, out, b, 4);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(LoadElement(out, b, i), src[i]);
    }
  }
}

TEST(KeyHashTest, ShardOfSpreadsKeysEvenlyAndStaysInRange) {
  for (uint32_t shards : {1u, 2u, 3u, 7u}) {
    std::vector<int> counts(shards);
    for (uint64_t k = 0; k < 70000; ++k) {
      uint32_t s = ShardOf(k, shards);
      ASSERT_LT(s, shards);
      ++counts[s];
    }
    for (int c : counts) EXPECT_NEAR(c, 70000.0 / shards, 70000.0 / shards * 0.05) << shards;
  }
  EXPECT_LT(ShardOf(~uint64_t{0}, 5), 5u);
}

TEST(WireTest, KeysViewReadsUnalignedBytesByCopying) {
  const std::vector<uint64_t> keys = {0, 1, ~uint64_t{0}, 0x0123456789abcdefULL};
  std::string storage = "x" + PackKeys(keys);
  std::vector<uint64_t> copy;
  absl::Span<const uint64_t> view = KeysView(absl::string_view(storage).substr(1), &copy);
  EXPECT_EQ(std::vector<uint64_t>(view.begin(), view.end()), keys);
  EXPECT_EQ(copy.size(), keys.size());  // it had to copy
  const std::string aligned = PackKeys(keys);
  std::vector<uint64_t> unused;
  view = KeysView(aligned, &unused);
  EXPECT_EQ(view.data(), reinterpret_cast<const uint64_t*>(aligned.data()));  // zero-copy
  EXPECT_TRUE(unused.empty());
}

}  // namespace
}  // namespace ember
