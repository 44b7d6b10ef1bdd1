// fp16 / bf16 conversions: exact values, rounding to nearest even, specials.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/key_hash.h"
#include "common/vector_dispatch.h"
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

// ConvertElements runs a vectorised clone (common/vector_dispatch.h); it must
// give exactly the element-wise functions' bits, at any buffer address, for
// every 16-bit pattern and for floats of every kind (NaN, inf, subnormal,
// ties). Checks the clone this CPU runs (printed).
TEST(DTypeTest, ConvertElementsGivesTheElementWiseBitsAtAnyAddress) {
  std::printf("vector clone on this CPU: %s\n", VectorIsa());
  std::vector<uint16_t> halves(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> floats;
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) floats.push_back(BitsToFloat(static_cast<uint32_t>(rng())));
  for (uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x00000001u, 0x3f808000u,
                     0x3f818000u, 0x477ff000u, 0x33000000u, 0x38800000u, 0x80000000u}) {
    floats.push_back(BitsToFloat(b));
  }
  auto check = [](const void* src, DType st, size_t n, DType dt) {
    for (size_t shift : {0, 1, 2, 3}) {  // unaligned source and destination
      std::vector<unsigned char> in(n * DTypeSize(st) + 8), out(n * DTypeSize(dt) + 8);
      std::memcpy(in.data() + shift, src, n * DTypeSize(st));
      ConvertElements(in.data() + shift, st, out.data() + shift, dt, n);
      for (size_t i = 0; i < n; ++i) {
        unsigned char want[4];
        StoreElement(want, dt, 0, LoadElement(in.data() + shift, st, i));
        ASSERT_EQ(std::memcmp(out.data() + shift + i * DTypeSize(dt), want, DTypeSize(dt)), 0)
            << DTypeName(st) << " -> " << DTypeName(dt) << " element " << i << " shift "
            << shift;
      }
    }
  };
  for (DType dt : {DType::kFp16, DType::kBf16}) check(floats.data(), DType::kFp32, floats.size(), dt);
  for (DType st : {DType::kFp16, DType::kBf16}) {
    for (DType dt : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      if (st != dt) check(halves.data(), st, halves.size(), dt);
    }
  }
}

TEST(DTypeTest, CopyRowBytesCopiesEveryRowSizeExactlyAtAnyAddress) {
  // The row sizes with an inline copy, the 64-byte-block vector copy (256
  // bytes and up) and the memcpy fallback; the bytes around the row stay.
  std::mt19937 rng(9);
  for (size_t n : {4, 16, 32, 48, 64, 128, 192, 256, 288, 512, 1024, 4096}) {
    for (size_t shift : {0, 1, 3}) {  // rows are slices of request bytes
      std::vector<unsigned char> src(n + 8), dst(n + 8, 0xa5);
      for (unsigned char& b : src) b = static_cast<unsigned char>(rng());
      CopyRowBytes(dst.data() + shift, src.data() + shift, n);
      EXPECT_EQ(std::memcmp(dst.data() + shift, src.data() + shift, n), 0)
          << n << " bytes, shift " << shift;
      for (size_t i = 0; i < shift; ++i) EXPECT_EQ(dst[i], 0xa5) << n << " before";
      for (size_t i = shift + n; i < dst.size(); ++i) EXPECT_EQ(dst[i], 0xa5) << n << " after";
    }
  }
}

TEST(DTypeTest, AllFiniteFindsOneNonFiniteElementAnywhere) {
  struct Bad {
    DType t;
    uint32_t bits;
  };
  for (const Bad bad : {Bad{DType::kFp32, 0x7f800000u}, Bad{DType::kFp32, 0xffc00000u},
                        Bad{DType::kFp16, 0x7c00u}, Bad{DType::kFp16, 0xfe01u},
                        Bad{DType::kBf16, 0xff80u}, Bad{DType::kBf16, 0x7fc1u}}) {
    for (size_t n : {1, 15, 16, 17, 255, 256, 257, 1000}) {
      std::vector<unsigned char> buf(n * DTypeSize(bad.t) + 1);
      unsigned char* data = buf.data() + 1;  // unaligned
      for (size_t i = 0; i < n; ++i) StoreElement(data, bad.t, i, 65000.0f - i);  // finite
      EXPECT_TRUE(AllFinite(data, bad.t, n)) << DTypeName(bad.t) << " n " << n;
      for (size_t at : {size_t{0}, n / 2, n - 1}) {
        std::vector<unsigned char> copy(buf);
        if (bad.t == DType::kFp32) {
          std::memcpy(copy.data() + 1 + at * 4, &bad.bits, 4);
        } else {
          const uint16_t h = static_cast<uint16_t>(bad.bits);
          std::memcpy(copy.data() + 1 + at * 2, &h, 2);
        }
        EXPECT_FALSE(AllFinite(copy.data() + 1, bad.t, n))
            << DTypeName(bad.t) << " n " << n << " at " << at;
      }
    }
  }
  EXPECT_TRUE(AllFinite(nullptr, DType::kFp32, 0));
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
