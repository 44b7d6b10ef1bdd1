// The node shuffle over NCCL gives what it gives over the in-process
// transport. On one GPU the group has one rank (NCCL sends to itself); the
// multi-rank algorithm is covered on the in-process transport. Skips without
// a GPU; without CUDA the factories must say so.
#include <thread>

#include "ember/device.h"
#include "ember/nccl_transport.h"
#include "ember/node_shuffle.h"
#include "gtest/gtest.h"
#include "kernels/store_factory.h"
#include "tests/test_util.h"

namespace ember {
namespace {

TEST(NcclTransportTest, OneRankExchangeMatchesTheInProcessTransport) {
  auto nccl = NewNcclTransports({0});
  if (!CheckStoreDevice(StoreDevice{StoreDevice::Kind::kCuda, 0}).ok()) {
    ASSERT_FALSE(nccl.ok());
    GTEST_SKIP() << "no CUDA device here (" << nccl.status().message() << ")";
  }
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  auto local = NewInProcessTransports(1);
  const std::vector<uint32_t> dims = {3, 5};
  const std::vector<std::vector<uint64_t>> keys = {{1, 2, ~uint64_t{0}, 0}, {7}};
  std::vector<std::vector<float>> results[2];
  ShuffleTransport* transports[2] = {(*nccl)[0].get(), local[0].get()};
  for (int k = 0; k < 2; ++k) {
    NodeShuffle ex(transports[k], dims);
    auto owned = ex.RouteKeys(keys);
    ASSERT_TRUE(owned.ok()) << owned.status();
    EXPECT_EQ(*owned, keys);
    std::vector<float> r0 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, r1 = {1, 2, 3, 4, 5};
    auto rows = ex.ShareRows({r0, r1});
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ((*rows)[0], r0);
    auto sums = ex.ReduceGradients({r0, r1});
    ASSERT_TRUE(sums.ok()) << sums.status();
    results[k] = *sums;
    EXPECT_GT(ex.bytes_sent(), 0u);
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(NcclTransportTest, BadArgumentsAreRefusedAndABuildWithoutCudaSaysSo) {
  auto none = NewNcclTransports({});
  ASSERT_FALSE(none.ok());
  auto bad_id = NewNcclTransport("short", 0, 1, 0);
  ASSERT_FALSE(bad_id.ok());
  if (!HaveCudaPath()) {
    EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kFailedPrecondition) << bad_id.status();
    EXPECT_NE(bad_id.status().message().find("no CUDA"), std::string::npos) << bad_id.status();
    return;
  }
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument) << bad_id.status();
  EXPECT_NE(bad_id.status().message().find("field 'unique_id'"), std::string::npos)
      << bad_id.status();
}

}  // namespace
}  // namespace ember
