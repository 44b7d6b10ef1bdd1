#include "common/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace ember {
namespace {

// RFC 3720 (iSCSI) B.4 test vectors, and the classic check value.
struct Vector {
  std::string name;
  std::string data;
  uint32_t crc;
};
std::vector<Vector> KnownVectors() {
  std::string ascending(32, 0), descending(32, 0);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  return {{"check string 123456789", "123456789", 0xe3069283u},
          {"32 zero bytes", std::string(32, '\0'), 0x8a9136aau},
          {"32 0xff bytes", std::string(32, '\xff'), 0x62a8ab43u},
          {"32 ascending bytes", ascending, 0x46dd794eu},
          {"32 descending bytes", descending, 0x113fdb5cu},
          {"empty", "", 0u}};
}

TEST(Crc32cTest, MatchesPublishedVectors) {
  for (const Vector& v : KnownVectors()) {
    EXPECT_EQ(Crc32c(v.data), v.crc) << v.name;
    EXPECT_EQ(internal::Crc32cExtendPortable(0, v.data.data(), v.data.size()), v.crc) << v.name;
  }
}

TEST(Crc32cTest, ExtendingInPiecesEqualsTheWholeAtEveryAlignment) {
  std::mt19937 rng(1);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{333}, size_t{991}}) {
      const std::string s = data.substr(offset);
      const size_t cut = std::min(split, s.size());
      const uint32_t pieces = Crc32cExtend(Crc32c(s.data(), cut), s.data() + cut, s.size() - cut);
      EXPECT_EQ(pieces, Crc32c(s)) << "offset " << offset << " split " << split;
      EXPECT_EQ(internal::Crc32cExtendPortable(0, s.data(), s.size()), Crc32c(s))
          << "offset " << offset;
    }
  }
  EXPECT_EQ(whole, internal::Crc32cExtendPortable(0, data.data(), data.size()));
}

TEST(Crc32cTest, OneFlippedBitChangesTheChecksum) {
  std::string data(4096, 'x');
  const uint32_t clean = Crc32c(data);
  for (size_t byte : {size_t{0}, size_t{100}, size_t{4095}}) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = data;
      flipped[byte] = static_cast<char>(flipped[byte] ^ (1 << bit));
      EXPECT_NE(Crc32c(flipped), clean) << "byte " << byte << " bit " << bit;
    }
  }
}

}  // namespace
}  // namespace ember
