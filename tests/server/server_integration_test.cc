// The real ember-server binary on 127.0.0.1, driven through the generated
// stubs: health, admin, lookup/push round trips, every bad input over the
// wire, and graceful shutdown on SIGTERM.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/aliased_serialize.h"
#include "common/dtype.h"
#include "common/wire.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/store_factory.h"
#include "server/health_check.h"
#include "tests/server/http_get.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kShards = 2;
constexpr uint64_t kMaxMessageBytes = 1 << 20;

// Runs against a shard whose tables live on the parameter's device ("cpu",
// or "cuda:0" where there is a GPU).
class ServerIntegrationTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    config_path_ = new std::string(TempPath("ember_tables.textproto"));
    std::ofstream(*config_path_) << R"pb(
      tables {
        name: "clicks"
        dim: 8
        initializer { normal { stddev: 0.05 } seed: 3 }
        optimizer { adagrad { learning_rate: 0.01 initial_accumulator: 0.1 } }
        capacity: 100000
        eviction: EVICTION_POLICY_LRU
      }
    )pb";
  }
  static void TearDownTestSuite() { delete config_path_; }

  void SetUp() override {
    auto device = ParseStoreDevice(GetParam());
    ASSERT_OK(device);
    if (absl::Status s = CheckStoreDevice(*device); !s.ok()) GTEST_SKIP() << s.message();
    auto p = ServerProcess::Start({"--device=" + GetParam(), "--shard_index=0",
                                   absl::StrCat("--shard_count=", kShards),
                                   absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
                                   "--table_config_file=" + *config_path_});
    ASSERT_OK(p);
    server_ = std::move(*p);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(),
                                         args);
    embedding_ = v1::EmbeddingService::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }
  grpc::Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) {
    return embedding_->Lookup(Context().get(), req, resp);
  }
  grpc::Status Push(const v1::PushRequest& req, v1::PushResponse* resp) {
    return embedding_->Push(Context().get(), req, resp);
  }
  static void ExpectError(const grpc::Status& s, grpc::StatusCode code,
                          const std::vector<std::string>& fragments) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    for (const auto& f : fragments) {
      EXPECT_NE(s.error_message().find(f), std::string::npos)
          << "'" << f << "' not in: " << s.error_message();
    }
  }
  uint64_t Rows(const std::string& table) {
    v1::ListTablesResponse list;
    EXPECT_TRUE(admin_->ListTables(Context().get(), {}, &list).ok());
    for (const auto& t : list.tables()) {
      if (t.config().name() == table) return t.rows();
    }
    return ~uint64_t{0};
  }

  static std::string* config_path_;
  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingService::Stub> embedding_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::vector<uint64_t> keys_ = OwnedKeys(0, kShards, 64);
};
std::string* ServerIntegrationTest::config_path_ = nullptr;

TEST_P(ServerIntegrationTest, HealthServiceReportsServingForTheServerAndEachEmberService) {
  EXPECT_OK(CheckHealth(server_->address(), absl::Seconds(10)));
  // Regression: only the empty name was known (NOT_FOUND for these).
  EXPECT_OK(CheckHealth(server_->address(), absl::Seconds(10), "ember.v1.EmbeddingService"));
  EXPECT_OK(CheckHealth(server_->address(), absl::Seconds(10), "ember.v1.AdminService"));
  absl::Status unknown = CheckHealth(server_->address(), absl::Seconds(10), "no.such.Service");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_NE(unknown.message().find("no.such.Service"), std::string::npos) << unknown;
}

TEST_P(ServerIntegrationTest,
       HealthcheckToolExitsZeroWhenServingOnItsAddressOrEmberPortAndOneNamingTheAddressWhenDown) {
  std::string out;
  EXPECT_EQ(RunCommand({EMBER_HEALTHCHECK_BIN, "--address=" + server_->address()}, "", &out), 0)
      << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  // Without --address it checks 127.0.0.1 on $EMBER_PORT, as the images'
  // HEALTHCHECK runs it.
  EXPECT_EQ(
      RunCommand({"env", "EMBER_PORT=" + std::to_string(server_->port()), EMBER_HEALTHCHECK_BIN},
                 "", &out),
      0)
      << out;
  EXPECT_NE(out.find(server_->address() + ": SERVING"), std::string::npos) << out;
  ASSERT_OK(server_->Stop(SIGTERM, absl::Seconds(20)));
  const int rc = RunCommand({EMBER_HEALTHCHECK_BIN, "--address=" + server_->address(),
                             "--timeout=500ms"}, "", &out);
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1) << out;
  EXPECT_NE(out.find(server_->address()), std::string::npos) << out;
}

// The --rpc_mode the suite runs against (CTest registers it once per mode).
std::string RpcMode() {
  const char* mode = getenv("EMBER_SERVER_RPC_MODE");
  return mode != nullptr && *mode != '\0' ? mode : "async";
}

// Reflection is a sync-API service in gRPC, which --rpc_mode=async leaves
// out (server/async_service.h): there the call is UNIMPLEMENTED.
// A string field with invalid UTF-8 fails to parse in libprotobuf, before
// any Ember code (or authentication) sees the call, and libprotobuf logs an
// ERROR line for it: the shard bounds those lines (server/protobuf_log.h),
// so that no client can write to its log once per request.
TEST_P(ServerIntegrationTest, RequestsWithInvalidUtf8FailWithoutALogLineEach) {
  // A shard of its own, whose log (stderr) goes to a file.
  const std::string log_path = TempPath("utf8_shard_log.txt");
  auto shard = ServerProcess::Start(
      {"--device=" + GetParam(), "--table_config_file=" + *config_path_, "--metrics_port=0"},
      absl::Seconds(30), log_path);
  ASSERT_OK(shard);
  auto embedding = v1::EmbeddingService::NewStub(
      grpc::CreateChannel((*shard)->address(), grpc::InsecureChannelCredentials()));
  constexpr int kRequests = 10000;
  const absl::Time start = absl::Now();
  // This process's libprotobuf logs as it serialises them: not the point.
  const google::protobuf::LogSilencer quiet;
  for (int i = 0; i < kRequests; ++i) {
    v1::LookupRequest req;
    AddLookup(&req, "clicks", {1});
    req.mutable_tables(0)->set_table("bad\xff\xfename");
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = embedding->Lookup(&ctx, req, &resp);
    ASSERT_FALSE(s.ok()) << "request " << i;
  }
  // The shard serves on.
  v1::LookupRequest good;
  AddLookup(&good, "clicks", {1});
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(embedding->Lookup(&ctx, good, &resp).ok());
  const double minutes = absl::ToDoubleMinutes(absl::Now() - start);
  // Every line is counted: written or held back.
  absl::StatusOr<std::string> text = HttpGet((*shard)->metrics_port(), "/metrics");
  ASSERT_OK(text);
  auto count = [&](const std::string& outcome) {
    const std::string series =
        absl::StrCat("ember_protobuf_log_lines_total{outcome=\"", outcome, "\"} ");
    const size_t at = text->find(series);
    return at == std::string::npos ? -1.0 : std::stod(text->substr(at + series.size()));
  };
  EXPECT_EQ(count("logged") + count("held_back"), kRequests) << *text;
  ASSERT_OK((*shard)->Stop(SIGTERM, absl::Seconds(20)));
  std::ifstream in(log_path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += absl::StrContains(line, "UTF-8");
  std::remove(log_path.c_str());
  EXPECT_GE(lines, 1) << "the first one is logged";
  // One per 10 s: at most 6 a minute, and the first.
  EXPECT_LE(lines, 1 + static_cast<int>(minutes * 6) + 1)
      << "of " << kRequests << " requests in " << minutes << " minutes";
  EXPECT_EQ(lines, count("logged"));
}

TEST_P(ServerIntegrationTest, ReflectionListsTheEmberServicesExceptOnTheAsyncApi) {
  const bool served = RpcMode() != "async";
  // ServerReflectionRequest{list_services: ""} is field 7, length 0.
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  auto ctx = Context();
  auto call = stub.PrepareCall(ctx.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* t) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, t);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(reinterpret_cast<void*>(1)));
  grpc::Slice request_slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  // Where the method is not served, the server may end the call before the
  // request is written: the write then fails, and only the status matters.
  const bool written = step(reinterpret_cast<void*>(2));
  if (served) ASSERT_TRUE(written);
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  EXPECT_EQ(step(reinterpret_cast<void*>(3)), served);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!served) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    return;
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string bytes = FlattenByteBuffer(response);
  EXPECT_NE(bytes.find("ember.v1.EmbeddingService"), std::string::npos);
  EXPECT_NE(bytes.find("ember.v1.AdminService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
}

// On the async API no thread of the shard waits in gRPC's sync server (whose
// pollers would take turns with the completion thread), and its one
// completion thread serves everything: exchanges, unary calls, admin calls.
TEST_P(ServerIntegrationTest, TheAsyncShardRunsNoSyncServerThreads) {
  if (RpcMode() != "async") GTEST_SKIP() << "for --rpc_mode=async (this run: " << RpcMode() << ")";
  v1::LookupRequest lookup;
  AddLookup(&lookup, "clicks", keys_);
  v1::LookupResponse looked_up;
  ASSERT_TRUE(Lookup(lookup, &looked_up).ok());
  v1::GetShardInfoResponse info;
  ASSERT_TRUE(admin_->GetShardInfo(Context().get(), {}, &info).ok());
  const std::vector<std::string> names = ThreadNames(server_->pid());
  EXPECT_GT(names.size(), 1u);
  for (const std::string& name : names) EXPECT_NE(name, "grpcpp_sync_ser");
}

TEST_P(ServerIntegrationTest, ShardInfoReportsIdentityRoutingAndLimits) {
  v1::GetShardInfoResponse info;
  ASSERT_TRUE(admin_->GetShardInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.shard_index(), 0u);
  EXPECT_EQ(info.shard_count(), kShards);
  EXPECT_EQ(info.routing(), "splitmix64-jump65536");
  EXPECT_EQ(info.max_message_bytes(), kMaxMessageBytes);
  EXPECT_EQ(info.device(), GetParam());
}

TEST_P(ServerIntegrationTest, TablesFromTheConfigFileExistAtStartup) {
  v1::ListTablesResponse list;
  ASSERT_TRUE(admin_->ListTables(Context().get(), {}, &list).ok());
  ASSERT_EQ(list.tables_size(), 1);
  EXPECT_EQ(list.tables(0).config().name(), "clicks");
  EXPECT_EQ(list.tables(0).config().dim(), 8u);
  EXPECT_EQ(list.tables(0).config().eviction(), v1::EVICTION_POLICY_LRU);
}

TEST_P(ServerIntegrationTest, PushThenLookupReturnsTheUpdatedRowsInKeyOrder) {
  v1::LookupRequest lookup;
  v1::LookupResponse before, after;
  AddLookup(&lookup, "clicks", keys_);
  ASSERT_TRUE(Lookup(lookup, &before).ok());
  EXPECT_EQ(before.tables(0).missing(), keys_.size());

  std::vector<float> grads(keys_.size() * 8);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = (i % 5) * 0.25f - 0.5f;
  v1::PushRequest push;
  v1::PushResponse pushed;
  push.set_worker_id(1);
  push.set_step(0);
  AddGradients(&push, "clicks", keys_, grads);
  ASSERT_TRUE(Push(push, &pushed).ok());
  EXPECT_EQ(pushed.tables(0).updated(), keys_.size());
  EXPECT_EQ(pushed.tables(0).inserted(), 0u);

  ASSERT_TRUE(Lookup(lookup, &after).ok());
  std::vector<float> w0 = Floats(before.tables(0).rows()), w1 = Floats(after.tables(0).rows());
  ASSERT_EQ(w1.size(), keys_.size() * 8);
  for (size_t i = 0; i < w1.size(); ++i) {
    const double g = grads[i];
    const double expected = w0[i] - 0.01 * g / (std::sqrt(0.1 + g * g) + 1e-7);
    EXPECT_NEAR(w1[i], expected, 1e-6) << i;
  }
}

TEST_P(ServerIntegrationTest, HalfPrecisionRowsComeBackInTheRequestedDtype) {
  v1::LookupRequest lookup;
  v1::LookupResponse fp32, bf16;
  AddLookup(&lookup, "clicks", keys_, true);
  ASSERT_TRUE(Lookup(lookup, &fp32).ok());
  lookup.mutable_tables(0)->set_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(Lookup(lookup, &bf16).ok());
  EXPECT_EQ(bf16.tables(0).dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(bf16.tables(0).rows().size(), keys_.size() * 8 * 2);
  std::vector<float> f = Floats(fp32.tables(0).rows());
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(LoadElement(bf16.tables(0).rows().data(), DType::kBf16, i),
              RoundTo(DType::kBf16, f[i]));
  }
}

TEST_P(ServerIntegrationTest, EveryBadInputGetsAClearStatusAndChangesNothing) {
  const uint64_t rows_before = Rows("clicks");
  v1::LookupResponse lresp;
  v1::PushResponse presp;
  {  // unknown table
    v1::LookupRequest r;
    AddLookup(&r, "nope", keys_);
    ExpectError(Lookup(r, &lresp), grpc::StatusCode::NOT_FOUND, {"table 'nope'"});
  }
  {  // key bytes not a multiple of 8
    v1::LookupRequest r;
    AddLookup(&r, "clicks", keys_);
    r.mutable_tables(0)->mutable_keys()->push_back('x');
    ExpectError(Lookup(r, &lresp), grpc::StatusCode::INVALID_ARGUMENT,
                {"table 'clicks'", "'keys'", "multiple of 8", "received 513"});
  }
  {  // gradient bytes not n x dim x dtype size
    v1::PushRequest r;
    AddGradients(&r, "clicks", keys_, std::vector<float>(keys_.size() * 8 + 1, 0.1f));
    ExpectError(Push(r, &presp), grpc::StatusCode::INVALID_ARGUMENT,
                {"table 'clicks'", "'gradients'", "expected 2048 bytes", "received 2052"});
  }
  {  // NaN in gradients
    v1::PushRequest r;
    std::vector<float> g(keys_.size() * 8, 0.1f);
    g[100] = std::numeric_limits<float>::quiet_NaN();
    AddGradients(&r, "clicks", keys_, g);
    ExpectError(Push(r, &presp), grpc::StatusCode::INVALID_ARGUMENT,
                {"table 'clicks'", "finite", "row 12"});
  }
  {  // dim mismatch on CreateTable of an existing name
    v1::CreateTableRequest r;
    *r.mutable_config() = AdagradTable("clicks", 16);
    v1::CreateTableResponse resp;
    ExpectError(admin_->CreateTable(Context().get(), r, &resp), grpc::StatusCode::ALREADY_EXISTS,
                {"table 'clicks'", "dim: existing 8, requested 16"});
  }
  {  // misrouted key
    v1::LookupRequest r;
    AddLookup(&r, "clicks", OwnedKeys(1, kShards, 3));
    ExpectError(Lookup(r, &lresp), grpc::StatusCode::INVALID_ARGUMENT,
                {"table 'clicks'", "misrouted", "expected shard 1 of 2"});
  }
  {  // a request larger than the message limit: gRPC refuses it with the limit
    v1::LookupRequest r;
    AddLookup(&r, "clicks", OwnedKeys(0, kShards, kMaxMessageBytes / 8 + 100));
    ExpectError(Lookup(r, &lresp), grpc::StatusCode::RESOURCE_EXHAUSTED,
                {std::to_string(kMaxMessageBytes)});
  }
  {  // a response larger than the limit is refused before any work
    v1::LookupRequest r;
    AddLookup(&r, "clicks", OwnedKeys(0, kShards, kMaxMessageBytes / 32 + 10));
    ExpectError(Lookup(r, &lresp), grpc::StatusCode::RESOURCE_EXHAUSTED,
                {"limit max_message_bytes is 1048576"});
  }
  {  // zero keys: valid, empty answer
    v1::LookupRequest r;
    AddLookup(&r, "clicks", {});
    ASSERT_TRUE(Lookup(r, &lresp).ok());
    EXPECT_TRUE(lresp.tables(0).rows().empty());
  }
  EXPECT_EQ(Rows("clicks"), rows_before);
  EXPECT_TRUE(server_->Running());
}

// Regression (found from outside): 32,768 keys at dim 8 are exactly 1 MiB
// of rows; the answer's framing put it over the 1 MiB limit, gRPC refused
// to send it, and every key had been inserted.
TEST_P(ServerIntegrationTest, ALookupAnswerOverTheLimitByItsFramingIsRefusedAndInsertsNothing) {
  const uint64_t before = Rows("clicks");
  v1::LookupRequest req;
  AddLookup(&req, "clicks", OwnedKeys(0, kShards, 32768, 1 << 20));
  v1::LookupResponse resp;
  ExpectError(Lookup(req, &resp), grpc::StatusCode::RESOURCE_EXHAUSTED,
              {"response would be up to", "limit max_message_bytes is 1048576"});
  EXPECT_EQ(Rows("clicks"), before);
}

TEST_P(ServerIntegrationTest, DropAndRecreateTableOverTheWire) {
  v1::CreateTableRequest create;
  *create.mutable_config() = AdagradTable("tmp", 4);
  v1::CreateTableResponse created;
  ASSERT_TRUE(admin_->CreateTable(Context().get(), create, &created).ok());
  EXPECT_TRUE(created.created());
  v1::DropTableRequest drop;
  drop.set_name("tmp");
  v1::DropTableResponse dropped;
  ASSERT_TRUE(admin_->DropTable(Context().get(), drop, &dropped).ok());
  ExpectError(admin_->DropTable(Context().get(), drop, &dropped), grpc::StatusCode::NOT_FOUND,
              {"table 'tmp'"});
}

// A lookup that waits for a slower worker's push (SSP) runs off the threads
// that read calls (the async server's pool, a sync thread of its own), so
// other calls, and the push that releases it, are answered meanwhile.
TEST_P(ServerIntegrationTest, ALookupWaitingForTheClockHoldsNoOtherCallAndThePushReleasesIt) {
  for (uint32_t worker : {1u, 2u}) {
    v1::RegisterWorkerRequest r;
    r.set_worker_id(worker);
    v1::RegisterWorkerResponse registered;
    ASSERT_TRUE(embedding_->RegisterWorker(Context().get(), r, &registered).ok());
  }
  auto push_step0 = [&](uint32_t worker) {
    v1::PushRequest p;
    p.set_worker_id(worker);
    p.set_step(0);
    v1::PushResponse pushed;
    return Push(p, &pushed);
  };
  ASSERT_TRUE(push_step0(1).ok());
  // Step 1 with staleness 0 needs both workers' step 0: it waits for worker 2.
  v1::LookupRequest waiting;
  AddLookup(&waiting, "clicks", keys_);
  waiting.set_step(1);
  waiting.set_worker_id(1);
  grpc::Status waited;
  v1::LookupResponse waited_rows;
  std::atomic<bool> answered{false};
  std::thread waiter([&] {
    waited = Lookup(waiting, &waited_rows);
    answered = true;
  });
  absl::SleepFor(absl::Milliseconds(200));

  v1::LookupRequest plain;
  AddLookup(&plain, "clicks", keys_);
  v1::LookupResponse rows;
  EXPECT_TRUE(Lookup(plain, &rows).ok());
  v1::GetShardInfoResponse info;
  EXPECT_TRUE(admin_->GetShardInfo(Context().get(), {}, &info).ok());
  EXPECT_FALSE(answered) << "the lookup did not wait for worker 2";
  EXPECT_TRUE(push_step0(2).ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_EQ(waited_rows.tables(0).rows(), rows.tables(0).rows());
}

TEST_P(ServerIntegrationTest, SigtermShutsDownGracefullyWithExitCodeZero) {
  auto status = server_->Stop(SIGTERM, absl::Seconds(20));
  ASSERT_OK(status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, ServerIntegrationTest, ::testing::Values("cpu", "cuda:0"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "cpu" ? std::string("cpu") : std::string("cuda0");
                         });

std::unique_ptr<grpc::ClientContext> ContextWithin(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

// A shard of its own, started with `flags`, holding table "t" (dim 4) with
// SSP workers 1 and 2 registered (staleness 0: step s + 1 needs both
// workers' step s).
struct SspShard {
  std::unique_ptr<ServerProcess> process;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::unique_ptr<v1::EmbeddingService::Stub> embedding;
};
void StartSspShard(const std::vector<std::string>& flags, SspShard* shard) {
  auto server = ServerProcess::Start(flags);
  ASSERT_OK(server);
  shard->process = std::move(*server);
  auto channel =
      grpc::CreateChannel(shard->process->address(), grpc::InsecureChannelCredentials());
  shard->admin = v1::AdminService::NewStub(channel);
  shard->embedding = v1::EmbeddingService::NewStub(channel);
  v1::CreateTableRequest create;
  *create.mutable_config() = AdagradTable("t", 4);
  v1::CreateTableResponse created;
  ASSERT_TRUE(
      shard->admin->CreateTable(ContextWithin(absl::Seconds(10)).get(), create, &created).ok());
  for (uint32_t worker : {1u, 2u}) {
    v1::RegisterWorkerRequest r;
    r.set_worker_id(worker);
    v1::RegisterWorkerResponse registered;
    ASSERT_TRUE(shard->embedding
                    ->RegisterWorker(ContextWithin(absl::Seconds(10)).get(), r, &registered)
                    .ok());
  }
}

// Regression (the async server's first version ran a whole exchange on its
// pool when its lookup might wait): with one pool thread taken by a waiting
// exchange, the exchange whose push releases it must not queue behind it.
// Pushes run where the call was read; only lookups wait.
TEST(ServerSspTest, AnExchangeWhosePushReleasesAWaitingLookupIsNotQueuedBehindIt) {
  SspShard shard;
  ASSERT_NO_FATAL_FAILURE(StartSspShard({"--worker_threads=1"}, &shard));
  // Worker w pushes step 0 and looks up `lookup_step`.
  auto exchange = [&](uint32_t worker, int64_t lookup_step, absl::Duration timeout) {
    v1::ExchangeRequest request;
    request.mutable_push()->set_worker_id(worker);
    request.mutable_push()->set_step(0);
    AddLookup(request.mutable_lookup(), "t", {1, 2, 3});
    request.mutable_lookup()->set_worker_id(worker);
    request.mutable_lookup()->set_step(lookup_step);
    v1::ExchangeResponse response;
    return shard.embedding->Exchange(ContextWithin(timeout).get(), request, &response);
  };
  // Step 1 needs worker 2's step 0: this one waits, on the only pool thread.
  grpc::Status first;
  absl::Time first_done;
  std::thread waiter([&] {
    first = exchange(1, 1, absl::Seconds(20));
    first_done = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  // Worker 2's push releases it; its own lookup (step 2) waits for step 1
  // pushes that never come, until its deadline.
  const absl::Time sent = absl::Now();
  const grpc::Status second = exchange(2, 2, absl::Seconds(3));
  waiter.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_LT(first_done - sent, absl::Seconds(2)) << "released only when the other call ended";
  EXPECT_EQ(second.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << second.error_message();
}

// Regression (CI, Python client: 4 SSP workers against shards with 2 pool
// threads stalled until their deadlines): a lookup that may wait goes to
// the pool; when it becomes ready while every pool thread holds a lookup
// that waits for its own worker's next push (which follows its answer), it
// must not queue behind them. Built here with one pool thread and three
// workers at staleness 0.
TEST(ServerSspTest, ALookupThatBecameReadyIsNotQueuedBehindLookupsWaitingForItsWorker) {
  SspShard shard;
  ASSERT_NO_FATAL_FAILURE(StartSspShard({"--worker_threads=1"}, &shard));
  v1::RegisterWorkerRequest third;
  third.set_worker_id(3);
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(
      shard.embedding->RegisterWorker(ContextWithin(absl::Seconds(10)).get(), third, &registered)
          .ok());
  // Worker w pushes `push_step`, and with `lookup_step` >= 0 looks up that step.
  auto exchange = [&](uint32_t worker, int64_t push_step, int64_t lookup_step,
                      absl::Duration timeout) {
    v1::ExchangeRequest request;
    request.mutable_push()->set_worker_id(worker);
    request.mutable_push()->set_step(push_step);
    if (lookup_step >= 0) {
      AddLookup(request.mutable_lookup(), "t", {1, 2, 3});
      request.mutable_lookup()->set_worker_id(worker);
      request.mutable_lookup()->set_step(lookup_step);
    }
    v1::ExchangeResponse response;
    return shard.embedding->Exchange(ContextWithin(timeout).get(), request, &response);
  };
  for (uint32_t worker : {1u, 2u, 3u}) ASSERT_TRUE(exchange(worker, 0, -1, absl::Seconds(10)).ok());
  ASSERT_TRUE(exchange(1, 1, -1, absl::Seconds(10)).ok());
  // Worker 1's step 3 needs every worker's step 2: it waits on the only
  // pool thread, for worker 2's push of step 2 among others.
  grpc::Status first;
  std::thread waiting_for_2([&] { first = exchange(1, 2, 3, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(300));
  // Worker 2's step 2 needs worker 3's step 1, not there yet: to the pool.
  grpc::Status second;
  absl::Time second_done;
  std::thread ready_later([&] {
    second = exchange(2, 1, 2, absl::Seconds(8));
    second_done = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time ready = absl::Now();
  ASSERT_TRUE(exchange(3, 1, -1, absl::Seconds(10)).ok());  // worker 2's lookup is ready now
  ready_later.join();
  EXPECT_TRUE(second.ok()) << second.error_message();
  EXPECT_LT(second_done - ready, absl::Seconds(2)) << "the ready lookup queued behind worker 1's";
  // Worker 2, answered, pushes step 2 (as a trainer would); with worker 3's,
  // worker 1's lookup goes on.
  EXPECT_TRUE(exchange(2, 2, -1, absl::Seconds(10)).ok());
  EXPECT_TRUE(exchange(3, 2, -1, absl::Seconds(10)).ok());
  waiting_for_2.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
}

// SIGTERM while a lookup waits for the clock (on the async server's pool):
// the shard still exits cleanly once the wait ends (--max_ssp_wait here;
// shutdown does not wake it), and the lookup gets an error, not a hang.
TEST(ServerSspTest, SigtermWhileALookupWaitsForTheClockExitsCleanly) {
  SspShard shard;
  ASSERT_NO_FATAL_FAILURE(
      StartSspShard({"--max_ssp_wait=2s", "--shutdown_grace_seconds=0.5"}, &shard));
  v1::LookupRequest waiting;  // step 1 needs both workers' step 0: none came
  AddLookup(&waiting, "t", {1, 2, 3});
  waiting.set_step(1);
  waiting.set_worker_id(1);
  grpc::Status waited;
  std::thread waiter([&] {
    v1::LookupResponse rows;
    waited = shard.embedding->Lookup(ContextWithin(absl::Seconds(20)).get(), waiting, &rows);
  });
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<int> exit = shard.process->Stop(SIGTERM, absl::Seconds(20));
  waiter.join();
  ASSERT_OK(exit);
  ASSERT_TRUE(WIFEXITED(*exit));
  EXPECT_EQ(WEXITSTATUS(*exit), 0);
  EXPECT_FALSE(waited.ok());
}

TEST(ServerStartupTest, UnknownOrMissingDeviceMakesTheServerExitWithAnError) {
  auto p = ServerProcess::Start({"--device=tpu:0"}, absl::Seconds(20));
  ASSERT_FALSE(p.ok());
  // A GPU index past the machine's devices (there are never 99 here).
  p = ServerProcess::Start({"--device=cuda:99"}, absl::Seconds(20));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
}

// Regression: gRPC's SO_REUSEPORT let a second server bind a port one
// already listened on, and both answered on it.
TEST(ServerStartupTest, ASecondServerOnATakenPortRefusesToStartNamingThePort) {
  auto first = ServerProcess::Start({});
  ASSERT_OK(first);
  const std::string port = std::to_string((*first)->port());
  std::string out;
  // `timeout`: with the defect, the second server would serve for good.
  const int rc = RunCommand({"timeout", "20", EMBER_SERVER_BIN, "--address=127.0.0.1",
                             "--port=" + port, "--metrics_port=-1"},
                            "", &out);
  ASSERT_TRUE(WIFEXITED(rc)) << out;
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  EXPECT_NE(out.find("port " + port + " is in use"), std::string::npos) << out;
  EXPECT_EQ(out.find("EMBER_READY"), std::string::npos) << out;
  EXPECT_OK(CheckHealth((*first)->address(), absl::Seconds(10)));  // the first still serves
}

// A lookup waiting for the consistency clock holds its request's bytes, so
// the limits can be shown over the wire: per connection, then in total.
TEST(ServerLimitsTest, InflightRequestBytesAreBoundedPerConnectionAndInTotal) {
  const std::string config = TempPath("inflight_tables.textproto");
  std::ofstream(config) << R"pb(tables {
    name: "t" dim: 4 initializer { zeros {} } optimizer { sgd { learning_rate: 0.1 } }
  })pb";
  auto server = ServerProcess::Start({"--shard_index=0", "--shard_count=2",
                                      "--table_config_file=" + config,
                                      "--max_inflight_bytes=6000",
                                      "--max_inflight_bytes_per_connection=4000"});
  ASSERT_OK(server);
  // Separate connections: channels with distinct arguments are not shared.
  auto channel = [&](int i) {
    grpc::ChannelArguments args;
    args.SetInt("ember.test.connection", i);
    return v1::EmbeddingService::NewStub(grpc::CreateCustomChannel(
        (*server)->address(), grpc::InsecureChannelCredentials(), args));
  };
  auto first = channel(1), second = channel(2), third = channel(3);
  {
    v1::RegisterWorkerRequest reg;
    reg.set_worker_id(0);
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(first->RegisterWorker(&ctx, reg, &resp).ok());
  }
  const std::vector<uint64_t> keys = OwnedKeys(0, 2, 430);
  auto lookup = [&](size_t n, bool wait) {
    v1::LookupRequest req;
    auto* t = req.add_tables();
    t->set_table("t");
    t->set_keys(PackKeys({keys.data(), n}));
    t->set_read_only(true);
    if (wait) req.set_step(5);  // worker 0 has applied nothing: waits
    return req;
  };
  auto call = [](v1::EmbeddingService::Stub& stub, const v1::LookupRequest& req,
                 std::chrono::milliseconds timeout) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    v1::LookupResponse resp;
    return stub.Lookup(&ctx, req, &resp);
  };
  ASSERT_GT(lookup(370, true).ByteSizeLong(), 2960u);
  grpc::Status waited;
  std::thread holder([&] { waited = call(*first, lookup(370, true), std::chrono::milliseconds(3000)); });
  absl::SleepFor(absl::Milliseconds(800));  // the waiting lookup holds ~3,000 bytes now
  const grpc::Status same_connection = call(*first, lookup(250, false), std::chrono::milliseconds(5000));
  EXPECT_EQ(same_connection.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << same_connection.error_message();
  EXPECT_NE(same_connection.error_message().find("--max_inflight_bytes_per_connection"),
            std::string::npos) << same_connection.error_message();
  const grpc::Status other_connection = call(*second, lookup(250, false), std::chrono::milliseconds(5000));
  EXPECT_TRUE(other_connection.ok()) << other_connection.error_message();
  const grpc::Status over_total = call(*third, lookup(430, false), std::chrono::milliseconds(5000));
  EXPECT_EQ(over_total.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over_total.error_message();
  EXPECT_NE(over_total.error_message().find("on this shard, limit 6000 (--max_inflight_bytes)"),
            std::string::npos) << over_total.error_message();
  holder.join();
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << waited.error_message();
  // Its bytes are given back once the shard has ended the call (just after
  // the client saw its deadline): both calls pass then.
  auto eventually_ok = [&](v1::EmbeddingService::Stub& stub, size_t n) {
    grpc::Status s;
    for (int i = 0; i < 40; ++i) {
      s = call(stub, lookup(n, false), std::chrono::milliseconds(5000));
      if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return s;
  };
  const grpc::Status after_first = eventually_ok(*first, 250);
  EXPECT_TRUE(after_first.ok()) << after_first.error_message();
  const grpc::Status after_third = eventually_ok(*third, 430);
  EXPECT_TRUE(after_third.ok()) << after_third.error_message();
}

TEST(ServerStartupTest, InvalidFlagsMakeTheServerExitWithAnError) {
  auto p = ServerProcess::Start({"--shard_index=3", "--shard_count=2"}, absl::Seconds(20));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
}

}  // namespace
}  // namespace ember::testing
