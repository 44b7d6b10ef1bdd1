// Bearer tokens and roles (ember-server --auth_tokens_file) against a real
// shard serving TLS (certificates made at test time): no token or an
// unknown one is UNAUTHENTICATED; each of the three roles (reader, trainer,
// admin) makes exactly the calls its rights allow and gets
// PERMISSION_DENIED, changing nothing, for every other; the client
// library's auth_token works on unary calls and on ExchangeStream; refusals
// are counted in the metrics; tokens appear in no message; a shard with
// tokens and no TLS warns that they cross the network in plaintext.
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ember/client.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/health_check.h"
#include "shard/token_auth.h"
#include "tests/server/http_get.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr char kReaderToken[] = "reader-token-0123456789abcdef";
constexpr char kTrainerToken[] = "trainer-token-0123456789abcdef";
constexpr char kAdminToken[] = "admin-token-0123456789abcdef";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AuthIntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(TempPath("auth_certs"));
    std::string out;
    ASSERT_EQ(RunCommand({"bash", EMBER_MAKE_CERTS, *certs_}, "", &out), 0) << out;
  }
  static void TearDownTestSuite() {
    std::string out;
    RunCommand({"rm", "-rf", *certs_}, "", &out);
    delete certs_;
  }
  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }

  void SetUp() override {
    tokens_path_ = TempPath("tokens.txt");
    std::ofstream(tokens_path_) << "# token role\n"
                                << kReaderToken << " reader\n"
                                << kTrainerToken << " trainer\n"
                                << kAdminToken << " admin\n";
    checkpoint_dir_ = TempPath("auth_checkpoints");
    absl::StatusOr<std::unique_ptr<ServerProcess>> p =
        ServerProcess::Start({"--auth_tokens_file=" + tokens_path_, "--metrics_port=0",
                              "--tls_cert=" + Cert("server.pem"), "--tls_key=" + Cert("server.key"),
                              "--checkpoint_dir=" + checkpoint_dir_});
    ASSERT_OK(p);
    shard_ = std::move(*p);
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadText(Cert("ca.pem"));
    channel_ = grpc::CreateChannel(shard_->address(), grpc::SslCredentials(ssl));
    embedding_ = v1::EmbeddingService::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
  }
  void TearDown() override {
    std::string out;
    RunCommand({"rm", "-rf", checkpoint_dir_}, "", &out);
  }

  static ClientTlsOptions Tls() {
    ClientTlsOptions tls;
    tls.enabled = true;
    tls.ca_file = Cert("ca.pem");
    return tls;
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
  grpc::Status Lookup(const std::string& token, const std::vector<uint64_t>& keys = {1, 2},
                      bool read_only = false) {
    v1::LookupRequest req;
    AddLookup(&req, "t", keys);
    req.mutable_tables(0)->set_read_only(read_only);
    v1::LookupResponse resp;
    return embedding_->Lookup(Context(token).get(), req, &resp);
  }
  // The shard's tables and their stored rows, read with the admin token.
  std::map<std::string, uint64_t> Tables() {
    v1::ListTablesResponse list;
    EXPECT_TRUE(admin_->ListTables(Context(kAdminToken).get(), {}, &list).ok());
    std::map<std::string, uint64_t> out;
    for (const v1::TableInfo& t : list.tables()) out[t.config().name()] = t.rows();
    return out;
  }
  static void ExpectRefused(const grpc::Status& s, grpc::StatusCode code,
                            const std::string& fragment) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(fragment), std::string::npos) << s.error_message();
    for (const char* token : {kReaderToken, kTrainerToken, kAdminToken}) {
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

  static std::string* certs_;
  std::string tokens_path_;
  std::string checkpoint_dir_;
  std::unique_ptr<ServerProcess> shard_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingService::Stub> embedding_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

std::string* AuthIntegrationTest::certs_ = nullptr;

TEST_F(AuthIntegrationTest, CallsWithoutAKnownTokenAreUnauthenticatedAndChangeNothing) {
  ExpectRefused(CreateTable("", "t"), grpc::StatusCode::UNAUTHENTICATED,
                "no 'authorization' metadata");
  ExpectRefused(CreateTable("not-a-token-of-this-shard", "t"), grpc::StatusCode::UNAUTHENTICATED,
                "not one this shard knows");
  ExpectRefused(Lookup(""), grpc::StatusCode::UNAUTHENTICATED, "Lookup");
  ExpectRefused(Lookup("", {1}, /*read_only=*/true), grpc::StatusCode::UNAUTHENTICATED, "Lookup");
  v1::ListTablesResponse list;
  ASSERT_TRUE(admin_->ListTables(Context(kTrainerToken).get(), {}, &list).ok());
  EXPECT_EQ(list.tables_size(), 0);
  EXPECT_EQ(Denied("CreateTable", "UNAUTHENTICATED"), 2);
  EXPECT_EQ(Denied("Lookup", "UNAUTHENTICATED"), 2);
  // The health service stays open: probes carry no token.
  EXPECT_OK(CheckHealth(shard_->address(), absl::Seconds(5), "", Tls()));
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

// Every RPC with the least role that may make it, called with each role's
// token: allowed calls succeed, the others are PERMISSION_DENIED naming the
// role needed and change nothing. Each role's calls touch their own keys,
// tables and checkpoint, so what a refused call would have changed shows.
TEST_F(AuthIntegrationTest, EachRoleMakesExactlyTheCallsItsRightsAllowAndNoOther) {
  ASSERT_TRUE(CreateTable(kAdminToken, "t").ok());
  struct Call {
    std::string rpc;
    Role least;
    std::function<grpc::Status(const std::string& token, int role)> run;
  };
  // Keys of role r: 100 * (r + 1) + i.
  auto key = [](int role, int i) { return static_cast<uint64_t>(100 * (role + 1) + i); };
  const std::vector<Call> calls = {
      {"Lookup (read_only)", Role::kReader,
       [&](const std::string& token, int r) { return Lookup(token, {key(r, 0)}, true); }},
      {"Lookup (inserting)", Role::kTrainer,
       [&](const std::string& token, int r) { return Lookup(token, {key(r, 1)}, false); }},
      {"Push", Role::kTrainer,
       [&](const std::string& token, int r) {
         v1::PushRequest req;
         AddGradients(&req, "t", {key(r, 2)}, {0.5f, 0.5f, 0.5f, 0.5f});
         v1::PushResponse resp;
         return embedding_->Push(Context(token).get(), req, &resp);
       }},
      {"Exchange", Role::kTrainer,
       [&](const std::string& token, int r) {
         v1::ExchangeRequest req;
         AddLookup(req.mutable_lookup(), "t", {key(r, 3)});
         v1::ExchangeResponse resp;
         return embedding_->Exchange(Context(token).get(), req, &resp);
       }},
      {"ExchangeStream", Role::kTrainer,
       [&](const std::string& token, int r) {
         auto ctx = Context(token);
         auto stream = embedding_->ExchangeStream(ctx.get());
         v1::ExchangeRequest req;
         AddLookup(req.mutable_lookup(), "t", {key(r, 4)});
         stream->Write(req);
         stream->WritesDone();
         v1::ExchangeResponse resp;
         while (stream->Read(&resp)) {
         }
         return stream->Finish();
       }},
      {"RegisterWorker", Role::kTrainer,
       [&](const std::string& token, int r) {
         v1::RegisterWorkerRequest req;
         req.set_worker_id(r + 1);
         v1::RegisterWorkerResponse resp;
         return embedding_->RegisterWorker(Context(token).get(), req, &resp);
       }},
      {"UnregisterWorker", Role::kTrainer,
       [&](const std::string& token, int r) {
         v1::UnregisterWorkerRequest req;
         req.set_worker_id(r + 1);
         v1::UnregisterWorkerResponse resp;
         return embedding_->UnregisterWorker(Context(token).get(), req, &resp);
       }},
      {"ListTables", Role::kReader,
       [&](const std::string& token, int) {
         v1::ListTablesResponse resp;
         return admin_->ListTables(Context(token).get(), {}, &resp);
       }},
      {"GetShardInfo", Role::kReader,
       [&](const std::string& token, int) {
         v1::GetShardInfoResponse resp;
         return admin_->GetShardInfo(Context(token).get(), {}, &resp);
       }},
      {"ListCheckpoints", Role::kTrainer,
       [&](const std::string& token, int) {
         v1::ListCheckpointsResponse resp;
         return admin_->ListCheckpoints(Context(token).get(), {}, &resp);
       }},
      {"CreateTable", Role::kAdmin,
       [&](const std::string& token, int r) {
         return CreateTable(token, absl::StrCat("created_", r));
       }},
      {"DropTable", Role::kAdmin,
       [&](const std::string& token, int r) {
         v1::DropTableRequest req;
         req.set_name(absl::StrCat("kept_", r));
         v1::DropTableResponse resp;
         return admin_->DropTable(Context(token).get(), req, &resp);
       }},
      {"Checkpoint", Role::kAdmin,
       [&](const std::string& token, int r) {
         v1::CheckpointRequest req;
         req.set_id(absl::StrCat("by_", r));
         v1::CheckpointResponse resp;
         return admin_->Checkpoint(Context(token).get(), req, &resp);
       }},
  };
  const std::vector<std::pair<Role, std::string>> roles = {
      {Role::kReader, kReaderToken}, {Role::kTrainer, kTrainerToken}, {Role::kAdmin, kAdminToken}};
  for (const auto& [role, token] : roles) {
    ASSERT_TRUE(CreateTable(kAdminToken, absl::StrCat("kept_", static_cast<int>(role))).ok());
  }
  for (const auto& [role, token] : roles) {
    const int r = static_cast<int>(role);
    for (const Call& call : calls) {
      SCOPED_TRACE(absl::StrCat(call.rpc, " with a ", RoleName(role), " token"));
      const grpc::Status s = call.run(token, r);
      if (role >= call.least) {
        EXPECT_TRUE(s.ok()) << s.error_message();
      } else {
        ExpectRefused(s, grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat(": expected role ", RoleName(call.least)));
        ExpectRefused(s, grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat("received a token of role ", RoleName(role)));
      }
    }
  }
  // What the refused calls would have changed did not change: the reader
  // inserted no row (its read_only lookup stores none either), pushed none,
  // created and dropped no table; only the admin's checkpoint exists.
  const std::map<std::string, uint64_t> tables = Tables();
  EXPECT_EQ(tables.count("created_0") + tables.count("created_1"), 0u);
  EXPECT_EQ(tables.count("created_2"), 1u);
  EXPECT_EQ(tables.count("kept_0") + tables.count("kept_1"), 2u);
  EXPECT_EQ(tables.count("kept_2"), 0u);
  // Rows: the trainer's and the admin's inserting lookup, push, exchange and
  // stream (4 keys each); none of the reader's.
  EXPECT_EQ(tables.at("t"), 8u);
  v1::ListCheckpointsResponse listed;
  ASSERT_TRUE(admin_->ListCheckpoints(Context(kAdminToken).get(), {}, &listed).ok());
  ASSERT_EQ(listed.checkpoints_size(), 1);
  EXPECT_EQ(listed.checkpoints(0).id(), "by_2");
  // The inserting lookup's refusal says why it is not a reader's call.
  ExpectRefused(Lookup(kReaderToken, {999}, false), grpc::StatusCode::PERMISSION_DENIED,
                "table 't' has read_only = false");
  EXPECT_EQ(Denied("Lookup", "PERMISSION_DENIED"), 2);
  EXPECT_EQ(Denied("CreateTable", "PERMISSION_DENIED"), 2);
}

TEST_F(AuthIntegrationTest, TheClientLibrarySendsItsTokenOnUnaryCallsAndOnExchangeStreams) {
  ClientOptions o;
  o.shards = {shard_->address()};
  o.tls = Tls();
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
  check("secret-0123456789 superuser\n", "line 1: expected role reader, trainer or admin");
  check("# comment\n\nsecret-0123456789\n", "line 3: expected '<token> <role>'");
  check("short admin\n", "at least 16 characters");
  check("secret-0123456789 admin\nsecret-0123456789 trainer\n", "line 2: the token is listed twice");
  check("# nothing\n", "expected at least one");
  absl::StatusOr<std::unique_ptr<TokenAuth>> ok = TokenAuth::FromText(
      "secret-0123456789 admin\n\tother-0123456789abc   trainer \n"
      "reader-0123456789abc reader\n",
      "tokens");
  ASSERT_OK(ok);
  EXPECT_EQ((*ok)->size(), 3u);
}

TEST(TokenAuthTest, AShardWithTokensButNoTlsWarnsThatTheyCrossInPlaintext) {
  const std::string tokens = TempPath("plaintext_tokens.txt");
  std::ofstream(tokens) << kTrainerToken << " trainer\n";
  std::string out;
  // The shard serves until `timeout` stops it; its start-up log is the point.
  RunCommand({"timeout", "3", EMBER_SERVER_BIN, "--port=0", "--auth_tokens_file=" + tokens}, "",
             &out);
  EXPECT_NE(out.find("EMBER_READY"), std::string::npos) << out;
  EXPECT_NE(out.find("without TLS"), std::string::npos) << out;
  EXPECT_NE(out.find("plaintext"), std::string::npos) << out;
  EXPECT_EQ(out.find(kTrainerToken), std::string::npos) << out;
}

TEST(TokenAuthTest, TheMetricsEndpointAnswersOnlyScrapesWithItsBearerToken) {
  const std::string token_file = TempPath("metrics_token.txt");
  std::ofstream(token_file) << "metrics-token-0123456789\n";
  absl::StatusOr<std::unique_ptr<ServerProcess>> p =
      ServerProcess::Start({"--metrics_port=0", "--metrics_bearer_token_file=" + token_file});
  ASSERT_OK(p);
  const int port = (*p)->metrics_port();
  absl::StatusOr<std::string> none = HttpGet(port, "/metrics");
  EXPECT_NE(none.status().message().find("401"), std::string::npos) << none.status();
  absl::StatusOr<std::string> wrong =
      HttpGet(port, "/metrics", "Authorization: Bearer metrics-token-0123456788\r\n");
  EXPECT_NE(wrong.status().message().find("401"), std::string::npos) << wrong.status();
  absl::StatusOr<std::string> right =
      HttpGet(port, "/metrics", "Authorization: Bearer metrics-token-0123456789\r\n");
  ASSERT_OK(right);
  EXPECT_NE(right->find("ember_build_info"), std::string::npos);
  // A short token is refused at start-up.
  std::ofstream(token_file) << "short\n";
  EXPECT_FALSE(
      ServerProcess::Start({"--metrics_port=0", "--metrics_bearer_token_file=" + token_file},
                           absl::Seconds(20))
          .ok());
}

TEST(TokenAuthTest, AServerWithAnUnreadableTokensFileExitsNamingIt) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> p =
      ServerProcess::Start({"--auth_tokens_file=/nonexistent/tokens.txt"}, absl::Seconds(20));
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace ember::testing
