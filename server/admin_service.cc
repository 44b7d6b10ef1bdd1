#include "server/admin_service.h"

#include "spdlog/spdlog.h"
#include "server/edge_call.h"
#include "server/grpc_status.h"

// A refused call answers with the refusal (see shard/shard_edge.h).
#define EMBER_AUTHORIZE(context, role, rpc)                                       \
  if (absl::Status denied = edge_->Authorize(ReadEdgeCall(*(context), rpc), role); \
      !denied.ok()) {                                                             \
    return ToGrpcStatus(denied);                                                  \
  }

namespace ember {

grpc::Status AdminServiceImpl::CreateTable(grpc::ServerContext* context,
                                           const v1::CreateTableRequest* request,
                                           v1::CreateTableResponse* response) {
  EMBER_AUTHORIZE(context, Role::kAdmin, "CreateTable");
  absl::Status s = edge_->shard().CreateTable(request->config(), response);
  if (s.ok() && response->created()) {
    spdlog::info("created table '{}' dim {}", request->config().name(), request->config().dim());
  }
  return ToGrpcStatus(s);
}

grpc::Status AdminServiceImpl::ListTables(grpc::ServerContext* context,
                                          const v1::ListTablesRequest*,
                                          v1::ListTablesResponse* response) {
  EMBER_AUTHORIZE(context, Role::kReader, "ListTables");
  edge_->shard().ListTables(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::DropTable(grpc::ServerContext* context,
                                         const v1::DropTableRequest* request,
                                         v1::DropTableResponse*) {
  EMBER_AUTHORIZE(context, Role::kAdmin, "DropTable");
  absl::Status s = edge_->shard().DropTable(request->name());
  if (s.ok()) spdlog::info("dropped table '{}'", request->name());
  return ToGrpcStatus(s);
}

grpc::Status AdminServiceImpl::GetShardInfo(grpc::ServerContext* context,
                                            const v1::GetShardInfoRequest*,
                                            v1::GetShardInfoResponse* response) {
  EMBER_AUTHORIZE(context, Role::kReader, "GetShardInfo");
  edge_->shard().GetShardInfo(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Checkpoint(grpc::ServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointResponse* response) {
  EMBER_AUTHORIZE(context, Role::kAdmin, "Checkpoint");
  // The call's deadline bounds the wait for the cut; without one, a minute.
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::Now() + absl::Seconds(60)
                                  : absl::FromChrono(context->deadline());
  return ToGrpcStatus(checkpointer_->Checkpoint(*request, deadline, response));
}

grpc::Status AdminServiceImpl::ListCheckpoints(grpc::ServerContext* context,
                                               const v1::ListCheckpointsRequest*,
                                               v1::ListCheckpointsResponse* response) {
  EMBER_AUTHORIZE(context, Role::kTrainer, "ListCheckpoints");
  checkpointer_->List(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::CommitMove(grpc::ServerContext* context,
                                          const v1::CommitMoveRequest* request,
                                          v1::CommitMoveResponse* response) {
  EMBER_AUTHORIZE(context, Role::kAdmin, "CommitMove");
  return ToGrpcStatus(checkpointer_->CommitMove(*request, response));
}

grpc::Status AdminServiceImpl::AbortMove(grpc::ServerContext* context, const v1::AbortMoveRequest*,
                                         v1::AbortMoveResponse* response) {
  EMBER_AUTHORIZE(context, Role::kAdmin, "AbortMove");
  response->set_was_holding(edge_->shard().ReleaseMoveHold());
  if (response->was_holding()) spdlog::info("move aborted: the held pushes go on");
  return grpc::Status::OK;
}

}  // namespace ember
