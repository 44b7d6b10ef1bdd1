#include "server/admin_service.h"

#include "spdlog/spdlog.h"
#include "server/grpc_status.h"

namespace ember {

grpc::Status AdminServiceImpl::CreateTable(grpc::ServerContext*,
                                           const v1::CreateTableRequest* request,
                                           v1::CreateTableResponse* response) {
  absl::Status s = shard_->CreateTable(request->config(), response);
  if (s.ok() && response->created()) {
    spdlog::info("created table '{}' dim {}", request->config().name(), request->config().dim());
  }
  return ToGrpcStatus(s);
}

grpc::Status AdminServiceImpl::ListTables(grpc::ServerContext*, const v1::ListTablesRequest*,
                                          v1::ListTablesResponse* response) {
  shard_->ListTables(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::DropTable(grpc::ServerContext*, const v1::DropTableRequest* request,
                                         v1::DropTableResponse*) {
  absl::Status s = shard_->DropTable(request->name());
  if (s.ok()) spdlog::info("dropped table '{}'", request->name());
  return ToGrpcStatus(s);
}

grpc::Status AdminServiceImpl::GetShardInfo(grpc::ServerContext*, const v1::GetShardInfoRequest*,
                                            v1::GetShardInfoResponse* response) {
  shard_->GetShardInfo(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Checkpoint(grpc::ServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointResponse* response) {
  // The call's deadline bounds the wait for the cut; without one, a minute.
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::Now() + absl::Seconds(60)
                                  : absl::FromChrono(context->deadline());
  return ToGrpcStatus(checkpointer_->Checkpoint(*request, deadline, response));
}

grpc::Status AdminServiceImpl::ListCheckpoints(grpc::ServerContext*,
                                               const v1::ListCheckpointsRequest*,
                                               v1::ListCheckpointsResponse* response) {
  checkpointer_->List(response);
  return grpc::Status::OK;
}

}  // namespace ember
