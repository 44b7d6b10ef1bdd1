// ShardWay: the two channels a client suite runs over (ember/shard_channel.h),
// as the parameter of one typed suite, so that the two can never drift.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "gtest/gtest.h"

namespace ember::testing {

enum class ShardWay {
  kServers,    // ember-server processes on 127.0.0.1, over gRPC
  kInProcess,  // shards in the test's own process ("inproc:N")
};

// For INSTANTIATE_TEST_SUITE_P: "Servers" or "InProcess".
inline std::string ShardWayName(const ::testing::TestParamInfo<ShardWay>& info) {
  return info.param == ShardWay::kServers ? "Servers" : "InProcess";
}

// A client's options for `n` shards in this process.
inline ClientOptions InProcessOptionsFor(int n) {
  ClientOptions o;
  o.shards = {absl::StrCat(kInProcessPrefix, n)};
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

}  // namespace ember::testing
