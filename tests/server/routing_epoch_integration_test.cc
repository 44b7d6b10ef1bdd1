// The routing epoch against a real shard, through raw gRPC stubs: a
// Lookup, Push or unary Exchange whose ember-routing-epoch metadata is not
// the shard's is refused with ABORTED and changes nothing; one without the
// metadata (older clients, tools) or with the shard's epoch is served; a
// value that is not a number is INVALID_ARGUMENT naming the metadata. The
// client library's use of it (and ExchangeStream) is tested end to end in
// checkpoint_integration_test.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

class RoutingEpochIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = ServerProcess::Start({});
    ASSERT_OK(p);
    shard_ = std::move(*p);
    auto channel = grpc::CreateChannel(shard_->address(), grpc::InsecureChannelCredentials());
    embedding_ = v1::EmbeddingService::NewStub(channel);
    admin_ = v1::AdminService::NewStub(channel);
    v1::CreateTableRequest req;
    *req.mutable_config() = AdagradTable("t", 4);
    v1::CreateTableResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->CreateTable(&ctx, req, &resp).ok());
  }
  // A context whose ember-routing-epoch is `epoch` (none if empty).
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& epoch) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!epoch.empty()) ctx->AddMetadata("ember-routing-epoch", epoch);
    return ctx;
  }
  static v1::PushRequest PushOf(uint64_t key) {
    v1::PushRequest push;
    AddGradients(&push, "t", {key}, {1, 1, 1, 1});
    return push;
  }
  grpc::Status Lookup(const std::string& epoch, uint64_t key) {
    v1::LookupRequest req;
    AddLookup(&req, "t", {key});
    v1::LookupResponse resp;
    return embedding_->Lookup(Context(epoch).get(), req, &resp);
  }
  grpc::Status Push(const std::string& epoch, uint64_t key) {
    v1::PushResponse resp;
    return embedding_->Push(Context(epoch).get(), PushOf(key), &resp);
  }
  grpc::Status Exchange(const std::string& epoch, uint64_t key) {
    v1::ExchangeRequest req;
    *req.mutable_push() = PushOf(key);
    AddLookup(req.mutable_lookup(), "t", {key});
    v1::ExchangeResponse resp;
    return embedding_->Exchange(Context(epoch).get(), req, &resp);
  }
  // The shard's stored rows of table t and row `key` (read without an epoch).
  std::pair<uint64_t, std::vector<float>> State(uint64_t key) {
    v1::ListTablesResponse list;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->ListTables(&ctx, {}, &list).ok());
    v1::LookupRequest req;
    AddLookup(&req, "t", {key});
    req.mutable_tables(0)->set_read_only(true);
    v1::LookupResponse resp;
    EXPECT_TRUE(embedding_->Lookup(Context("").get(), req, &resp).ok());
    return {list.tables(0).rows(), Floats(resp.tables(0).rows())};
  }

  std::unique_ptr<ServerProcess> shard_;
  std::unique_ptr<v1::EmbeddingService::Stub> embedding_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(RoutingEpochIntegrationTest, CallsOfAnotherEpochAreAbortedAndChangeNothing) {
  // A shard that started empty is at epoch 1.
  v1::GetShardInfoResponse info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin_->GetShardInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.routing_epoch(), 1u);
  ASSERT_TRUE(Lookup("1", 7).ok());  // key 7 stored
  const auto before = State(7);
  const std::vector<std::pair<std::string, std::function<grpc::Status()>>> calls = {
      {"Lookup", [&] { return Lookup("2", 8); }},
      {"Push", [&] { return Push("2", 7); }},
      {"Exchange", [&] { return Exchange("2", 7); }},
  };
  for (const auto& [rpc, call] : calls) {
    const grpc::Status s = call();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << rpc << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(rpc + ": routed by routing epoch 2, but shard 0 of 1 is at "
                                           "routing epoch 1"),
              std::string::npos)
        << s.error_message();
    EXPECT_EQ(State(7), before) << rpc << " changed the shard";
  }
  const grpc::Status bad = Push("two", 7);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_NE(bad.error_message().find(
                "metadata 'ember-routing-epoch': expected a decimal number, received 'two'"),
            std::string::npos)
      << bad.error_message();
  EXPECT_EQ(State(7), before);
  // The shard's epoch, or none, is served.
  EXPECT_TRUE(Push("1", 7).ok());
  EXPECT_TRUE(Exchange("", 7).ok());
  EXPECT_TRUE(Lookup("", 8).ok());
  EXPECT_NE(State(7), before);
  EXPECT_EQ(State(8).first, before.first + 1);
}

}  // namespace
}  // namespace ember::testing
