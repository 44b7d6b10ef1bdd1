// ShardWay: the two channels a client suite runs over (ember/shard_channel.h),
// as the parameter of one typed suite, so that the two can never drift.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "gtest/gtest.h"

namespace ember::testing {

enum class ShardWay {
  kServers,        // ember-server processes on 127.0.0.1, over gRPC
  kInProcess,      // shards in the test's own process ("inproc:N"), on the calling thread
  kInProcessPool,  // the same, an exchange's shards at once on a pool (the default)
};

inline const auto kEveryShardWay =
    ::testing::Values(ShardWay::kServers, ShardWay::kInProcess, ShardWay::kInProcessPool);

// For INSTANTIATE_TEST_SUITE_P: "Servers", "InProcess" or "InProcessPool".
inline std::string ShardWayName(const ::testing::TestParamInfo<ShardWay>& info) {
  switch (info.param) {
    case ShardWay::kServers:
      return "Servers";
    case ShardWay::kInProcess:
      return "InProcess";
    case ShardWay::kInProcessPool:
      return "InProcessPool";
  }
  return "?";
}

// A client's options for `n` shards in this process; `way` kInProcess runs
// their calls on the calling thread, kInProcessPool on a pool keeping 2.
inline ClientOptions InProcessOptionsFor(int n, ShardWay way = ShardWay::kInProcess) {
  ClientOptions o;
  o.shards = {absl::StrCat(kInProcessPrefix, n)};
  o.rpc_timeout = absl::Seconds(20);
  o.in_process.threads = way == ShardWay::kInProcessPool ? 2 : 0;
  return o;
}

}  // namespace ember::testing
