#include "ember/client.h"

#include <atomic>
#include <optional>
#include <random>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/call_driver.h"
#include "client/exchange_stream.h"
#include "client/request_plan.h"
#include "common/aliased_serialize.h"
#include "common/key_hash.h"
#include "common/status_macros.h"
#include "ember/v1/admin_service.grpc.pb.h"
#include "ember/trainer_metrics.h"
#include "ember/v1/embedding_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ember {

absl::Status ClientOptions::Validate() const {
  if (shards.empty()) return absl::InvalidArgumentError("shards: expected >= 1 address, received 0");
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].empty() || shards[i].find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shards[", i, "]: expected host:port, received '", shards[i], "'"));
    }
  }
  const std::pair<const char*, absl::Duration> positive[] = {{"rpc_timeout", rpc_timeout},
                                                            {"connect_timeout", connect_timeout},
                                                            {"initial_backoff", initial_backoff},
                                                            {"max_backoff", max_backoff}};
  for (const auto& [name, d] : positive) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected > 0, received ", absl::FormatDuration(d)));
    }
  }
  EMBER_RETURN_IF_ERROR(tls.Validate());
  if (retry_budget < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("retry_budget: expected >= 0, received ",
                                                   absl::FormatDuration(retry_budget)));
  }
  return absl::OkStatus();
}

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  std::vector<std::unique_ptr<v1::EmbeddingService::Stub>> embedding;
  std::vector<std::unique_ptr<v1::AdminService::Stub>> admin;
  // Open exchange streams, one per shard in each session, and per shard
  // whether it lacks ExchangeStream (an older server: Exchange then goes
  // unary).
  std::unique_ptr<ExchangeSessionPool> sessions;
  std::unique_ptr<std::atomic<bool>[]> unary_only;
  std::atomic<uint64_t> rpcs{0}, retries{0}, failures{0};

  void AddAuth(grpc::ClientContext* context) const {
    if (!options.auth_token.empty()) {
      context->AddMetadata("authorization", "Bearer " + options.auth_token);
    }
  }

  std::string ShardName(uint32_t shard) const {
    return absl::StrCat("shard ", shard, " (", options.shards[shard], ")");
  }

  absl::Status ShardInfos(absl::Duration timeout, bool wait_for_ready,
                          std::vector<v1::GetShardInfoResponse>* infos);

  template <typename Bytes>
  absl::Status Exchange(absl::Span<const v1::ExchangeRequest* const> requests, Bytes bytes,
                        std::vector<ExchangeAnswer>* answers, std::vector<ShardCall>* calls);
  // The same, the answers' rows copied into `responses`.
  template <typename Bytes>
  absl::Status Exchange(absl::Span<const v1::ExchangeRequest* const> requests, Bytes bytes,
                        std::vector<v1::ExchangeResponse>* responses,
                        std::vector<ShardCall>* calls) {
    std::vector<ExchangeAnswer> answers;
    absl::Status status = Exchange(requests, std::move(bytes), &answers, calls);
    responses->resize(answers.size());
    for (size_t i = 0; i < answers.size(); ++i) (*responses)[i] = answers[i].TakeMessage();
    return status;
  }

  // CallShards' `issue` for the unary method `prepare` of `stubs`' service,
  // e.g. Unary(admin, &v1::AdminService::Stub::PrepareAsyncListTables).
  template <typename Stub, typename Req, typename Resp>
  static auto Unary(const std::vector<std::unique_ptr<Stub>>& stubs,
                    std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (Stub::*prepare)(
                        grpc::ClientContext*, const Req&, grpc::CompletionQueue*)) {
    return [&stubs, prepare](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
                             const Req* req, Resp* resp, std::function<void(grpc::Status)> done) {
      StartUnary(driver, (stubs[shard].get()->*prepare)(ctx, *req, driver->cq()), resp,
                 std::move(done));
    };
  }

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
                          std::vector<ShardCall>* calls = nullptr,
                          CallDriver* driver = nullptr) {
    std::optional<CallDriver> own_driver;
    if (driver == nullptr) driver = &own_driver.emplace();
    const uint32_t n = static_cast<uint32_t>(requests.size());
    responses->resize(n);
    std::vector<uint32_t> pending;
    for (uint32_t i = 0; i < n; ++i) {
      if (active[i]) pending.push_back(i);
    }
    const absl::Time start = absl::Now();
    absl::Duration backoff = options.initial_backoff;
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
        AddAuth(contexts[j].get());
        (*responses)[shard].Clear();
        ++rpcs;
        if (attempt > 0) ++retries;
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
          cancels[j] = issue(driver, shard, contexts[j].get(), &requests[shard],
                             &(*responses)[shard], std::move(done));
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
        if (options.metrics != nullptr) {
          options.metrics->RecordRpc(pending[j], method, code,
                                     absl::ToDoubleSeconds(ends[j] - starts[j]));
        }
        if (calls != nullptr) calls->push_back({pending[j], attempt, starts[j], ends[j], code});
      }
      std::vector<uint32_t> retry;
      for (size_t j = 0; j < pending.size(); ++j) {
        const grpc::Status& s = statuses[j];
        if (s.ok()) continue;
        const bool budget_left = absl::Now() - start + backoff <= options.retry_budget;
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE && budget_left) {
          retry.push_back(pending[j]);
          continue;
        }
        ++failures;
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
      backoff = std::min(backoff * 2, options.max_backoff);
      ++attempt;
    }
    return absl::OkStatus();
  }

  std::vector<bool> All() const { return std::vector<bool>(embedding.size(), true); }

  // ListTables on the shards marked in `active`.
  absl::Status ListTables(const std::vector<bool>& active,
                          std::vector<v1::ListTablesResponse>* responses) {
    std::vector<v1::ListTablesRequest> requests(admin.size());
    return CallShards(
        "ListTables", absl::MakeConstSpan(requests), active, responses, options.rpc_timeout,
        Unary(admin, &v1::AdminService::Stub::PrepareAsyncListTables));
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::Status Client::Impl::ShardInfos(absl::Duration timeout, bool wait_for_ready,
                                      std::vector<v1::GetShardInfoResponse>* infos) {
  std::vector<v1::GetShardInfoRequest> requests(options.shards.size());
  return CallShards(
      "GetShardInfo", absl::MakeConstSpan(requests), All(), infos, timeout,
      [&, get = Unary(admin, &v1::AdminService::Stub::PrepareAsyncGetShardInfo)](
          CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
          const v1::GetShardInfoRequest* req, v1::GetShardInfoResponse* resp,
          std::function<void(grpc::Status)> done) {
        ctx->set_wait_for_ready(wait_for_ready);
        get(driver, shard, ctx, req, resp, std::move(done));
      });
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  EMBER_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A restarted shard is found again within about max_backoff, not gRPC's
  // default of up to two minutes.
  const int max_backoff_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         MakeChannelCredentials(options.tls, &args));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : options.shards) {
    channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
    impl->embedding.push_back(v1::EmbeddingService::NewStub(channels.back()));
    impl->admin.push_back(v1::AdminService::NewStub(channels.back()));
  }
  impl->sessions =
      std::make_unique<ExchangeSessionPool>(channels, options.rpc_timeout, options.auth_token);
  impl->unary_only = std::make_unique<std::atomic<bool>[]>(options.shards.size());
  std::vector<v1::GetShardInfoResponse> infos;
  // wait_for_ready: a shard may still be starting. A refused TLS handshake
  // looks the same from here as a shard that is not up yet.
  if (absl::Status s = impl->ShardInfos(options.connect_timeout, /*wait_for_ready=*/true, &infos);
      !s.ok()) {
    if (!absl::IsDeadlineExceeded(s)) return s;
    return absl::DeadlineExceededError(absl::StrCat(
        s.message(), " (no connection within connect_timeout ",
        absl::FormatDuration(options.connect_timeout), ": is the shard up, and do its TLS "
        "settings match the client's: TLS ", options.tls.enabled ? "on" : "off",
        options.tls.cert_file.empty() ? ", no client certificate" : ", a client certificate",
        "?)"));
  }
  const uint32_t n = static_cast<uint32_t>(options.shards.size());
  for (uint32_t i = 0; i < n; ++i) {
    const v1::GetShardInfoResponse& info = infos[i];
    if (info.shard_index() != i || info.shard_count() != n) {
      return absl::FailedPreconditionError(absl::StrCat(
          impl->ShardName(i), ": expected shard ", i, " of ", n, ", received shard ",
          info.shard_index(), " of ", info.shard_count(),
          " (list the shard addresses in shard-index order)"));
    }
    if (info.routing() != kRoutingName) {
      return absl::FailedPreconditionError(absl::StrCat(impl->ShardName(i), ": expected routing '",
                                                        kRoutingName, "', received '",
                                                        info.routing(), "'"));
    }
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

uint32_t Client::shard_count() const { return static_cast<uint32_t>(impl_->embedding.size()); }
const ClientOptions& Client::options() const { return impl_->options; }
uint32_t Client::ShardOf(uint64_t key) const { return ember::ShardOf(key, shard_count()); }
std::string Client::ShardName(uint32_t shard) const { return impl_->ShardName(shard); }

absl::Status Client::CreateTable(const v1::TableConfig& config) {
  std::vector<v1::CreateTableRequest> requests(shard_count());
  for (auto& r : requests) *r.mutable_config() = config;
  std::vector<v1::CreateTableResponse> responses;
  return impl_->CallShards(
      "CreateTable", absl::MakeConstSpan(requests), impl_->All(), &responses,
      impl_->options.rpc_timeout,
      impl_->Unary(impl_->admin, &v1::AdminService::Stub::PrepareAsyncCreateTable));
}

absl::StatusOr<std::vector<v1::TableInfo>> Client::ListTables() {
  std::vector<bool> only_first(shard_count(), false);
  only_first[0] = true;
  std::vector<v1::ListTablesResponse> responses;
  EMBER_RETURN_IF_ERROR(impl_->ListTables(only_first, &responses));
  return std::vector<v1::TableInfo>(responses[0].tables().begin(), responses[0].tables().end());
}

absl::StatusOr<uint64_t> Client::StoredRows(const std::string& table) {
  std::vector<v1::ListTablesResponse> responses;
  EMBER_RETURN_IF_ERROR(impl_->ListTables(impl_->All(), &responses));
  uint64_t rows = 0;
  for (uint32_t s = 0; s < shard_count(); ++s) {
    bool found = false;
    for (const v1::TableInfo& t : responses[s].tables()) {
      if (t.config().name() == table) {
        rows += t.rows();
        found = true;
      }
    }
    if (!found) {
      return absl::NotFoundError(absl::StrCat("table '", table, "' not found on ", ShardName(s)));
    }
  }
  return rows;
}

absl::Status Client::Lookup(absl::Span<const v1::LookupRequest> requests,
                            std::vector<v1::LookupResponse>* responses) {
  if (requests.size() != shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("Lookup: expected ", shard_count(),
                                                   " requests (one per shard), received ",
                                                   requests.size()));
  }
  std::vector<bool> active(shard_count());
  for (uint32_t i = 0; i < shard_count(); ++i) {
    active[i] = requests[i].tables_size() > 0 || requests[i].has_step();
  }
  return impl_->CallShards(
      "Lookup", requests, active, responses, impl_->options.rpc_timeout,
      impl_->Unary(impl_->embedding, &v1::EmbeddingService::Stub::PrepareAsyncLookup));
}

absl::Status Client::Push(absl::Span<const v1::PushRequest> requests,
                          std::vector<v1::PushResponse>* responses) {
  if (requests.size() != shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("Push: expected ", shard_count(),
                                                   " requests (one per shard), received ",
                                                   requests.size()));
  }
  return impl_->CallShards(
      "Push", requests, impl_->All(), responses, impl_->options.rpc_timeout,
      impl_->Unary(impl_->embedding, &v1::EmbeddingService::Stub::PrepareAsyncPush));
}

// Both Exchange overloads: requests[i] to shard i; `bytes(i)` serialises
// shard i's request for its exchange stream (once per attempt).
template <typename Bytes>
absl::Status Client::Impl::Exchange(absl::Span<const v1::ExchangeRequest* const> requests,
                                    Bytes bytes, std::vector<ExchangeAnswer>* responses,
                                    std::vector<ShardCall>* calls) {
  const uint32_t shards = static_cast<uint32_t>(embedding.size());
  if (requests.size() != shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Exchange: expected ", shards, " requests (one per shard), received ", requests.size()));
  }
  std::vector<bool> active(shards);
  for (uint32_t i = 0; i < shards; ++i) {
    active[i] = requests[i]->has_push() || requests[i]->has_lookup() || requests[i]->has_peek();
  }
  auto unary = [exchange = Unary(embedding, &v1::EmbeddingService::Stub::PrepareAsyncExchange)](
                   CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
                   const v1::ExchangeRequest* req, ExchangeAnswer* resp,
                   std::function<void(grpc::Status)> done) {
    exchange(driver, shard, ctx, req, resp->mutable_message(), std::move(done));
  };
  if (!options.exchange_streams) {
    return CallShards(
        "Exchange", requests, active, responses, options.rpc_timeout,
        [&](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
            const v1::ExchangeRequest* const* req, ExchangeAnswer* resp,
            std::function<void(grpc::Status)> done) {
          unary(driver, shard, ctx, *req, resp, std::move(done));
        },
        calls);
  }
  // The session is this call's until every attempt has ended, so that a
  // canceller never reaches a stream another caller is using.
  std::unique_ptr<ExchangeSession> session = sessions->Acquire();
  absl::Status status = CallShards(
      "Exchange", requests, active, responses, options.rpc_timeout,
      [&](CallDriver* driver, uint32_t shard, grpc::ClientContext* ctx,
          const v1::ExchangeRequest* const* req, ExchangeAnswer* resp,
          std::function<void(grpc::Status)> done) -> std::function<void()> {
        if (unary_only[shard].load()) {
          unary(driver, shard, ctx, *req, resp, std::move(done));
          return nullptr;
        }
        ExchangeStream* stream = session->Stream(shard);
        stream->Send(bytes(shard), resp,
                     [&unary, driver, shard, ctx, req = *req, resp, stream, this,
                      done = std::move(done)](grpc::Status s) mutable {
                       if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED && !stream->answered()) {
                         unary_only[shard] = true;  // a shard from before streams
                         unary(driver, shard, ctx, req, resp, std::move(done));
                         return;
                       }
                       done(std::move(s));
                     });
        return [stream] { stream->CancelForDeadline(); };
      },
      calls, session->driver());
  sessions->Release(std::move(session));
  return status;
}

absl::Status Client::Exchange(absl::Span<const v1::ExchangeRequest> requests,
                              std::vector<v1::ExchangeResponse>* responses,
                              std::vector<ShardCall>* calls) {
  std::vector<const v1::ExchangeRequest*> views(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) views[i] = &requests[i];
  return impl_->Exchange(
      views, [&](uint32_t shard) { return SerializeCopied(requests[shard]); }, responses, calls);
}

// Both overloads taking requests handed over.
template <typename Responses>
absl::Status Client::ExchangeHandedOver(
    std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests, Responses* responses,
    std::vector<ShardCall>* calls) {
  std::vector<const v1::ExchangeRequest*> views(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange: request ", i, " is null"));
    }
    views[i] = requests[i].get();
  }
  return impl_->Exchange(
      views, [&](uint32_t shard) { return SerializeAliased(requests[shard]); }, responses, calls);
}

absl::Status Client::Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                              std::vector<v1::ExchangeResponse>* responses,
                              std::vector<ShardCall>* calls) {
  return ExchangeHandedOver(std::move(requests), responses, calls);
}

absl::Status Client::Exchange(std::vector<std::shared_ptr<const v1::ExchangeRequest>> requests,
                              std::vector<ExchangeAnswer>* answers,
                              std::vector<ShardCall>* calls) {
  return ExchangeHandedOver(std::move(requests), answers, calls);
}

absl::Status Client::RegisterWorker(uint32_t worker_id, int64_t first_step) {
  std::vector<v1::RegisterWorkerRequest> requests(shard_count());
  for (auto& r : requests) {
    r.set_worker_id(worker_id);
    r.set_first_step(first_step);
  }
  std::vector<v1::RegisterWorkerResponse> responses;
  return impl_->CallShards(
      "RegisterWorker", absl::MakeConstSpan(requests), impl_->All(), &responses,
      impl_->options.rpc_timeout,
      impl_->Unary(impl_->embedding, &v1::EmbeddingService::Stub::PrepareAsyncRegisterWorker));
}

absl::Status Client::UnregisterWorker(uint32_t worker_id) {
  std::vector<v1::UnregisterWorkerRequest> requests(shard_count());
  for (auto& r : requests) r.set_worker_id(worker_id);
  std::vector<v1::UnregisterWorkerResponse> responses;
  return impl_->CallShards(
      "UnregisterWorker", absl::MakeConstSpan(requests), impl_->All(), &responses,
      impl_->options.rpc_timeout,
      impl_->Unary(impl_->embedding, &v1::EmbeddingService::Stub::PrepareAsyncUnregisterWorker));
}

absl::StatusOr<std::vector<v1::GetShardInfoResponse>> Client::ShardInfos() {
  std::vector<v1::GetShardInfoResponse> infos;
  EMBER_RETURN_IF_ERROR(impl_->ShardInfos(impl_->options.rpc_timeout, false, &infos));
  return infos;
}

absl::StatusOr<ClusterCheckpoint> Client::Checkpoint(const CheckpointOptions& options) {
  constexpr int kTries = 3;
  for (int attempt = 0;; ++attempt) {
    int64_t step = -1;
    if (options.step.has_value()) {
      step = *options.step;
    } else {
      EMBER_ASSIGN_OR_RETURN(std::vector<v1::GetShardInfoResponse> infos, ShardInfos());
      for (const auto& info : infos) {
        for (const auto& w : info.workers()) step = std::max(step, w.applied_step());
      }
      if (attempt > 0) step += 2;  // workers moved on: cut a little ahead of them
    }
    ClusterCheckpoint out;
    out.step = step;
    out.id = options.id.empty()
                 ? absl::StrCat("cluster-", step, "-", absl::ToUnixMillis(absl::Now()))
                 : options.id;
    std::vector<v1::CheckpointRequest> requests(shard_count());
    for (auto& r : requests) {
      r.set_id(out.id);
      // No worker anywhere (-1): each shard cuts at what it has applied.
      if (step >= 0) r.set_step(step);
      r.set_incremental(options.incremental);
    }
    absl::Status s = impl_->CallShards(
        "Checkpoint", absl::MakeConstSpan(requests), impl_->All(), &out.shards, options.timeout,
        impl_->Unary(impl_->admin, &v1::AdminService::Stub::PrepareAsyncCheckpoint));
    const bool passed = absl::IsFailedPrecondition(s) &&
                        absl::StrContains(s.message(), "has already pushed step");
    if (s.ok() || !passed || options.step.has_value() || attempt + 1 == kTries) {
      if (!s.ok()) return s;
      return out;
    }
  }
}

absl::StatusOr<std::vector<float>> Client::LookupRows(const std::string& table,
                                                      absl::Span<const uint64_t> keys,
                                                      bool read_only) {
  const uint32_t n = shard_count();
  const std::vector<std::string> tables = {table};
  // The dim is the shards' answer; the plan reads it when it scatters.
  std::vector<uint32_t> dims = {0};
  const std::vector<std::vector<uint64_t>> table_keys = {{keys.begin(), keys.end()}};
  RequestPlan plan;
  plan.Route(*this, tables, dims, table_keys);
  std::vector<v1::LookupRequest> requests(n);
  for (uint32_t s = 0; s < n; ++s) {
    if (plan.HasKeys(s)) plan.FillLookup(s, read_only, &requests[s]);
  }
  std::vector<v1::LookupResponse> responses;
  EMBER_RETURN_IF_ERROR(Lookup(requests, &responses));
  std::vector<float> rows;
  uint64_t received = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (!plan.HasKeys(s)) continue;
    if (responses[s].tables_size() > 0 && dims[0] == 0) {
      dims[0] = responses[s].tables(0).dim();
      rows.resize(keys.size() * dims[0]);
    }
    EMBER_RETURN_IF_ERROR(plan.ScatterRows(s, responses[s], {rows.data()}, &received));
  }
  return rows;
}

ClientStats Client::Stats() const {
  return ClientStats{impl_->rpcs.load(), impl_->retries.load(), impl_->failures.load()};
}

}  // namespace ember
