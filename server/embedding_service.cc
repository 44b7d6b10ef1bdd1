#include "server/embedding_service.h"

#include "absl/time/time.h"
#include "server/grpc_status.h"

namespace ember {
namespace {

// A call whose deadline passed while it queued is not worth starting.
bool Expired(const grpc::ServerContextBase* context) {
  return context->deadline() < std::chrono::system_clock::now();
}
const grpc::Status kExpired(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue");

// The call's deadline, which also bounds a lookup's consistency wait.
absl::Time Deadline(const grpc::ServerContextBase* context) {
  return context->deadline() == std::chrono::system_clock::time_point::max()
             ? absl::InfiniteFuture()
             : absl::FromChrono(context->deadline());
}

// Runs `call`, then counts it per method and status code with its latency.
template <typename Call>
grpc::Status MeasuredCall(ShardMetrics* metrics, ShardMetrics::Rpc rpc, Call call) {
  if (metrics == nullptr) return ToGrpcStatus(call());
  const absl::Time start = absl::Now();
  const absl::Status status = call();
  metrics->RecordCall(rpc, status.code(), absl::ToDoubleSeconds(absl::Now() - start));
  return ToGrpcStatus(status);
}

}  // namespace

template <typename Call>
grpc::Status EmbeddingServiceImpl::Measured(ShardMetrics::Rpc rpc, Call call) {
  return MeasuredCall(metrics_, rpc, std::move(call));
}

grpc::Status EmbeddingServiceImpl::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  if (Expired(context)) return kExpired;
  return Measured(ShardMetrics::Rpc::kLookup, [&] { return shard_->Lookup(*request, response, Deadline(context)); });
}

grpc::Status EmbeddingServiceImpl::Push(grpc::ServerContext* context,
                                        const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  if (Expired(context)) return kExpired;
  return Measured(ShardMetrics::Rpc::kPush, [&] { return shard_->Push(*request, response); });
}

grpc::Status EmbeddingServiceImpl::Exchange(grpc::ServerContext* context,
                                            const v1::ExchangeRequest* request,
                                            v1::ExchangeResponse* response) {
  if (Expired(context)) return kExpired;
  return Measured(ShardMetrics::Rpc::kExchange,
                  [&] { return shard_->Exchange(*request, response, Deadline(context)); });
}

grpc::Status EmbeddingServiceImpl::RegisterWorker(grpc::ServerContext*,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  return ToGrpcStatus(shard_->RegisterWorker(*request, response));
}

grpc::Status EmbeddingServiceImpl::UnregisterWorker(grpc::ServerContext*,
                                                    const v1::UnregisterWorkerRequest* request,
                                                    v1::UnregisterWorkerResponse* response) {
  shard_->UnregisterWorker(*request, response);
  return grpc::Status::OK;
}

// ---- The callback API.

template <typename Work>
void EmbeddingCallbackService::RunLookup(bool may_wait, Work work) {
  if (may_wait || all_lookups_on_pool_) {
    pool_.Post(std::move(work));
  } else {
    work();
  }
}

grpc::ServerUnaryReactor* EmbeddingCallbackService::Lookup(grpc::CallbackServerContext* context,
                                                           const v1::LookupRequest* request,
                                                           v1::LookupResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (Expired(context)) {
    reactor->Finish(kExpired);
    return reactor;
  }
  RunLookup(shard_->MayWait(*request), [this, reactor, context, request, response] {
    reactor->Finish(MeasuredCall(metrics_, ShardMetrics::Rpc::kLookup, [&] {
      return shard_->Lookup(*request, response, Deadline(context));
    }));
  });
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingCallbackService::Push(grpc::CallbackServerContext* context,
                                                         const v1::PushRequest* request,
                                                         v1::PushResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(Expired(context) ? kExpired
                                   : MeasuredCall(metrics_, ShardMetrics::Rpc::kPush, [&] {
                                       return shard_->Push(*request, response);
                                     }));
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingCallbackService::Exchange(grpc::CallbackServerContext* context,
                                                             const v1::ExchangeRequest* request,
                                                             v1::ExchangeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (Expired(context)) {
    reactor->Finish(kExpired);
    return reactor;
  }
  // The push here and now (it never waits, and a waiting lookup elsewhere
  // may need it); the lookup after it, inline or on the pool.
  const absl::Time start = absl::Now();
  const absl::Status pushed = shard_->ExchangePush(*request, response);
  // The call's latency counts from `start`, push included, wherever it ends.
  auto finish = [this, reactor, start](const absl::Status& status) {
    if (metrics_ != nullptr) {
      metrics_->RecordCall(ShardMetrics::Rpc::kExchange, status.code(),
                           absl::ToDoubleSeconds(absl::Now() - start));
    }
    reactor->Finish(ToGrpcStatus(status));
  };
  if (!pushed.ok() || !request->has_lookup()) {
    finish(pushed);
    return reactor;
  }
  RunLookup(shard_->MayWait(request->lookup()), [this, context, request, response, finish] {
    finish(shard_->ExchangeLookup(*request, response, Deadline(context)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingCallbackService::RegisterWorker(
    grpc::CallbackServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(shard_->RegisterWorker(*request, response)));
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingCallbackService::UnregisterWorker(
    grpc::CallbackServerContext* context, const v1::UnregisterWorkerRequest* request,
    v1::UnregisterWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  shard_->UnregisterWorker(*request, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ember
