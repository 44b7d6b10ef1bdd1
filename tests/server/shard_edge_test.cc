// The shard edge every transport calls (shard/shard_edge.h), driven with
// no transport: what it refuses, that a refusal changes nothing, and what
// it counts.
#include "shard/shard_edge.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/server/requests.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr char kTokens[] = "reader-token-0123456 reader\ntrainer-token-012345 trainer\n";

class ShardEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auth_ = *TokenAuth::FromText(kTokens, "tokens");
    auth_->SetMetrics(&metrics_);
    v1::CreateTableResponse created;
    ASSERT_OK(shard_.CreateTable(AdagradTable("user", 4), &created));
  }
  static ShardOptions Options() {
    ShardOptions o;
    o.shard_index = 0;
    o.shard_count = 1;
    return o;
  }
  static EdgeCall Call(absl::string_view rpc, const std::string& token) {
    EdgeCall call;
    call.rpc = rpc;
    if (!token.empty()) call.authorization = "Bearer " + token;
    call.peer = "ipv4:127.0.0.1:1";
    return call;
  }
  // The exposition's line of `series` (e.g. `ember_rpc_requests_total{...}`),
  // or "" if it has none.
  std::string Series(absl::string_view series) const {
    const std::string text = registry_.Expose();
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, series)) return std::string(line);
    }
    return "";
  }
  uint64_t StoredRows() {
    v1::ListTablesResponse list;
    shard_.ListTables(&list);
    return list.tables(0).rows();
  }

  metrics::Registry registry_;
  ShardMetrics metrics_{&registry_};
  Shard shard_{Options()};
  std::unique_ptr<TokenAuth> auth_;
  InflightLimit inflight_{{.total = 0, .per_connection = 64}, &metrics_};
};

TEST_F(ShardEdgeTest, AReaderMayReadButNotInsertAndTheRefusalInsertsNothing) {
  ShardEdge edge(&shard_, &metrics_, auth_.get());
  v1::LookupRequest read, insert;
  AddLookup(&read, "user", {1, 2}, /*read_only=*/true);
  AddLookup(&insert, "user", {1, 2}, /*read_only=*/false);
  v1::LookupResponse response;
  EXPECT_OK(edge.Lookup(Call("Lookup", "reader-token-0123456"), read, &response));
  const absl::Status refused = edge.Lookup(Call("Lookup", "reader-token-0123456"), insert, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "table 'user' has read_only = false"))
      << refused;
  EXPECT_EQ(StoredRows(), 0u);
  EXPECT_OK(edge.Lookup(Call("Lookup", "trainer-token-012345"), insert, &response));
  EXPECT_EQ(StoredRows(), 2u);
}

TEST_F(ShardEdgeTest, ACallWithoutATokenIsUnauthenticatedAndCountedAsDenied) {
  ShardEdge edge(&shard_, &metrics_, auth_.get());
  v1::PushRequest push;
  AddGradients(&push, "user", {1}, {1, 1, 1, 1});
  v1::PushResponse response;
  const absl::Status s = edge.Push(Call("Push", ""), push, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no 'authorization' metadata")) << s;
  EXPECT_EQ(StoredRows(), 0u);
  EXPECT_EQ(Series("ember_auth_denied_total{rpc=\"Push\",code=\"UNAUTHENTICATED\"}"),
            "ember_auth_denied_total{rpc=\"Push\",code=\"UNAUTHENTICATED\"} 1");
}

TEST_F(ShardEdgeTest, ACallPastItsDeadlineIsRefusedBeforeItRuns) {
  ShardEdge edge(&shard_, &metrics_);
  EdgeCall call = Call("Lookup", "");
  call.deadline = absl::Now() - absl::Seconds(1);
  v1::LookupRequest insert;
  AddLookup(&insert, "user", {1});
  v1::LookupResponse response;
  const absl::Status s = edge.Lookup(call, insert, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(StoredRows(), 0u);
}

TEST_F(ShardEdgeTest, ARequestOverItsConnectionsLimitIsRefusedNamingTheFlag) {
  ShardEdge edge(&shard_, &metrics_, nullptr, &inflight_);
  v1::LookupRequest big;
  std::vector<uint64_t> keys(32);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k;
  AddLookup(&big, "user", keys);
  v1::LookupResponse response;
  const absl::Status s = edge.Lookup(Call("Lookup", ""), big, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(StoredRows(), 0u);
  EXPECT_EQ(inflight_.total(), 0u);
}

TEST_F(ShardEdgeTest, ACallOfAnotherRoutingEpochIsAbortedAndCountedWithItsCode) {
  ShardEdge edge(&shard_, &metrics_);
  EdgeCall call = Call("Push", "");
  call.routing_epoch = shard_.routing_epoch() + 1;
  v1::PushRequest push;
  AddGradients(&push, "user", {1}, {1, 1, 1, 1});
  v1::PushResponse response;
  const absl::Status s = edge.Push(call, push, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(StoredRows(), 0u);
  EXPECT_EQ(Series("ember_rpc_requests_total{rpc=\"Push\",code=\"ABORTED\"}"),
            "ember_rpc_requests_total{rpc=\"Push\",code=\"ABORTED\"} 1");
  EdgeCall unreadable = Call("Push", "");
  unreadable.routing_epoch = absl::InvalidArgumentError("metadata 'ember-routing-epoch': x");
  EXPECT_EQ(edge.Push(unreadable, push, &response).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardEdgeTest, AnExchangeInHalvesAppliesItsPushThenAnswersAndCountsOnce) {
  ShardEdge edge(&shard_, &metrics_, auth_.get());
  const EdgeCall call = Call("Exchange", "trainer-token-012345");
  v1::ExchangeRequest request;
  AddGradients(request.mutable_push(), "user", {7}, {1, 1, 1, 1});
  AddLookup(request.mutable_lookup(), "user", {7});
  ShardEdge::Exchange exchange(edge, call);
  ASSERT_OK(exchange.Open());
  v1::ExchangeResponse response;
  ASSERT_OK(exchange.Push(request, &response, request.ByteSizeLong()));
  EXPECT_EQ(Series("ember_rpc_requests_total{rpc=\"Exchange\""), "");  // not ended yet
  EXPECT_FALSE(exchange.MayWait(request));
  ASSERT_OK(exchange.Answer(request, &response, absl::InfiniteFuture()));
  EXPECT_EQ(StoredRows(), 1u);
  EXPECT_EQ(response.lookup().tables(0).rows().size(), 4 * sizeof(float));
  EXPECT_EQ(Series("ember_rpc_requests_total{rpc=\"Exchange\",code=\"OK\"}"),
            "ember_rpc_requests_total{rpc=\"Exchange\",code=\"OK\"} 1");
  // A reader may not open one.
  ShardEdge::Exchange refused(edge, Call("Exchange", "reader-token-0123456"));
  EXPECT_EQ(refused.Open().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace ember::testing
