#include "shard/inflight_limit.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ember {
namespace {

TEST(InflightLimitTest, ACallOverItsConnectionsLimitIsRefusedNamingTheFlagAndOthersGoOn) {
  InflightLimit limit({.total = 1000, .per_connection = 300}, nullptr);
  auto a = limit.Acquire("ipv4:127.0.0.1:1", 200, "Lookup");
  ASSERT_OK(a);
  auto refused = limit.Acquire("ipv4:127.0.0.1:1", 101, "Push");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  for (const char* fragment : {"Push of 101 request bytes", "200 bytes already in flight",
                               "connection ipv4:127.0.0.1:1", "limit 300",
                               "--max_inflight_bytes_per_connection"}) {
    EXPECT_NE(refused.status().message().find(fragment), std::string::npos)
        << fragment << " not in " << refused.status();
  }
  EXPECT_OK(limit.Acquire("ipv4:127.0.0.1:2", 300, "Push"));  // another connection
  EXPECT_EQ(limit.total(), 200u) << "the refused call holds nothing, the released one neither";
}

TEST(InflightLimitTest, ACallOverTheShardsTotalIsRefusedUntilBytesAreGivenBack) {
  InflightLimit limit({.total = 500, .per_connection = 0}, nullptr);
  auto a = limit.Acquire("p1", 300, "Lookup");
  auto b = limit.Acquire("p2", 200, "Lookup");
  ASSERT_OK(a);
  ASSERT_OK(b);
  auto refused = limit.Acquire("p3", 1, "Exchange");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("on this shard, limit 500 (--max_inflight_bytes)"),
            std::string::npos)
      << refused.status();
  a->reset();  // the first call finished
  EXPECT_EQ(limit.total(), 200u);
  EXPECT_OK(limit.Acquire("p3", 300, "Exchange"));
  EXPECT_EQ(limit.total(), 200u);
}

TEST(InflightLimitTest, ConcurrentCallsNeverHoldMoreThanTheLimitAndGiveEverythingBack) {
  InflightLimit limit({.total = 1000, .per_connection = 400}, nullptr);
  std::vector<std::thread> threads;
  std::atomic<uint64_t> admitted{0}, refused{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto ticket = limit.Acquire("peer" + std::to_string(t % 3), 100 + (i % 7) * 10, "Lookup");
        if (ticket.ok()) {
          ++admitted;
          EXPECT_LE(limit.total(), 1000u);
        } else {
          ++refused;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(limit.total(), 0u);
  EXPECT_EQ(admitted + refused, 16000u);
  EXPECT_GT(admitted, 0u);
}

}  // namespace
}  // namespace ember
