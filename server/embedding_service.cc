#include "server/embedding_service.h"

#include "absl/time/time.h"
#include "server/grpc_status.h"

namespace ember {
namespace {

// A call whose deadline passed while it queued is not worth starting.
bool Expired(grpc::ServerContext* context) {
  return context->deadline() < std::chrono::system_clock::now();
}

// The call's deadline, which also bounds a lookup's consistency wait.
absl::Time Deadline(grpc::ServerContext* context) {
  return context->deadline() == std::chrono::system_clock::time_point::max()
             ? absl::InfiniteFuture()
             : absl::FromChrono(context->deadline());
}

}  // namespace

template <typename Call>
grpc::Status EmbeddingServiceImpl::Measured(ShardMetrics::Rpc rpc, Call call) {
  if (metrics_ == nullptr) return ToGrpcStatus(call());
  const absl::Time start = absl::Now();
  const absl::Status status = call();
  metrics_->RecordCall(rpc, status.code(), absl::ToDoubleSeconds(absl::Now() - start));
  return ToGrpcStatus(status);
}

grpc::Status EmbeddingServiceImpl::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  if (Expired(context)) return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue"};
  return Measured(ShardMetrics::Rpc::kLookup, [&] { return shard_->Lookup(*request, response, Deadline(context)); });
}

grpc::Status EmbeddingServiceImpl::Push(grpc::ServerContext* context,
                                        const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  if (Expired(context)) return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue"};
  return Measured(ShardMetrics::Rpc::kPush, [&] { return shard_->Push(*request, response); });
}

grpc::Status EmbeddingServiceImpl::Exchange(grpc::ServerContext* context,
                                            const v1::ExchangeRequest* request,
                                            v1::ExchangeResponse* response) {
  if (Expired(context)) return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue"};
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

}  // namespace ember
