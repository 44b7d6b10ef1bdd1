#include "client/grpc_channel.h"

#include <atomic>
#include <optional>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "client/call_driver.h"
#include "client/call_metadata.h"
#include "client/exchange_stream.h"
#include "client/internal/exchange_answer_fill.h"
#include "common/aliased_serialize.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "ember/trainer_metrics.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ember {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// CallShards' `issue` for the unary method `prepare` of `stubs`' service,
// e.g. Unary(admin_, &v1::AdminService::Stub::PrepareAsyncListTables).
template <typename Stub, typename Req, typename Resp>
auto Unary(const std::vector<std::unique_ptr<Stub>>& stubs,
           std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (Stub::*prepare)(
               grpc::ClientContext*, const Req&, grpc::CompletionQueue*)) {
  return [&stubs, prepare](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
                           const Req* req, Resp* resp, std::function<void(grpc::Status)> done) {
    StartUnary(driver, (stubs[shard].get()->*prepare)(ctx, *req, driver->cq()), resp,
               std::move(done));
  };
}

class GrpcChannel final : public ShardChannel {
 public:
  explicit GrpcChannel(const ClientOptions& options)
      : options_(options), metadata_(options.auth_token) {}
  absl::Status Open();

  uint32_t shard_count() const override { return static_cast<uint32_t>(embedding_.size()); }
  std::string ShardName(uint32_t shard) const override {
    return absl::StrCat("shard ", shard, " (", options_.shards[shard], ")");
  }
  bool in_process() const override { return false; }
  void SetRoutingEpoch(uint64_t epoch) override { metadata_.set_routing_epoch(epoch); }

  absl::Status GetShardInfo(absl::Duration timeout, bool wait_for_ready,
                            std::vector<v1::GetShardInfoResponse>* responses) override {
    std::vector<v1::GetShardInfoRequest> requests(shard_count());
    return CallShards("GetShardInfo", absl::MakeConstSpan(requests), All(), responses, timeout,
                      [&, get = Unary(admin_, &v1::AdminService::Stub::PrepareAsyncGetShardInfo)](
                          CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
                          const v1::GetShardInfoRequest* req, v1::GetShardInfoResponse* resp,
                          std::function<void(grpc::Status)> done) {
                        ctx->set_wait_for_ready(wait_for_ready);
                        get(driver, shard, ctx, req, resp, std::move(done));
                      });
  }
  absl::Status CreateTable(absl::Span<const v1::CreateTableRequest> requests,
                           std::vector<v1::CreateTableResponse>* responses) override {
    return CallShards("CreateTable", requests, All(), responses, options_.rpc_timeout,
                      Unary(admin_, &v1::AdminService::Stub::PrepareAsyncCreateTable));
  }
  absl::Status ListTables(const std::vector<bool>& active,
                          std::vector<v1::ListTablesResponse>* responses) override {
    std::vector<v1::ListTablesRequest> requests(shard_count());
    return CallShards("ListTables", absl::MakeConstSpan(requests), active, responses,
                      options_.rpc_timeout,
                      Unary(admin_, &v1::AdminService::Stub::PrepareAsyncListTables));
  }
  absl::Status Lookup(absl::Span<const v1::LookupRequest> requests, const std::vector<bool>& active,
                      std::vector<v1::LookupResponse>* responses) override {
    return CallShards("Lookup", requests, active, responses, options_.rpc_timeout,
                      Unary(embedding_, &v1::EmbeddingService::Stub::PrepareAsyncLookup));
  }
  absl::Status Push(absl::Span<const v1::PushRequest> requests,
                    std::vector<v1::PushResponse>* responses) override {
    return CallShards("Push", requests, All(), responses, options_.rpc_timeout,
                      Unary(embedding_, &v1::EmbeddingService::Stub::PrepareAsyncPush));
  }
  absl::Status Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                        std::vector<ShardCall>* calls) override;
  absl::Status RegisterWorker(absl::Span<const v1::RegisterWorkerRequest> requests,
                              std::vector<v1::RegisterWorkerResponse>* responses) override {
    return CallShards("RegisterWorker", requests, All(), responses, options_.rpc_timeout,
                      Unary(embedding_, &v1::EmbeddingService::Stub::PrepareAsyncRegisterWorker));
  }
  absl::Status UnregisterWorker(absl::Span<const v1::UnregisterWorkerRequest> requests,
                                std::vector<v1::UnregisterWorkerResponse>* responses) override {
    return CallShards("UnregisterWorker", requests, All(), responses, options_.rpc_timeout,
                      Unary(embedding_, &v1::EmbeddingService::Stub::PrepareAsyncUnregisterWorker));
  }
  absl::Status Checkpoint(absl::Span<const v1::CheckpointRequest> requests, absl::Duration timeout,
                          std::vector<v1::CheckpointResponse>* responses) override {
    return CallShards("Checkpoint", requests, All(), responses, timeout,
                      Unary(admin_, &v1::AdminService::Stub::PrepareAsyncCheckpoint));
  }
  ClientStats Stats() const override {
    return ClientStats{rpcs_.load(), retries_.load(), failures_.load()};
  }

 private:
  std::vector<bool> All() const { return std::vector<bool>(shard_count(), true); }

  // Sends requests[i] to every shard i with active[i], in parallel, each
  // attempt with its own deadline; retries UNAVAILABLE ones with backoff
  // while the retry budget lasts. `issue(driver, shard, context, request,
  // response, done)` starts one asynchronous call on `driver` (StartUnary,
  // or a stream's Send); if it returns a canceller (calls on a stream, whose
  // deadline gRPC does not enforce per message), that is run for calls
  // still open at the deadline. The calling thread drives the calls: their
  // completions run on it (`driver`, or one of its own when null). Every
  // attempt goes to the metrics (if any) and, when `calls` is given, is
  // appended to it.
  template <typename Req, typename Resp, typename IssueFn>
  absl::Status CallShards(absl::string_view method, absl::Span<const Req> requests,
                          const std::vector<bool>& active, std::vector<Resp>* responses,
                          absl::Duration timeout, IssueFn issue,
                          std::vector<ShardCall>* calls = nullptr, CallDriver* driver = nullptr);

  const ClientOptions options_;
  CallMetadata metadata_;
  std::vector<std::unique_ptr<v1::EmbeddingService::Stub>> embedding_;
  std::vector<std::unique_ptr<v1::AdminService::Stub>> admin_;
  // Open exchange streams, one per shard in each session, and per shard
  // whether it lacks ExchangeStream (an older server: Exchange then goes
  // unary).
  std::unique_ptr<ExchangeSessionPool> sessions_;
  std::unique_ptr<std::atomic<bool>[]> unary_only_;
  std::atomic<uint64_t> rpcs_{0}, retries_{0}, failures_{0};
};

template <typename Req, typename Resp, typename IssueFn>
absl::Status GrpcChannel::CallShards(absl::string_view method, absl::Span<const Req> requests,
                                     const std::vector<bool>& active, std::vector<Resp>* responses,
                                     absl::Duration timeout, IssueFn issue,
                                     std::vector<ShardCall>* calls, CallDriver* driver) {
  std::optional<CallDriver> own_driver;
  if (driver == nullptr) driver = &own_driver.emplace();
  const uint32_t n = static_cast<uint32_t>(requests.size());
  responses->resize(n);
  std::vector<uint32_t> pending;
  for (uint32_t i = 0; i < n; ++i) {
    if (active[i]) pending.push_back(i);
  }
  const absl::Time start = absl::Now();
  absl::Duration backoff = options_.initial_backoff;
  std::minstd_rand jitter(static_cast<uint32_t>(absl::ToUnixNanos(start)));
  int attempt = 0;
  while (!pending.empty()) {
    std::vector<grpc::Status> statuses(pending.size());
    std::vector<absl::Time> starts(pending.size()), ends(pending.size());
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(pending.size());
    std::vector<std::function<void()>> cancels(pending.size());
    size_t open = pending.size();
    const absl::Time deadline = absl::Now() + timeout;
    for (size_t j = 0; j < pending.size(); ++j) {
      const uint32_t shard = pending[j];
      contexts[j] = std::make_unique<grpc::ClientContext>();
      contexts[j]->set_deadline(absl::ToChronoTime(deadline));
      metadata_.AddTo(contexts[j].get());
      (*responses)[shard].Clear();
      ++rpcs_;
      if (attempt > 0) ++retries_;
      starts[j] = absl::Now();
      auto done = [&statuses, &ends, &open, j](grpc::Status s) {
        ends[j] = absl::Now();
        statuses[j] = std::move(s);
        --open;
      };
      using Issued = decltype(issue(driver, shard, contexts[j].get(), &requests[shard],
                                    &(*responses)[shard], std::move(done)));
      if constexpr (std::is_void_v<Issued>) {
        issue(driver, shard, contexts[j].get(), &requests[shard], &(*responses)[shard],
              std::move(done));
      } else {
        cancels[j] = issue(driver, shard, contexts[j].get(), &requests[shard], &(*responses)[shard],
                           std::move(done));
      }
    }
    const auto all_ended = [&open] { return open == 0; };
    if (!driver->Drive(deadline, all_ended)) {
      for (const auto& cancel : cancels) {
        if (cancel) cancel();
      }
    }
    driver->Drive(absl::InfiniteFuture(), all_ended);
    for (size_t j = 0; j < pending.size(); ++j) {
      const auto code = static_cast<absl::StatusCode>(statuses[j].error_code());
      if (options_.metrics != nullptr) {
        options_.metrics->RecordRpc(pending[j], method, code,
                                    absl::ToDoubleSeconds(ends[j] - starts[j]));
      }
      if (calls != nullptr) calls->push_back({pending[j], attempt, starts[j], ends[j], code});
    }
    std::vector<uint32_t> retry;
    for (size_t j = 0; j < pending.size(); ++j) {
      const grpc::Status& s = statuses[j];
      if (s.ok()) continue;
      const bool budget_left = absl::Now() - start + backoff <= options_.retry_budget;
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && budget_left) {
        retry.push_back(pending[j]);
        continue;
      }
      ++failures_;
      const absl::Status status = FromGrpc(s);
      return absl::Status(
          status.code(),
          absl::StrCat(ShardName(pending[j]), " ", method, ": ", status.message(),
                       s.error_code() == grpc::StatusCode::UNAVAILABLE
                           ? absl::StrCat(" (gave up after ", attempt + 1, " attempts in ",
                                          absl::FormatDuration(absl::Now() - start), ")")
                           : ""));
    }
    pending = std::move(retry);
    if (pending.empty()) break;
    // Full jitter around the backoff so that pipelines do not retry in step.
    const double f = 0.5 + 0.5 * std::uniform_real_distribution<double>(0, 1)(jitter);
    absl::SleepFor(backoff * f);
    backoff = std::min(backoff * 2, options_.max_backoff);
    ++attempt;
  }
  return absl::OkStatus();
}

absl::Status GrpcChannel::Open() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A restarted shard is found again within about max_backoff, not gRPC's
  // default of up to two minutes.
  const int max_backoff_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.max_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         MakeChannelCredentials(options_.tls, &args));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : options_.shards) {
    channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
    embedding_.push_back(v1::EmbeddingService::NewStub(channels.back()));
    admin_.push_back(v1::AdminService::NewStub(channels.back()));
  }
  sessions_ = std::make_unique<ExchangeSessionPool>(channels, options_.rpc_timeout, &metadata_);
  unary_only_ = std::make_unique<std::atomic<bool>[]>(options_.shards.size());
  return absl::OkStatus();
}

absl::Status GrpcChannel::Exchange(const ExchangeCall& call, std::vector<ExchangeAnswer>* answers,
                                   std::vector<ShardCall>* calls) {
  const auto requests = call.requests;
  // Shard i's request for its exchange stream, serialised once per attempt.
  auto bytes = [&](uint32_t shard) {
    return call.handed_over ? SerializeAliased(requests[shard]) : SerializeCopied(*requests[shard]);
  };
  const std::vector<bool> active = call.Active();
  auto unary = [exchange = Unary(embedding_, &v1::EmbeddingService::Stub::PrepareAsyncExchange)](
                   CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
                   const v1::ExchangeRequest* req, ExchangeAnswer* resp,
                   std::function<void(grpc::Status)> done) {
    exchange(driver, shard, ctx, req, internal::ExchangeAnswerFill::MutableMessage(*resp), std::move(done));
  };
  if (!options_.exchange_streams) {
    return CallShards(
        "Exchange", requests, active, answers, options_.rpc_timeout,
        [&](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
            const std::shared_ptr<const v1::ExchangeRequest>* req, ExchangeAnswer* resp,
            std::function<void(grpc::Status)> done) {
          unary(driver, shard, ctx, req->get(), resp, std::move(done));
        },
        calls);
  }
  // The session is this call's until every attempt has ended, so that a
  // canceller never reaches a stream another caller is using.
  std::unique_ptr<ExchangeSession> session = sessions_->Acquire();
  absl::Status status = CallShards(
      "Exchange", requests, active, answers, options_.rpc_timeout,
      [&](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
          const std::shared_ptr<const v1::ExchangeRequest>* req, ExchangeAnswer* resp,
          std::function<void(grpc::Status)> done) -> std::function<void()> {
        if (unary_only_[shard].load()) {
          unary(driver, shard, ctx, req->get(), resp, std::move(done));
          return nullptr;
        }
        ExchangeStream* stream = session->Stream(shard);
        stream->Send(
            bytes(shard), resp,
            [&unary, driver, shard, ctx, req = req->get(), resp, stream, this,
             done = std::move(done)](grpc::Status s) mutable {
              if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED && !stream->answered()) {
                unary_only_[shard] = true;  // a shard from before streams
                unary(driver, shard, ctx, req, resp, std::move(done));
                return;
              }
              done(std::move(s));
            });
        return [stream] { stream->CancelForDeadline(); };
      },
      calls, session->driver());
  sessions_->Release(std::move(session));
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardChannel>> NewGrpcChannel(const ClientOptions& options) {
  auto channel = std::make_unique<GrpcChannel>(options);
  EMBER_RETURN_IF_ERROR(channel->Open());
  return channel;
}

}  // namespace ember
