// Bearer tokens and roles (ember-server --auth_tokens_file) against a real
// shard: no token or an unknown one is UNAUTHENTICATED, a trainer token may
// not administer (PERMISSION_DENIED), an admin token may do everything, the
// client library's auth_token works on unary calls and on ExchangeStream,
// refusals are counted in the metrics, and tokens appear in no message.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/health_check.h"
#include "server/token_auth.h"
#include "tests/server/http_get.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr char kTrainerToken[] = "trainer-token-0123456789abcdef";
constexpr char kAdminToken[] = "admin-token-0123456789abcdef";

class AuthIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_path_ = TempPath("tokens.txt");
    std::ofstream(tokens_path_) << "# token role\n"
                                << kTrainerToken << " trainer\n"
                                << kAdminToken << " admin\n";
    absl::StatusOr<std::unique_ptr<ServerProcess>> p =
        ServerProcess::Start({"--auth_tokens_file=" + tokens_path_, "--metrics_port=0"});
    ASSERT_OK(p);
    shard_ = std::move(*p);
    channel_ = grpc::CreateChannel(shard_->address(), grpc::InsecureChannelCredentials());
    embedding_ = v1::EmbeddingService::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
  }

  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  grpc::Status CreateTable(const std::string& token, const std::string& name) {
    v1::CreateTableRequest req;
    *req.mutable_config() = AdagradTable(name, 4);
    v1::CreateTableResponse resp;
    return admin_->CreateTable(Context(token).get(), req, &resp);
  }
  grpc::Status Lookup(const std::string& token) {
    v1::LookupRequest req;
    AddLookup(&req, "t", {1, 2});
    v1::LookupResponse resp;
    return embedding_->Lookup(Context(token).get(), req, &resp);
  }
  static void ExpectRefused(const grpc::Status& s, grpc::StatusCode code,
                            const std::string& fragment) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(fragment), std::string::npos) << s.error_message();
    for (const char* token : {kTrainerToken, kAdminToken}) {
      EXPECT_EQ(s.error_message().find(token), std::string::npos) << "a token in the message";
    }
  }
  double Denied(const std::string& rpc, const std::string& code) {
    absl::StatusOr<std::string> text = HttpGet(shard_->metrics_port(), "/metrics");
    EXPECT_OK(text);
    const std::string series =
        absl::StrCat("ember_auth_denied_total{rpc=\"", rpc, "\",code=\"", code, "\"} ");
    std::istringstream lines(text.ok() ? *text : "");
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(series, 0) == 0) return std::stod(line.substr(series.size()));
    }
    return 0;
  }

  std::string tokens_path_;
  std::unique_ptr<ServerProcess> shard_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingService::Stub> embedding_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(AuthIntegrationTest, CallsWithoutAKnownTokenAreUnauthenticatedAndChangeNothing) {
  ExpectRefused(CreateTable("", "t"), grpc::StatusCode::UNAUTHENTICATED,
                "no 'authorization' metadata");
  ExpectRefused(CreateTable("not-a-token-of-this-shard", "t"), grpc::StatusCode::UNAUTHENTICATED,
                "not one this shard knows");
  ExpectRefused(Lookup(""), grpc::StatusCode::UNAUTHENTICATED, "Lookup");
  v1::ListTablesResponse list;
  ASSERT_TRUE(admin_->ListTables(Context(kTrainerToken).get(), {}, &list).ok());
  EXPECT_EQ(list.tables_size(), 0);
  EXPECT_EQ(Denied("CreateTable", "UNAUTHENTICATED"), 2);
  EXPECT_EQ(Denied("Lookup", "UNAUTHENTICATED"), 1);
  // The health service stays open: probes carry no token.
  EXPECT_OK(CheckHealth(shard_->address(), absl::Seconds(5)));
}

TEST_F(AuthIntegrationTest, ATrainerTokenTrainsButMayNotAdministerAnAdminTokenMayDoBoth) {
  ExpectRefused(CreateTable(kTrainerToken, "t"), grpc::StatusCode::PERMISSION_DENIED,
                "CreateTable: expected role admin, received a token of role trainer");
  EXPECT_EQ(Denied("CreateTable", "PERMISSION_DENIED"), 1);
  ASSERT_TRUE(CreateTable(kAdminToken, "t").ok());
  EXPECT_TRUE(Lookup(kTrainerToken).ok());
  EXPECT_TRUE(Lookup(kAdminToken).ok());
  v1::DropTableRequest drop;
  drop.set_name("t");
  v1::DropTableResponse dropped;
  ExpectRefused(admin_->DropTable(Context(kTrainerToken).get(), drop, &dropped),
                grpc::StatusCode::PERMISSION_DENIED, "DropTable");
}

TEST_F(AuthIntegrationTest, TheClientLibrarySendsItsTokenOnUnaryCallsAndOnExchangeStreams) {
  ClientOptions o;
  o.shards = {shard_->address()};
  o.exchange_streams = true;
  o.auth_token = kAdminToken;
  absl::StatusOr<std::unique_ptr<Client>> admin = Client::Connect(o);
  ASSERT_OK(admin);
  ASSERT_OK((*admin)->CreateTable(AdagradTable("t", 4)));

  o.auth_token = kTrainerToken;
  absl::StatusOr<std::unique_ptr<Client>> trainer = Client::Connect(o);
  ASSERT_OK(trainer);
  std::vector<v1::ExchangeRequest> requests(1);
  AddGradients(requests[0].mutable_push(), "t", {1}, {0.1f, 0.1f, 0.1f, 0.1f});
  AddLookup(requests[0].mutable_lookup(), "t", {1, 2});
  std::vector<v1::ExchangeResponse> responses;
  ASSERT_OK((*trainer)->Exchange(requests, &responses));  // on a stream
  EXPECT_EQ(responses[0].lookup().tables(0).rows().size(), 2u * 4 * 4);
  absl::Status denied = (*trainer)->CreateTable(AdagradTable("u", 4));
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;

  o.auth_token = "";
  o.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Client>> anonymous = Client::Connect(o);
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();
}

TEST(TokenAuthTest, BadTokenFilesAreRefusedNamingTheLineButNeverTheToken) {
  auto check = [](const std::string& text, const std::string& fragment) {
    absl::StatusOr<std::unique_ptr<TokenAuth>> auth = TokenAuth::FromText(text, "tokens");
    ASSERT_FALSE(auth.ok()) << text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(auth.status().message().find(fragment), std::string::npos) << auth.status();
    EXPECT_EQ(auth.status().message().find("secret-0123456789"), std::string::npos)
        << auth.status();
  };
  check("secret-0123456789 superuser\n", "line 1: expected role trainer or admin");
  check("# comment\n\nsecret-0123456789\n", "line 3: expected '<token> <role>'");
  check("short admin\n", "at least 16 characters");
  check("secret-0123456789 admin\nsecret-0123456789 trainer\n", "line 2: the token is listed twice");
  check("# nothing\n", "expected at least one");
  absl::StatusOr<std::unique_ptr<TokenAuth>> ok =
      TokenAuth::FromText("secret-0123456789 admin\n\tother-0123456789abc   trainer \n", "tokens");
  ASSERT_OK(ok);
  EXPECT_EQ((*ok)->size(), 2u);
}

TEST(TokenAuthTest, AServerWithAnUnreadableTokensFileExitsNamingIt) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> p =
      ServerProcess::Start({"--auth_tokens_file=/nonexistent/tokens.txt"}, absl::Seconds(20));
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace ember::testing
