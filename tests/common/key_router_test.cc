// KeyRouter: both routings stay in range and spread keys evenly; the jump
// routing moves about 1/(n + 1) of the keys from n to n + 1 shards and only
// onto the new shard; each routing is the exact function its name denotes.
#include "common/key_router.h"

#include <vector>

#include "common/key_hash.h"
#include "gtest/gtest.h"

namespace ember {
namespace {

constexpr uint64_t kKeys = 200000;

uint64_t KeyAt(uint64_t i) { return i * 0x9e3779b97f4a7c15ULL + 17; }

TEST(KeyRouterTest, BothRoutingsSpreadKeysEvenlyAndStayInRange) {
  for (const char* routing : {kRoutingJump, kRoutingFastrange}) {
    for (uint32_t shards : {1u, 2u, 3u, 7u, 16u}) {
      const KeyRouter r = *KeyRouter::Make(routing, shards);
      EXPECT_EQ(r.routing(), routing);
      EXPECT_EQ(r.shard_count(), shards);
      std::vector<double> counts(shards);
      for (uint64_t i = 0; i < kKeys; ++i) {
        const uint32_t s = r.ShardOf(KeyAt(i));
        ASSERT_LT(s, shards);
        ++counts[s];
      }
      for (double c : counts) {
        EXPECT_NEAR(c / kKeys, 1.0 / shards, 0.015) << routing << " " << shards;
      }
      EXPECT_LT(r.ShardOf(~uint64_t{0}), shards);
    }
  }
}

TEST(KeyRouterTest, JumpRoutingMovesAboutOneInNPlusOneKeysAndOnlyToTheNewShard) {
  for (uint32_t n : {1u, 2u, 3u, 4u, 9u}) {
    const KeyRouter from = *KeyRouter::Make(kRoutingJump, n);
    const KeyRouter to = *KeyRouter::Make(kRoutingJump, n + 1);
    uint64_t moved = 0;
    for (uint64_t i = 0; i < kKeys; ++i) {
      const uint32_t a = from.ShardOf(KeyAt(i)), b = to.ShardOf(KeyAt(i));
      if (a == b) continue;
      ++moved;
      ASSERT_EQ(b, n) << "a key moved between old shards " << a << " -> " << b;
    }
    EXPECT_NEAR(static_cast<double>(moved) / kKeys, 1.0 / (n + 1), 0.01) << n;
  }
  // Fastrange moves about half from 2 to 3, which is why jump is the default.
  const KeyRouter two = *KeyRouter::Make(kRoutingFastrange, 2);
  const KeyRouter three = *KeyRouter::Make(kRoutingFastrange, 3);
  uint64_t moved = 0;
  for (uint64_t i = 0; i < kKeys; ++i) moved += two.ShardOf(KeyAt(i)) != three.ShardOf(KeyAt(i));
  EXPECT_NEAR(static_cast<double>(moved) / kKeys, 0.5, 0.01);
}

TEST(KeyRouterTest, EachRoutingIsTheFunctionItsNameDenotes) {
  // Written out from the definitions in common/key_router.h and
  // GetShardInfoResponse.routing, independently of the implementation.
  auto jump = [](uint64_t key, int64_t buckets) {
    int64_t b = -1, j = 0;
    while (j < buckets) {
      b = j;
      key = key * 2862933555777941757ULL + 1;
      j = static_cast<int64_t>((b + 1) * (double(int64_t{1} << 31) / double((key >> 33) + 1)));
    }
    return static_cast<uint32_t>(b);
  };
  const KeyRouter j5 = *KeyRouter::Make(kRoutingJump, 5);
  const KeyRouter f5 = *KeyRouter::Make(kRoutingFastrange, 5);
  for (uint64_t i = 0; i < 5000; ++i) {
    const uint64_t key = KeyAt(i), h = Mix64(key);
    EXPECT_EQ(j5.ShardOf(key), jump(Mix64((h >> 48) ^ 0x3c6ef372fe94f82bULL), 5)) << key;
    EXPECT_EQ(f5.ShardOf(key), ((h >> 32) * 5) >> 32) << key;
    EXPECT_EQ(DefaultShardOf(key, 5), j5.ShardOf(key));
  }
  EXPECT_EQ(std::string(kDefaultRouting), kRoutingJump);
}

TEST(KeyRouterTest, UnknownRoutingsAndShardCountsAreRefusedNamingTheField) {
  auto bad = KeyRouter::Make("modulo", 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("routing: expected 'splitmix64-jump65536' or "
                                        "'splitmix64-fastrange32', received 'modulo'"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(KeyRouter::Make(kRoutingJump, 0)
                .status()
                .message()
                .find("shard_count: expected 1 to 65536, received 0"),
            std::string::npos);
  EXPECT_FALSE(KeyRouter::Make(kRoutingJump, kMaxShards + 1).ok());
  EXPECT_TRUE(KeyRouter::Make(kRoutingJump, kMaxShards).ok());
}

}  // namespace
}  // namespace ember
