#include "server/embedding_service.h"

#include "server/grpc_status.h"

namespace ember {
namespace {

// A call whose deadline passed while it queued is not worth starting.
bool Expired(grpc::ServerContext* context) {
  return context->deadline() < std::chrono::system_clock::now();
}

}  // namespace

grpc::Status EmbeddingServiceImpl::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  if (Expired(context)) return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue"};
  return ToGrpcStatus(shard_->Lookup(*request, response));
}

grpc::Status EmbeddingServiceImpl::Push(grpc::ServerContext* context,
                                        const v1::PushRequest* request,
                                        v1::PushResponse* response) {
  if (Expired(context)) return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed in queue"};
  return ToGrpcStatus(shard_->Push(*request, response));
}

}  // namespace ember
