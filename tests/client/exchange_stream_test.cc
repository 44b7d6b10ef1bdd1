// Client::Exchange over EmbeddingService.ExchangeStream against real
// ember-server processes: many steps share one stream per shard, rows come
// out bit-identical to unary exchanges, a failed exchange ends only its own
// stream, a deadline is enforced per exchange, closing the client closes its
// streams, and no call runs on gRPC's callback threads. Bytes on the stream
// that do not parse fail the exchange on either side (a stand-in peer plays
// a shard that answers garbage). The shards' own counters
// (ember_exchange_streams_*) say how many streams were opened.
#include <cstring>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/call_driver.h"
#include "client/exchange_stream.h"
#include "common/aliased_serialize.h"
#include "client/request_plan.h"
#include "ember/client.h"
#include "grpcpp/generic/async_generic_service.h"
#include "gtest/gtest.h"
#include "tests/server/http_get.h"
#include "tests/server/requests.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace ember::testing {
namespace {

constexpr uint32_t kShards = 2;
constexpr uint32_t kDim = 8;

// The value of the series `series` (name and labels exactly as exposed) in
// a shard's /metrics text; -1 if absent.
double MetricValue(const ServerProcess& shard, const std::string& series) {
  absl::StatusOr<std::string> text = HttpGet(shard.metrics_port(), "/metrics");
  EXPECT_OK(text);
  if (!text.ok()) return -1;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// Bytes that are neither an ExchangeRequest nor an ExchangeResponse: field 1,
// length-delimited, with a length that runs past the end.
grpc::ByteBuffer NotAMessage() {
  grpc::Slice slice(std::string("\x0a\x7f\x01", 3));
  return grpc::ByteBuffer(&slice, 1);
}

// Drives `driver` until `ended` is set, or for at most 20 s (then the
// exchange is cancelled and UNKNOWN returned).
grpc::Status AwaitExchange(CallDriver* driver, ExchangeStream* stream,
                           std::optional<grpc::Status>* ended) {
  if (driver->Drive(absl::Now() + absl::Seconds(20), [&] { return ended->has_value(); })) {
    return **ended;
  }
  stream->CancelForDeadline();
  driver->Drive(absl::InfiniteFuture(), [&] { return ended->has_value(); });
  return grpc::Status(grpc::StatusCode::UNKNOWN, "the exchange did not end in 20 s");
}

// Sends `bytes` as one exchange on a new stream to `address` and returns how
// the exchange ended (UNKNOWN if it had not ended after 20 s).
grpc::Status SendRaw(const std::string& address, grpc::ByteBuffer bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  CallDriver driver;  // before the stream, which drives it as it closes
  ExchangeAnswer response;
  std::optional<grpc::Status> ended;
  ExchangeStream stream(&stub, &driver, absl::Seconds(10), CallMetadata(""));
  stream.Send(std::move(bytes), &response, [&](grpc::Status s) { ended = std::move(s); });
  return AwaitExchange(&driver, &stream, &ended);
}

class ExchangeStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Cluster> shards = StartCluster(kShards, {"--metrics_port=0"});
    ASSERT_OK(shards);
    shards_ = std::move(*shards);
  }

  std::unique_ptr<Client> Connect(bool streams, absl::Duration rpc_timeout = absl::Seconds(20)) {
    ClientOptions o;
    for (const auto& s : shards_) o.shards.push_back(s->address());
    o.exchange_streams = streams;
    o.rpc_timeout = rpc_timeout;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
    EXPECT_OK(client);
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Step t's exchange for `table`: gradients of step t - 1 (if t > 0) on
  // half the keys, and a lookup of all of them, on every shard.
  std::vector<v1::ExchangeRequest> StepRequests(const std::string& table, int t,
                                                uint32_t dim = kDim) {
    std::vector<v1::ExchangeRequest> requests(kShards);
    for (uint32_t s = 0; s < kShards; ++s) {
      const std::vector<uint64_t> keys = OwnedKeys(s, kShards, 32, 1 + t % 3);
      if (t > 0) {
        const std::vector<uint64_t> pushed(keys.begin(), keys.begin() + 16);
        std::vector<float> grads(pushed.size() * dim);
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>((i + t) % 7);
        AddGradients(requests[s].mutable_push(), table, pushed, grads);
        requests[s].mutable_push()->set_step(t - 1);
      }
      AddLookup(requests[s].mutable_lookup(), table, keys);
    }
    return requests;
  }

  Cluster shards_;
};

TEST_F(ExchangeStreamTest, ManyStepsTravelOnOneStreamPerShardWithRowsBitIdenticalToUnary) {
  std::unique_ptr<Client> streamed = Connect(true);
  std::unique_ptr<Client> unary = Connect(false);
  ASSERT_NE(streamed, nullptr);
  ASSERT_NE(unary, nullptr);
  ASSERT_OK(streamed->CreateTable(AdagradTable("s", kDim)));
  ASSERT_OK(streamed->CreateTable(AdagradTable("u", kDim)));  // same config, same seed
  constexpr int kSteps = 30;
  for (int t = 0; t < kSteps; ++t) {
    std::vector<v1::ExchangeResponse> a, b;
    ASSERT_OK(streamed->Exchange(StepRequests("s", t), &a));
    ASSERT_OK(unary->Exchange(StepRequests("u", t), &b));
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_EQ(a[s].lookup().tables_size(), 1);
      ASSERT_EQ(a[s].lookup().tables(0).rows(), b[s].lookup().tables(0).rows())
          << "step " << t << " shard " << s;
      EXPECT_EQ(a[s].push().tables_size(), t > 0 ? 1 : 0);
    }
  }
  const std::vector<uint64_t> keys = OwnedKeys(0, kShards, 40);
  absl::StatusOr<std::vector<float>> s_rows = streamed->LookupRows("s", keys);
  absl::StatusOr<std::vector<float>> u_rows = unary->LookupRows("u", keys);
  ASSERT_OK(s_rows);
  ASSERT_OK(u_rows);
  EXPECT_EQ(*s_rows, *u_rows);
  for (const auto& shard : shards_) {
    // One stream per shard for every step of the streamed client.
    EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_opened_total"), 1);
    EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_open"), 1);
    // Both clients' exchanges are counted as Exchange calls.
    EXPECT_EQ(MetricValue(*shard, "ember_rpc_requests_total{rpc=\"Exchange\",code=\"OK\"}"),
              2 * kSteps);
  }
}

// Requests handed over are sent with their gradients aliased (at dim 256 a
// shard's gradients are 16 KiB, over the serializer's block); the shards
// must train exactly as from copied requests.
TEST_F(ExchangeStreamTest, HandedOverRequestsTrainExactlyLikeCopiedOnes) {
  constexpr uint32_t kWide = 256;
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("handed", kWide)));
  ASSERT_OK(client->CreateTable(AdagradTable("copied", kWide)));  // same config, same seed
  for (int t = 0; t < 12; ++t) {
    std::vector<v1::ExchangeRequest> handed = StepRequests("handed", t, kWide);
    std::vector<v1::ExchangeResponse> a, b;
    ASSERT_OK(client->Exchange(HandOver(&handed), &a));
    ASSERT_OK(client->Exchange(StepRequests("copied", t, kWide), &b));
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_EQ(a[s].lookup().tables_size(), 1);
      ASSERT_EQ(a[s].lookup().tables(0).rows().size(), 32 * kWide * sizeof(float));
      ASSERT_EQ(a[s].lookup().tables(0).rows(), b[s].lookup().tables(0).rows())
          << "step " << t << " shard " << s;
    }
  }
}

// Answers whose rows stay in gRPC's receive buffers (ExchangeAnswer) hold
// the same rows as copied responses; at dim 256 a shard's rows (64 KiB) span
// several of gRPC's slices, so rows are read across slice boundaries too.
TEST_F(ExchangeStreamTest, AnswersReadInPlaceHoldTheSameRowsAsCopiedResponses) {
  constexpr uint32_t kWide = 256;
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("w", kWide)));
  for (int t = 0; t < 3; ++t) {
    std::vector<v1::ExchangeRequest> requests(kShards);
    for (uint32_t s = 0; s < kShards; ++s) {
      AddLookup(requests[s].mutable_lookup(), "w", OwnedKeys(s, kShards, 64, 1 + t));
    }
    std::vector<v1::ExchangeResponse> copied;
    ASSERT_OK(client->Exchange(requests, &copied));
    std::vector<ExchangeAnswer> answers;
    ASSERT_OK(client->Exchange(HandOver(&requests), &answers));
    ASSERT_EQ(answers.size(), kShards);
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_EQ(answers[s].message().lookup().tables_size(), 1);
      EXPECT_TRUE(answers[s].message().lookup().tables(0).rows().empty());  // in place
      const size_t row_bytes = kWide * sizeof(float);
      std::string rows;
      answers[s].ForEachRow(0, row_bytes, [&](size_t, const char* row) { rows.append(row, row_bytes); });
      EXPECT_EQ(rows.size(), 64 * row_bytes);
      EXPECT_EQ(rows, copied[s].lookup().tables(0).rows()) << "step " << t << " shard " << s;
    }
  }
}

TEST_F(ExchangeStreamTest, ANullHandedOverRequestIsRefusedNamingItsIndex) {
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests(kShards);
  requests[0] = std::make_shared<v1::ExchangeRequest>();
  std::vector<v1::ExchangeResponse> responses;
  const absl::Status s = client->Exchange(requests, &responses);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "request 1 is null")) << s;
}

// What gRPC's generated handler did with such a message (INTERNAL) would
// blame the shard; every server mode parses the stream itself and blames the
// request.
TEST_F(ExchangeStreamTest, AShardOfEveryModeAnswersAStreamMessageThatIsNotARequestWithInvalidArgument) {
  for (const char* mode : {"--rpc_mode=sync", "--rpc_mode=async"}) {
    SCOPED_TRACE(mode);
    absl::StatusOr<Cluster> cluster = StartCluster(1, {mode});
    ASSERT_OK(cluster);
    const std::string address = (*cluster)[0]->address();
    const grpc::Status s = SendRaw(address, NotAMessage());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "is not an ExchangeRequest"))
        << s.error_message();

    // The shard serves on: a well-formed exchange on a new stream works.
    ClientOptions o;
    o.shards = {address};
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
    ASSERT_OK(client);
    ASSERT_OK((*client)->CreateTable(AdagradTable("s", kDim)));
    std::vector<v1::ExchangeRequest> requests(1);
    AddLookup(requests[0].mutable_lookup(), "s", {1, 2, 3});
    std::vector<v1::ExchangeResponse> responses;
    ASSERT_OK((*client)->Exchange(requests, &responses));
    EXPECT_EQ(responses[0].lookup().tables(0).rows().size(), 3 * kDim * sizeof(float));
  }
}

// The suite's shards: async (the default), or sync in the sync/ run of the
// suite.
TEST_F(ExchangeStreamTest, AShardFailsAStreamMessageThatIsNotARequestAndServesOn) {
  const grpc::Status s = SendRaw(shards_[0]->address(), NotAMessage());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
  std::vector<v1::ExchangeResponse> responses;
  ASSERT_OK(client->Exchange(StepRequests("s", 0), &responses));
}

// A peer on the exchange method that answers every message with bytes that
// are not an ExchangeResponse. Ember's shards cannot be made to do that.
class GarbageAnsweringPeer final : public grpc::CallbackGenericService {
 public:
  GarbageAnsweringPeer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~GarbageAnsweringPeer() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  bool started() const { return server_ != nullptr && port_ > 0; }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    Reactor() { StartRead(&in_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      out_ = NotAMessage();
      StartWrite(&out_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::CANCELLED);
        return;
      }
      StartRead(&in_);
    }
    void OnCancel() override {}
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer in_, out_;
  };

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Reactor;
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(ExchangeStreamPeerTest, AnAnswerThatIsNotAResponseFailsTheExchangeWithInternalAndEndsTheStream) {
  GarbageAnsweringPeer peer;
  ASSERT_TRUE(peer.started());
  grpc::GenericStub stub(grpc::CreateChannel(peer.address(), grpc::InsecureChannelCredentials()));
  v1::ExchangeRequest request;
  AddLookup(request.mutable_lookup(), "t", {1});
  CallDriver driver;
  ExchangeAnswer response;
  std::optional<grpc::Status> ended;
  ExchangeStream stream(&stub, &driver, absl::Seconds(10), CallMetadata(""));
  stream.Send(SerializeCopied(request), &response, [&](grpc::Status s) { ended = std::move(s); });
  const grpc::Status s = AwaitExchange(&driver, &stream, &ended);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "is not an ExchangeResponse"))
      << s.error_message();
  // The stream is cancelled and over, so that its session replaces it
  // instead of reusing it.
  EXPECT_TRUE(stream.finished());
}

// The answer can arrive before gRPC reports the request written; the next
// exchange must still wait for that before it writes (gRPC aborts on two
// writes in flight on one stream).
TEST_F(ExchangeStreamTest, BackToBackExchangesOnOneStreamAllSucceed) {
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
  // Large pushes (their writes take longer) with a one-key lookup (its
  // answer comes fast).
  std::vector<v1::ExchangeRequest> requests(kShards);
  for (uint32_t s = 0; s < kShards; ++s) {
    const std::vector<uint64_t> keys = OwnedKeys(s, kShards, 4096);
    AddGradients(requests[s].mutable_push(), "s", keys,
                 std::vector<float>(keys.size() * kDim, 0.001f));
    AddLookup(requests[s].mutable_lookup(), "s", {keys[0]}, /*read_only=*/true);
  }
  std::vector<v1::ExchangeResponse> responses;
  for (int i = 0; i < 300; ++i) ASSERT_OK(client->Exchange(requests, &responses)) << i;
  for (const auto& shard : shards_) {
    EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_opened_total"), 1);
  }
}

TEST_F(ExchangeStreamTest, AFailedExchangeNamesTheTableChangesNothingAndOnlyItsStreamIsReplaced) {
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
  std::vector<v1::ExchangeResponse> responses;
  ASSERT_OK(client->Exchange(StepRequests("s", 0), &responses));
  absl::StatusOr<uint64_t> rows_before = client->StoredRows("s");
  ASSERT_OK(rows_before);
  const std::vector<float> before = *client->LookupRows("s", OwnedKeys(1, kShards, 16));

  // Step 1 pushes to "s" and to a table that does not exist.
  std::vector<v1::ExchangeRequest> bad = StepRequests("s", 1);
  for (auto& r : bad) {
    AddGradients(r.mutable_push(), "nope", {7}, std::vector<float>(kDim, 1.0f));
  }
  absl::Status s = client->Exchange(bad, &responses);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s;
  EXPECT_EQ(*client->StoredRows("s"), *rows_before);
  EXPECT_EQ(*client->LookupRows("s", OwnedKeys(1, kShards, 16)), before);

  // The next exchange works, on a new stream per shard.
  ASSERT_OK(client->Exchange(StepRequests("s", 1), &responses));
  for (const auto& shard : shards_) {
    EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_opened_total"), 2);
    EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_open"), 1);
  }
}

TEST_F(ExchangeStreamTest, AnExchangeWaitingPastTheRpcTimeoutFailsWithDeadlineExceededThenStreamsGoOn) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(500);
  std::unique_ptr<Client> client = Connect(true, kTimeout);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
  ASSERT_OK(client->RegisterWorker(1, 0));
  ASSERT_OK(client->RegisterWorker(2, 0));
  // Worker 1 asks for step 3 with staleness 0: it waits for worker 2's
  // pushes of steps 0..2, which never come.
  std::vector<v1::ExchangeRequest> waiting = StepRequests("s", 0);
  for (auto& r : waiting) {
    r.mutable_lookup()->set_step(3);
    r.mutable_lookup()->set_worker_id(1);
  }
  std::vector<v1::ExchangeResponse> responses;
  const absl::Time start = absl::Now();
  absl::Status s = client->Exchange(waiting, &responses);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(took, kTimeout - absl::Milliseconds(50));
  EXPECT_LT(took, absl::Seconds(10));
  ASSERT_OK(client->UnregisterWorker(2));
  ASSERT_OK(client->Exchange(StepRequests("s", 0), &responses));
  ASSERT_OK(client->UnregisterWorker(1));
}

// gRPC 1.51 runs callback-API completions on "nexting_thread"s, which then
// also poll the sockets: each answer would wake one of them and then the
// waiting caller (docs/client.md, "Calls driven by the waiting thread").
// The client library drives every call from the caller's thread instead.
TEST_F(ExchangeStreamTest, TheClientRunsNoGrpcCallbackThreads) {
  std::unique_ptr<Client> client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
  ASSERT_OK(client->RegisterWorker(1, 0));
  std::vector<v1::ExchangeResponse> responses;
  for (int t = 0; t < 5; ++t) ASSERT_OK(client->Exchange(StepRequests("s", t), &responses));
  ASSERT_OK(client->LookupRows("s", OwnedKeys(0, kShards, 8)).status());
  ASSERT_OK(client->StoredRows("s").status());
  ASSERT_OK(client->UnregisterWorker(1));
  const std::vector<std::string> names = ThreadNames();
  EXPECT_GT(names.size(), 1u);  // gRPC's own timer threads at least
  for (const std::string& name : names) EXPECT_NE(name, "nexting_thread");
}

TEST_F(ExchangeStreamTest, ClosingTheClientClosesItsStreamsOnEveryShard) {
  {
    std::unique_ptr<Client> client = Connect(true);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->CreateTable(AdagradTable("s", kDim)));
    std::vector<v1::ExchangeResponse> responses;
    ASSERT_OK(client->Exchange(StepRequests("s", 0), &responses));
    for (const auto& shard : shards_) {
      EXPECT_EQ(MetricValue(*shard, "ember_exchange_streams_open"), 1);
    }
  }
  for (const auto& shard : shards_) {
    double open = -1;
    for (int i = 0; i < 100 && open != 0; ++i) {  // the shard sees the end soon after
      open = MetricValue(*shard, "ember_exchange_streams_open");
      if (open != 0) absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(open, 0);
  }
}

}  // namespace
}  // namespace ember::testing
